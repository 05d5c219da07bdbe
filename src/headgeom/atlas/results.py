"""The edit atlas's results contract (docs/atlas.md): every Parquet the atlas workflow writes,
as :class:`headgeom.results.ResultTable` (explicit schema, a description of every column
stored in the file, what one row is)."""

from __future__ import annotations

import pyarrow as pa

from headgeom.results import ResultTable

_EDIT = [("edit", pa.string()), ("kind", pa.string()), ("target", pa.string()),
         ("layer", pa.int64())]  # fmt: skip
_EDIT_DESCRIPTIONS = {
    "edit": "the edit's label, e.g. `zero L3.attn`, `average all.mlp`, `rows_mean embed`, "
    "`skip L7`, `flatten_keys L0`",
    "kind": "zero, average, rows_mean, skip or flatten_keys (docs/atlas.md, Edits)",
    "target": "attn, mlp or ple (zero, average), embed or ple (rows_mean), layer (skip), "
    "keys (flatten_keys)",
    "layer": "the edited layer; -1: every layer at once (everywhere), or the token embedding",
}


def _table(name: str, fields: list, descriptions: dict, one_row_per: str) -> ResultTable:
    names = {f[0] for f in fields}
    edit = {k: v for k, v in _EDIT_DESCRIPTIONS.items() if k in names}
    return ResultTable(name, pa.schema(fields), {**edit, **descriptions}, one_row_per)


WINDOWS = _table(
    "atlas_windows",
    [("corpus", pa.string()), ("role", pa.string()), ("window", pa.int64()),
     ("ids", pa.list_(pa.int64()))],
    {"corpus": "the scoring corpus (config corpora[].name)",
     "role": "means (held-out text of Average's means) or scored (where every edit is scored)",
     "window": "the window's index within its corpus (means first, then scored)",
     "ids": "the window's token ids in the model's vocabulary (BOS first where the "
            "tokenizer has one)"},
    "window of a scoring corpus",
)  # fmt: skip
PROBES = _table(
    "atlas_probes",
    [("skill", pa.string()), ("item", pa.int64()), ("prompt", pa.list_(pa.int64())),
     ("candidates", pa.list_(pa.int64())), ("answer", pa.int64())],
    {"skill": "the skill (a workspace task: sva, quote, plural)",
     "item": "the item's index within its skill",
     "prompt": "the prompt's token ids (the model's vocabulary)",
     "candidates": "the candidate answer tokens",
     "answer": "index of the right candidate (the item is right when its logit is the "
               "largest of the candidates')"},
    "probe item",
)  # fmt: skip
PROFILE = _table(
    "atlas_profile",
    [("layer", pa.int64()), ("block", pa.string()), ("label", pa.string()),
     ("write_size", pa.float64()), ("constant_part", pa.float64()), ("knob_rms", pa.float64()),
     ("old_state_carried", pa.float64())],
    {"layer": "decoder layer", "block": "attn, mlp or ple", "label": "e.g. L3.attn",
     "write_size": "RMS(write) / RMS(stream entering the layer), positions t ≥ 1 of the "
                   "means windows",
     "constant_part": "‖mean write‖² / mean ‖write‖² (1: a fixed vector)",
     "knob_rms": "RMS of the block's post-norm gain (the volume knob); NaN where the write "
                 "is not a norm's output",
     "old_state_carried": "RMS(in) / RMS(in + the layer's writes), the same for each block "
                          "of the layer"},
    "block",
)  # fmt: skip
EFFECTS = _table(
    "atlas_effects",
    [*_EDIT, ("corpus", pa.string()), ("kl", pa.float64()), ("delta_top1", pa.float64()),
     ("top1_base", pa.float64()), ("n_positions", pa.int64())],
    {"corpus": "the scoring corpus",
     "kl": "KL(original ‖ edited) of next-token distributions, mean over the corpus's "
           "scored positions (nats; float64 log-softmaxes)",
     "delta_top1": "edited − original next-token accuracy on the corpus, in points",
     "top1_base": "the original model's next-token accuracy on the corpus",
     "n_positions": "scored positions (every input position of the scored windows)"},
    "(edit, corpus)",
)  # fmt: skip
RETENTION = _table(
    "atlas_retention",
    [*_EDIT, ("skill", pa.string()), ("n_items", pa.int64()), ("n_base_correct", pa.int64()),
     ("n_kept", pa.int64()), ("retention", pa.float64())],
    {"skill": "the skill",
     "n_items": "its probe items",
     "n_base_correct": "items the original model gets right",
     "n_kept": "of those, items the edited model still gets right",
     "retention": "n_kept / n_base_correct (NaN when the original gets none right)"},
    "(edit, skill)",
)  # fmt: skip
SUMMARY = _table(
    "atlas_summary",
    [*_EDIT, ("kl", pa.float64()), ("delta_top1", pa.float64()),
     ("mean_retention", pa.float64())],
    {"kl": "KL averaged over the corpora (each corpus weighs the same)",
     "delta_top1": "Δ top-1 (points) averaged over the corpora",
     "mean_retention": "mean over skills of each skill's retention capped at 1"},
    "edit",
)  # fmt: skip

TABLES = {t.name: t for t in (WINDOWS, PROBES, PROFILE, EFFECTS, RETENTION, SUMMARY)}

COMPRESSION = _table(
    "atlas_compression",
    [("method", pa.string()), ("group", pa.string()), ("setting", pa.string()),
     ("bytes", pa.int64()), ("bytes_original", pa.int64()), ("corpus", pa.string()),
     ("kl", pa.float64()), ("delta_top1", pa.float64()), ("retention", pa.float64())],
    {"method": "original, int8, int4, int2 (round to nearest, per-group min-max scales), "
               "low_rank (best rank-k approximation), prune (vocabulary pruning) or mixed "
               "(int-b with the most sensitive layers at higher bits)",
     "group": "the compressed tensor group: embedding, ple_table, attention, mlp, or all "
              "(every one of them the model has)",
     "setting": "the method's setting in words (bits, rank, tokens kept, layers kept)",
     "bytes": "the group's size compressed: codes packed plus fp16 scale and minimum per "
              "group of 64 values; rank-k factors at 16 bits; kept rows plus the fallback row",
     "bytes_original": "the group's tables and matrices at 16 bits (the article's bf16 count)",
     "corpus": "the scoring corpus, or mean (each corpus weighs the same)",
     "kl": "KL(original ‖ compressed) of next-token distributions, mean over the corpus's "
           "scored positions (nats; float64 log-softmaxes)",
     "delta_top1": "compressed − original next-token accuracy, in points",
     "retention": "mean over skills of each skill's retention capped at 1 (the same on every "
                  "corpus row of the variant)"},
    "(method, group, setting, corpus)",
)  # fmt: skip
TABLES[COMPRESSION.name] = COMPRESSION
