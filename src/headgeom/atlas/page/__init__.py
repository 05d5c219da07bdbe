"""The atlas page: one offline, interactive HTML file per model (the explorer's atlas page)
that links the per-layer profile to the selected layer's edits, with the edit switch, the
per-corpus heat map, the compression table and, for two checkpoints, the blend dial, grafts,
drift and low-rank views, every view naming the Parquet and SHA-256 it was drawn from.

``data`` reads the Parquets (the contract: :mod:`headgeom.atlas.results`), ``views`` holds
the Vega-Lite charts, ``page`` writes the file (with ``atlas.js``, the page's state and links, and
``atlas.html``, its layout; what it shares with the explorer is :mod:`headgeom.webpage`).
"""
