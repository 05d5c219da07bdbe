"""The explorer (docs §19): one offline, interactive HTML page per study that links the
head-effect grid to the selected head's leakage, clamp decomposition, edges and geometry,
with the block ablation atlas (Zero / Average) and the training timeline, every view naming
the Parquet and SHA-256 it was drawn from.

``data`` reads the Parquets, ``views`` holds the Vega-Lite charts, ``page`` writes the file
(with ``explorer.js``, the page's state and links, and ``page.html``, its layout).
"""
