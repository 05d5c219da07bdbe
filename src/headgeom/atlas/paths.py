"""Every file the edit atlas workflow reads or writes, once, relative to the study's results
directory ``results/<study>/`` (wildcard {shard}: one job of the sweep; {pair}: one pair of
checkpoints, config ``pairs``). The workflow's ``PATHS`` prefixes these; the docs read the same
table."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

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
    # two checkpoints of one lineage (config pairs): their inputs cut with A's tokenizer (where
    # A is not the study's model, whose windows and probes they share otherwise), B
    # fine-tuned from A where the pair asks for it (a checkpoint run folder), the views
    "pair_windows": "atlas/pairs/{pair}/inputs/windows.parquet",
    "pair_items": "atlas/pairs/{pair}/inputs/probes.parquet",
    "pair_tuned": "atlas/pairs/{pair}/tuned/model.safetensors",
    "pair_tuned_manifest": "atlas/pairs/{pair}/tuned/manifest.json",
    "pair_blend": "atlas/pairs/{pair}/blend.parquet",
    "pair_probes": "atlas/pairs/{pair}/probes.parquet",
    "pair_grafts": "atlas/pairs/{pair}/grafts.parquet",
    "pair_drift": "atlas/pairs/{pair}/drift.parquet",
    "pair_lowrank": "atlas/pairs/{pair}/lowrank.parquet",
    "pair_report": "atlas/pairs/{pair}/pair.md",
    # the atlas page: one offline HTML file of the tables above
    "page": "atlas/atlas.html",
}

#: A training run's final checkpoint and its manifest (headgeom.paths: models/<m>/s<seed>/).
_FINAL = ("model.safetensors", "manifest.json")


def checkpoint_files(path: str | PathLike) -> tuple[Path, Path]:
    """(checkpoint file, its manifest) of one of our checkpoints named by ``path``: a run
    folder (``model.safetensors``, ``manifest.json``), or a ``.safetensors`` file
    (``model.safetensors`` → ``manifest.json`` beside it, any other ``X.safetensors`` →
    ``X.manifest.json``: a timeline checkpoint). Nothing is read."""
    path = Path(path)
    if path.suffix == ".safetensors":
        name = _FINAL[1] if path.name == _FINAL[0] else path.stem + ".manifest.json"
        return path, path.with_name(name)
    if path.suffix:
        raise ValueError(f"{path}: one of our checkpoints is a run folder or a .safetensors file")
    return path / _FINAL[0], path / _FINAL[1]
