"""Every file the edit atlas workflow reads or writes, once, relative to the study's results
directory ``results/<study>/`` (wildcard {shard}: one job of the sweep). The workflow's
``PATHS`` prefixes these; the docs read the same table."""

from __future__ import annotations

TEMPLATES = {
    # the inputs: corpora cut into windows with the model's tokenizer, the skills' items
    "windows": "atlas/inputs/windows.parquet",
    "probes": "atlas/inputs/probes.parquet",
    # the per-layer profile
    "profile": "atlas/profile.parquet",
    # the sweep of edits, one job per shard (the edits dealt round-robin), then merged
    "effects_shard": "atlas/shards/effects_{shard}.parquet",
    "retention_shard": "atlas/shards/retention_{shard}.parquet",
    "effects": "atlas/effects.parquet",
    "retention": "atlas/retention.parquet",
    "summary": "atlas/summary.parquet",
    "report": "atlas/atlas.md",
    # the compression view: compressed variants scored as the sweep's edits, and its report
    "compression": "atlas/compression.parquet",
    "compression_report": "atlas/compression.md",
    # the atlas page: one offline HTML file of the tables above
    "page": "atlas/atlas.html",
}
