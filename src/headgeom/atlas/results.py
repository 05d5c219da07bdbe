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

# ----------------------------------------------------------------------------- two checkpoints
# One pair of checkpoints of one lineage (config pairs[]: A = base or early, B = fine-tuned or
# late), each table under atlas/pairs/<pair>/ (docs/atlas.md, Two checkpoints).
_PAIR = [("pair", pa.string())]
_PAIR_DESCRIPTION = {"pair": "the pair's name (config pairs[].name)"}
_SCORED = [("corpus", pa.string()), ("kl_to_a", pa.float64()), ("kl_to_b", pa.float64()),
           ("top1", pa.float64()), ("retention", pa.float64()),
           ("accuracy", pa.float64())]  # fmt: skip
_SCORED_DESCRIPTIONS = {
    "corpus": "the scoring corpus, or mean (each corpus weighs the same)",
    "kl_to_a": "KL(A ‖ this model) of next-token distributions, mean over the corpus's scored "
               "positions (nats; float64 log-softmaxes)",
    "kl_to_b": "KL(B ‖ this model), the same way",
    "top1": "this model's next-token accuracy on the corpus's scored positions (0 to 1)",
    "retention": "mean over skills of the share of the probe items A gets right that this "
                 "model still gets right, each capped at 1 (the same on every corpus row)",
    "accuracy": "mean over skills of the share of probe items this model gets right (the "
                "same on every corpus row)",
}  # fmt: skip


def _pair_table(name: str, fields: list, descriptions: dict, one_row_per: str) -> ResultTable:
    names = {f[0] for f in fields}
    scored = {k: v for k, v in _SCORED_DESCRIPTIONS.items() if k in names}
    return _table(name, [*_PAIR, *fields], {**_PAIR_DESCRIPTION, **scored, **descriptions},
                  one_row_per)  # fmt: skip


PAIR_BLEND = _pair_table(
    "atlas_pair_blend",
    [("alpha", pa.float64()), *_SCORED],
    {"alpha": "the blend W = (1 − α)·A + α·B of every tensor (α = 0: A, α = 1: B)"},
    "(alpha, corpus)",
)
PAIR_PROBES = _pair_table(
    "atlas_pair_probes",
    [("alpha", pa.float64()), ("skill", pa.string()), ("item", pa.int64()),
     ("probe", pa.string()), ("prompt", pa.string()), ("expected", pa.string()),
     ("answer", pa.string()), ("correct", pa.bool_()), ("lead", pa.float64())],
    {"alpha": "the blend W = (1 − α)·A + α·B of every tensor (α = 0: A, α = 1: B)",
     "skill": "the skill (a workspace task: sva, quote, plural)",
     "item": "the item's index within its skill (atlas_probes)",
     "probe": "the item's label: skill and item",
     "prompt": "the prompt's text (decoded with A's tokenizer)",
     "expected": "the right candidate's text",
     "answer": "the candidate whose logit is the largest at the prompt's final position",
     "correct": "answer is the right candidate (a tie is wrong)",
     "lead": "the right candidate's logit minus the largest logit of the other candidates "
             "(> 0: right)"},
    "(alpha, skill, item)",
)  # fmt: skip
PAIR_GRAFTS = _pair_table(
    "atlas_pair_grafts",
    [("direction", pa.string()), ("group", pa.string()), ("layer", pa.int64()),
     ("part", pa.string()), ("n_tensors", pa.int64()), *_SCORED],
    {"direction": "b_into_a: A with the grafted tensors taken from B; a_into_b: B with A's",
     "group": "the tensor group grafted whole (embedding, positions, attention, mlp, norms, "
              "…), or layer for one layer's part",
     "layer": "the layer whose part is grafted; -1 for a whole group",
     "part": "group: every tensor of the group; norms or linear: the layer's norm weights "
             "(and biases) or its linear weights",
     "n_tensors": "tensors grafted"},
    "(direction, group, layer, part, corpus)",
)  # fmt: skip
PAIR_DRIFT = _pair_table(
    "atlas_pair_drift",
    [("tensor", pa.string()), ("group", pa.string()), ("kind", pa.string()),
     ("layer", pa.int64()), ("norm_a", pa.float64()), ("norm_delta", pa.float64()),
     ("drift", pa.float64())],
    {"tensor": "the tensor's state-dict name (A's and B's are the same)",
     "group": "its tensor group (headgeom.atlas.tensor_groups)",
     "kind": "table, linear, bias, norm, scale or frozen",
     "layer": "its decoder layer; -1 outside the decoder layers",
     "norm_a": "‖W_A‖ (Frobenius, float64)",
     "norm_delta": "‖W_B − W_A‖ (Frobenius, float64); a group's drift is "
                   "√Σ norm_delta² / √Σ norm_a² over its tensors",
     "drift": "norm_delta / norm_a (0 when neither moved nor exists; inf when a zero tensor "
              "moved): counts rescaling as change"},
    "tensor",
)  # fmt: skip
PAIR_LOWRANK = _pair_table(
    "atlas_pair_lowrank",
    [("mode", pa.string()), ("k", pa.int64()), ("fraction", pa.float64()),
     ("delta_share", pa.float64()), *_SCORED],
    {"mode": "top: A + the top-k singular directions of ΔW = W_B − W_A per linear layer; "
             "random: A + ΔW on a random k-dimensional slice of its input space; fraction: "
             "A + f·ΔW; minus_top: B − the top-k directions. Every other tensor is B's",
     "k": "the rank k (capped at each layer's rank); null for fraction",
     "fraction": "f (fraction only; null otherwise)",
     "delta_share": "Σ‖W − W_A‖² / Σ‖ΔW‖² over the linear layers: the share of the change's "
                    "squared norm this model keeps"},
    "(mode, k, fraction, corpus)",
)  # fmt: skip
#: The pair tables by their file name under atlas/pairs/<pair>/.
PAIR_TABLES = {"blend": PAIR_BLEND, "probes": PAIR_PROBES, "grafts": PAIR_GRAFTS,
               "drift": PAIR_DRIFT, "lowrank": PAIR_LOWRANK}  # fmt: skip
TABLES.update({t.name: t for t in PAIR_TABLES.values()})
