"""The results contract: every Parquet the workflow writes, its columns and its provenance.

Each output is one :class:`ResultTable`: a name, an explicit pyarrow schema, a description
of every column (stored in the file as field metadata, so a reader understands the file
without the code) and what one row stands for. Producers write through
:meth:`ResultTable.write`; consumers (paper tables and figures, tests) name the columns they
read with :meth:`ResultTable.columns`, which refuses a column the producer does not write.

File-level provenance uses one set of keys (:data:`PROVENANCE_KEYS`), built by
:func:`provenance` and carried from an input file to its derived files by
:func:`carried_provenance`. The training log's schema lives with training
(``heads/stages/train.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import pandas as pd
import pyarrow as pa

from headgeom.hashing import content_hash, source_freeze
from headgeom.io import metadata_text, read_parquet_metadata, write_parquet
from headgeom.vocabulary import SPLITS, TASKS

# ----------------------------------------------------------------------------- provenance
#: SHA-256 of the checkpoint's safetensors bytes (the manifest's ``checkpoint_file_sha256``).
CHECKPOINT_SHA256 = "checkpoint_sha256"
#: Content hash (canonical JSON) of the checkpoint manifest; not the hash of its bytes.
MANIFEST_CONTENT_HASH = "manifest_content_hash"
#: ``dataset_sha256`` of the task file: canonical JSON of its example records.
TASK_DATASET_SHA256 = "task_dataset_sha256"
#: SHA-256 of the task Parquet's bytes.
TASK_FILE_SHA256 = "task_file_sha256"
#: Content hash of the run config the checkpoint was trained with, and its id.
CONFIG_HASH = "config_hash"
CONFIG_ID = "config_id"
#: Git commit and tracked-diff hash of the code that wrote the file (hashing.source_freeze).
SOURCE_FREEZE = "source_freeze"
#: Package version; io.write_parquet adds it to every Parquet.
CODE_VERSION = "headgeom_version"
#: The head-patching ablation mode (resample | mean | zero; docs §10.1) of the effects a file
#: derives from, and the SHA-256 of the means artifact (ablation/<m>/s<seed>/means.safetensors)
#: that mean ablation read; carried to every file computed from those effects.
PATCH_MODE = "patch_mode"
ABLATION_MEANS_SHA256 = "ablation_means_sha256"

PROVENANCE_KEYS = (
    CHECKPOINT_SHA256,
    MANIFEST_CONTENT_HASH,
    CONFIG_HASH,
    CONFIG_ID,
    TASK_DATASET_SHA256,
    TASK_FILE_SHA256,
    PATCH_MODE,  # ablation mode (docs §10.1)
    ABLATION_MEANS_SHA256,  # means artifact (docs §10.6)
    SOURCE_FREEZE,
    CODE_VERSION,
)
#: Keys an input file passes on to the files derived from it (the code keys are re-recorded).
CARRIED_KEYS = PROVENANCE_KEYS[:-2]


def provenance(
    manifest: Mapping[str, Any] | None = None,
    *,
    task_dataset_sha256: str | None = None,
    task_file_sha256: str | None = None,
    patch_mode: str | None = None,
    ablation_means_sha256: str | None = None,
) -> dict[str, Any]:
    """The provenance keys of a result file: checkpoint and manifest (from a checkpoint
    ``manifest`` record, when the file derives from a checkpoint), task dataset and task
    file hashes, the patching mode and the means artifact's hash (docs §10.6) when given, and
    always the source freeze of the code writing it."""
    out: dict[str, Any] = {}
    if manifest is not None:
        out[CHECKPOINT_SHA256] = manifest["checkpoint_file_sha256"]
        out[MANIFEST_CONTENT_HASH] = content_hash(dict(manifest))
        for key in (CONFIG_HASH, CONFIG_ID):
            if key in manifest:
                out[key] = manifest[key]
    if task_dataset_sha256 is not None:
        out[TASK_DATASET_SHA256] = task_dataset_sha256
    if task_file_sha256 is not None:
        out[TASK_FILE_SHA256] = task_file_sha256
    if patch_mode is not None:
        out[PATCH_MODE] = patch_mode
    if ablation_means_sha256 is not None:
        out[ABLATION_MEANS_SHA256] = ablation_means_sha256
    out[SOURCE_FREEZE] = source_freeze()
    return out


def file_metadata(
    analysis: str,
    version: str = "1",
    manifest: Mapping[str, Any] | None = None,
    *,
    carried: Mapping[str, str] | None = None,
    **keys: str | None,
) -> dict[str, Any]:
    """The leading metadata of an analysis' result file, in one order for every stage: the
    analysis and its version, the provenance ``carried`` from its input file (see
    :func:`carried_provenance`), then this file's own :func:`provenance` (``keys`` are its
    hash and mode arguments). Stage-specific fields follow in the caller's dict."""
    return {
        "analysis": analysis,
        "analysis_version": version,
        **(carried or {}),
        **provenance(manifest, **keys),
    }


def require_same_run(
    path: str | os.PathLike,
    manifest: Mapping[str, Any],
    task_dataset_sha256: str | None = None,
) -> Mapping[str, str]:
    """Read an input result file's metadata and refuse it unless it was computed from this
    checkpoint (and task dataset, when given): a stage joining its own forward with an
    upstream Parquet must not mix runs. Returns the metadata."""
    metadata = read_parquet_metadata(path)
    expected = {CHECKPOINT_SHA256: manifest["checkpoint_file_sha256"]}
    if task_dataset_sha256 is not None:
        expected[TASK_DATASET_SHA256] = task_dataset_sha256
    require_provenance(metadata, expected, path)
    return metadata


def carried_provenance(metadata: Mapping[str, str], path: str | os.PathLike) -> dict[str, str]:
    """The :data:`CARRIED_KEYS` present in an input file's metadata, as strings."""
    return {k: metadata_text(metadata, k, path) for k in CARRIED_KEYS if k in metadata}


def require_provenance(
    metadata: Mapping[str, str], expected: Mapping[str, str], path: str | os.PathLike
) -> None:
    """Refuse an input file whose provenance keys differ from ``expected`` (e.g. effects
    patched from another checkpoint or task than the one now given)."""
    for key, value in expected.items():
        found = metadata_text(metadata, key, path)
        if found != value:
            raise ValueError(
                f"{path}: {key} is {found} but the inputs have {value}; "
                "the effects come from another checkpoint or task (rerun patch_heads)"
            )


# ----------------------------------------------------------------------------- tables
#: Columns that mean the same in every result file; a table's own description wins.
STANDARD_DESCRIPTIONS = {
    "model": "model configuration name (config key, e.g. learned, write-common-axis)",
    "seed": "training (initialisation) seed of the model",
    "task": "behavioural task (sva, quote, plural; docs §8)",
    "split": "task split (discovery, validation, evaluation, holdout)",
    "example_id": "example id in the task Parquet",
    "condition": "task condition of the example (docs §8)",
    "lexical_group": "lexical group of the example (docs §8.1)",
    "layer": "layer l, 0-based (0 is closest to the embedding)",
    "head": "head index h within the layer, 0-based",
    "read_type": "reader input X: Q, K or V",
}


@dataclass(frozen=True)
class ResultTable:
    """One result Parquet: its schema, column descriptions and what one row is."""

    name: str
    schema: pa.Schema
    descriptions: Mapping[str, str]
    one_row_per: str

    def __post_init__(self) -> None:
        unknown = set(self.descriptions) - set(self.schema.names)
        if unknown:
            raise ValueError(f"{self.name}: descriptions name unknown columns {sorted(unknown)}")
        standard = {k: v for k, v in STANDARD_DESCRIPTIONS.items() if k in self.schema.names}
        object.__setattr__(self, "descriptions", {**standard, **self.descriptions})

    @property
    def names(self) -> list[str]:
        return list(self.schema.names)

    def columns(self, *names: str) -> list[str]:
        """``names`` as a list, refusing any column this table does not have."""
        missing = [n for n in names if n not in self.schema.names]
        if missing:
            raise KeyError(f"{self.name} has no columns {missing} (has {self.schema.names})")
        return list(names)

    def with_type(self, column: str, type_: pa.DataType) -> ResultTable:
        """The same table with ``column`` of another type (e.g. example_id as in the task)."""
        index = self.schema.get_field_index(column)
        return replace(self, schema=self.schema.set(index, pa.field(column, type_)))

    def write(
        self,
        path: str | os.PathLike,
        data: pd.DataFrame | pa.Table,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        write_parquet(path, data, self.schema, metadata, self.descriptions)


def _schema(*fields: Sequence[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([f for group in fields for f in group])


_RUN = [("model", pa.string()), ("seed", pa.int64())]
_RUN_TASK = [*_RUN, ("task", pa.string())]
_RUN_TASK_SPLIT = [*_RUN_TASK, ("split", pa.string())]

# --- corpus (heads/stages/tokenize_corpus.py) -----------------------------------------------------
# The train log (``TrainResult.log``, written by ``heads/stages/train.py``): one row per update.
_TRAIN_LOG_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("tokens", pa.int64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("grad_norm", pa.float64()),
        ("seconds", pa.float64()),
        ("val_loss", pa.float64()),
    ]
)
_TRAIN_LOG_DESCRIPTIONS = {
    "step": "optimizer update s (1-based; step 0 is the initialisation)",
    "tokens": "training tokens seen after this update (s * batch_size * n_ctx)",
    "loss": "training next-token cross-entropy of this update's batch, nats",
    "lr": "learning rate used by this update",
    "grad_norm": "global gradient L2 norm before clipping",
    "seconds": "wall-clock training seconds since the start at the end of this update "
    "(validation and checkpoint writes excluded; summed over restarts). The only column "
    "that differs between an interrupted-and-resumed run and an uninterrupted one",
    "val_loss": "validation cross-entropy in nats (docs §3.4) after this update; null "
    "except every eval_every steps, at every intermediate checkpoint step and at the "
    "final step",
}
TRAIN_LOG = ResultTable(
    name="train_log",
    schema=_TRAIN_LOG_SCHEMA,
    descriptions=_TRAIN_LOG_DESCRIPTIONS,
    one_row_per="optimizer update of one (model, seed)",
)


TOKENS = ResultTable(
    "tokens",
    pa.schema([("token", pa.uint16())]),
    {"token": "GPT-2 BPE token id in corpus order; documents are each followed by EOT (50256)"},
    "token of the corpus (or validation) stream",
)
VOCAB = ResultTable(
    "vocab",
    pa.schema([("model_id", pa.int32()), ("gpt2_id", pa.int32()), ("text", pa.string())]),
    {
        "model_id": "row of the model's embedding / unembedding (0-based, dense)",
        "gpt2_id": "GPT-2 BPE id that model_id stands for (sorted ascending)",
        "text": "decoded text of the GPT-2 token (invalid UTF-8 fragments shown as U+FFFD)",
    },
    "model vocabulary id",
)

# --- tasks (heads/stages/make_tasks.py) -----------------------------------------------------------
_LABEL = pa.dictionary(pa.int32(), pa.string())
TASK = ResultTable(
    "task",
    pa.schema(
        [
            ("example_id", pa.int32()),
            ("split", _LABEL),
            ("condition", _LABEL),
            ("lexical_group", _LABEL),
            ("clean_ids", pa.list_(pa.int32())),
            ("ref_ids", pa.list_(pa.int32())),
            ("diff_position", pa.int32()),
            ("correct_id", pa.int32()),
            ("incorrect_id", pa.int32()),
            ("correct_text", pa.string()),
            ("incorrect_text", pa.string()),
            ("clean_text", pa.string()),
            ("ref_text", pa.string()),
        ]
    ),
    {
        "example_id": "example id, unique within the task file (0-based)",
        "split": f"split: one of {', '.join(SPLITS)}; lexical items never shared across splits",
        "condition": "one of the task's 4 balanced conditions, defined by the clean prompt",
        "lexical_group": "lexical group (SVA subject pair, Quote first variable, Plural noun)",
        "clean_ids": "GPT-2 ids of the clean prompt; its last token is the prediction position",
        "ref_ids": "GPT-2 ids of the reference prompt: same length, one token differs",
        "diff_position": "index of the single token where clean_ids and ref_ids differ",
        "correct_id": "GPT-2 id of the correct answer for the clean prompt",
        "incorrect_id": "GPT-2 id of the incorrect answer for the clean prompt (correct for ref)",
        "correct_text": "text of correct_id",
        "incorrect_text": "text of incorrect_id",
        "clean_text": "clean prompt text (decodes clean_ids exactly)",
        "ref_text": "reference prompt text (decodes ref_ids exactly)",
    },
    "task example (clean/reference prompt pair)",
)

# --- models (heads/stages/param_counts.py) --------------------------------------------------------
PARAM_COUNTS = ResultTable(
    "param_counts",
    pa.schema(
        [
            ("model", pa.string()),
            ("seed", pa.int32()),
            ("repository_name", pa.string()),
            ("display_name", pa.string()),
            ("geometry", pa.string()),
            ("corpus", pa.string()),
            ("n_params", pa.int64()),
            ("expected_n_params", pa.int64()),
            ("n_frozen", pa.int64()),
            ("n_vocab", pa.int64()),
            ("basis_family_hash", pa.string()),
            ("note", pa.string()),
        ]
    ),
    {
        "repository_name": "the paper's repository name of this (model, seed), e.g. "
        "plain-learned42 (null when the study config gives none)",
        "display_name": "the paper's display name, e.g. all-rotated-self",
        "geometry": "read/write geometry (headgeom.model.geometries.GEOMETRIES or a multiscreen "
        "control)",
        "corpus": "training corpus R (200M tokens, with replacement) or S (1.07B, read once); "
        "null when the study does not say",
        "n_params": "trainable parameters of the real constructor, tied embedding counted once, "
        "frozen buffers excluded (docs §4.4); null if the model cannot be built",
        "expected_n_params": "exact count of docs §6.1 when the model has the paper's size; "
        "null where the paper gives no number (other sizes)",
        "n_frozen": "elements of the frozen buffers (write maps, read blocks); not parameters",
        "n_vocab": "vocabulary size the model was built with",
        "basis_family_hash": "content hash of the Kerdock ⊗ Haar basis family record (METHODS "
        "§5.7) the frozen maps come from; null when none is used",
        "note": "why n_params is null, if it is",
    },
    "(model, seed) of the study",
)

# --- weight-space geometry (heads/stages/geometry_stats.py) ---------------------------------------
GEOMETRY_PK = ResultTable(
    "geometry_pk",
    _schema(
        _RUN,
        [
            ("kind", pa.string()),
            ("source_layer", pa.int32()),
            ("source_head", pa.int32()),
            ("target_layer", pa.int32()),
            ("target_head", pa.int32()),
            ("read_type", pa.string()),
            ("pk", pa.float64()),
            ("rho", pa.float64()),
            ("source_dim", pa.int32()),
            ("target_dim", pa.int32()),
            ("same_index", pa.bool_()),
        ],
    ),
    {
        "model": "model configuration name (display name)",
        "seed": "training (initialisation) seed of the model",
        "kind": "write_write: U^{l,h} vs U^{l',k}, l < l' (PK symmetric, each pair once); "
        "write_read: U^{l,h} vs R_{X,0}^{l',h'}, l' > l",
        "source_layer": "layer l of the writing head, 0-based",
        "source_head": "head index h of the writing head, 0-based",
        "target_layer": "layer l' (> l) of the other head",
        "target_head": "head index of the other head",
        "read_type": "X ∈ {Q, K, V} of the read space for write_read; null for write_write",
        "pk": "projection kernel ‖UᵀV‖_F² = Σ cos²θ_i (docs §9.3), weight space",
        "rho": "PK / min(source_dim, target_dim)",
        "source_dim": "dimension of Im W_O of the source head (rank, SVD cut 1e-6·σ_max)",
        "target_dim": "dimension of the target write space or weight-space read space Im W_Xᵀ",
        "same_index": "source_head == target_head",
    },
    "(kind, source head, target head, read type) of one checkpoint",
)

_GEOMETRY_SUMMARY_COLUMNS = [
    ("model", pa.string(), "model configuration name (display name)"),
    ("seed", pa.int64(), "training (initialisation) seed of the model"),
    ("n_layer", pa.int32(), "layers L"),
    ("n_head", pa.int32(), "heads per layer H (own-best chance is 1/H)"),
    ("d_model", pa.int32(), "residual width D"),
    ("d_head", pa.int32(), "head width d"),
    ("write_dim_min", pa.int32(), "smallest dim Im W_O over heads"),
    ("write_dim_max", pa.int32(), "largest dim Im W_O over heads"),
    (
        "own_best_fraction",
        pa.float64(),
        "fraction of heads in layers ≥ 1 whose V read space R_{V,0} has strictly the "
        "largest PK with their own write space among their layer's heads (docs §14.1)",
    ),
    ("own_best_fraction_layer0", pa.float64(), "the same for the heads of layer 0"),
    ("n_heads_own_best_test", pa.int32(), "heads in layers ≥ 1 (the own-best reader set)"),
    (
        "rho_self_mean",
        pa.float64(),
        "mean over heads in layers ≥ 1 of ρ(R_{V,0}^{l,h}, U^{l,h}) = PK / min(dim)",
    ),
    ("rho_self_median", pa.float64(), "median of the same"),
    (
        "idempotence_median",
        pa.float64(),
        "median over all heads of the scaled idempotence P(T_h), T_h = O_h V_hᵀ (§14.3)",
    ),
    ("idempotence_mean", pa.float64(), "mean over all heads of P(T_h)"),
    (
        "prop1_applies",
        pa.bool_(),
        "every layer's writes decompose R^D orthogonally: H·d == D and "
        "max|Σ_h P_{U^{l,h}} − I| ≤ 1e-8 (docs §9.4)",
    ),
    (
        "write_decomposition_residual",
        pa.float64(),
        "max over layers of max|Σ_h P_{U^{l,h}} − I| (the detection statistic)",
    ),
    (
        "prop1_max_residual",
        pa.float64(),
        "check C14: max over layers l and all read spaces R of |Σ_h PK(U^{l,h}, R) − dim R| "
        "(tolerance 1e-8); null where Proposition 1 does not apply",
    ),
]
for _kind, _title in (("write_write", "write–write"), ("write_read", "write→later-read")):
    for _index in ("same_index", "other_index"):
        for _stat in ("mean", "min", "max"):
            _GEOMETRY_SUMMARY_COLUMNS.append(
                (
                    f"{_kind}_pk_{_index}_{_stat}",
                    pa.float64(),
                    f"{_stat} of inter-layer {_title} PK over {_index.replace('_', '-')} "
                    f"head pairs" + (" (Q, K, V pooled)" if _kind == "write_read" else ""),
                )
            )
GEOMETRY_SUMMARY = ResultTable(
    "geometry_summary",
    pa.schema([(name, typ) for name, typ, _ in _GEOMETRY_SUMMARY_COLUMNS]),
    {name: text for name, _, text in _GEOMETRY_SUMMARY_COLUMNS},
    "(model, seed)",
)
GEOMETRY_HEADS = ResultTable(
    "geometry_heads",
    _schema(
        _RUN,
        [
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("pk_self", pa.float64()),
            ("pk_best_other", pa.float64()),
            ("own_best", pa.bool_()),
            ("rho_self", pa.float64()),
            ("idempotence", pa.float64()),
        ],
    ),
    {
        "pk_self": "PK(R_{V,0}^{l,h}, U^{l,h}): the head's V read space against its own write "
        "space (docs §14.1)",
        "pk_best_other": "the largest PK(R_{V,0}^{l,h}, U^{l,h'}) over the other heads h' of "
        "layer l; null with one head per layer",
        "own_best": "pk_self beats every other head's PK by more than 1e-9 (docs §14.1; the "
        "summary's own-best fraction counts these over layers ≥ 1)",
        "rho_self": "ρ_self = pk_self / min(dim R_{V,0}, dim U)",
        "idempotence": "scaled idempotence P(T_h), T_h = O_h V_hᵀ (docs §14.3); null when T_h² = 0",
    },
    "(layer, head) of one checkpoint: the per-head values the summary aggregates",
)

# --- clean evaluation (heads/stages/evaluate_clean.py) --------------------------------------------
EVAL = ResultTable(
    "eval",
    _schema(
        _RUN_TASK_SPLIT,
        [("n", pa.int64()), ("accuracy", pa.float64()), ("margin", pa.float64())],
    ),
    {
        "model": "model configuration name (the {model} wildcard)",
        "seed": "initialisation seed",
        "task": "task name",
        "split": "task split",
        "n": "examples in the split",
        "accuracy": "fraction of clean prompts with LD = logit(correct) - logit(incorrect) > 0",
        "margin": "mean clean LD over the split (logits, final prompt position)",
    },
    "(model, seed, task, split)",
)

# --- head patching (heads/stages/patch_heads.py) --------------------------------------------------
#: example_id keeps the task file's type: write with ``EFFECTS.with_type("example_id", ...)``.
EFFECTS = ResultTable(
    "effects",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("example_id", pa.int32()),
            ("condition", pa.string()),
            ("lexical_group", pa.string()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("clean_ld", pa.float64()),
            ("patched_ld", pa.float64()),
            ("effect", pa.float64()),
        ],
    ),
    {
        "model": "model configuration name (display name, e.g. learned, write-common-axis)",
        "seed": "training (initialisation) seed of the model",
        "task": "behavioural task (sva, quote, plural)",
        "split": "task split the example belongs to",
        "example_id": "example id in the task file",
        "condition": "task condition of the example",
        "lexical_group": "lexical group of the example (docs §8.1)",
        "layer": "layer l of the patched head, 0-based",
        "head": "head index h within the layer, 0-based",
        "clean_ld": "logit(correct) − logit(incorrect) at the final position, clean prompt",
        "patched_ld": "the same with z^{l,h} replaced by its reference value at all positions",
        "effect": "drop d_{l,h}(x) = clean_ld − patched_ld (positive: the patch hurts)",
    },
    "(split, example, layer, head) of one (model, seed, task)",
)

# --- key/value-head patching of grouped-query models (heads/stages/patch_kv_heads.py) -------------
#: example_id keeps the task file's type, as in EFFECTS.
KV_EFFECTS = ResultTable(
    "kv_effects",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("example_id", pa.int32()),
            ("condition", pa.string()),
            ("lexical_group", pa.string()),
            ("layer", pa.int32()),
            ("kv_head", pa.int32()),
            ("query_heads", pa.list_(pa.int32())),
            ("clean_ld", pa.float64()),
            ("patched_ld", pa.float64()),
            ("effect", pa.float64()),
        ],
    ),
    {
        "model": "model configuration name (the {model} wildcard)",
        "example_id": "example id in the task file",
        "layer": "layer l of the patched key/value head, 0-based",
        "kv_head": "key/value head j within the layer, 0-based",
        "query_heads": "the query heads h that read key/value head j (cfg.kv_groups[j])",
        "clean_ld": "logit(correct) − logit(incorrect) at the final position, clean prompt",
        "patched_ld": "the same with key/value head j's k and v projection outputs replaced by "
        "their reference values at all positions (before k-norm and rotary, docs §10.1)",
        "effect": "drop d_{l,j}(x) = clean_ld − patched_ld (positive: the patch hurts)",
    },
    "(split, example, layer, key/value head) of one (model, seed, task)",
)

# --- attribution patching beside exact (heads/stages/atp_agreement.py) ---------------------------
#: example_id keeps the task file's type: write with ``ATP_EXAMPLES.with_type(...)``.
ATP_EXAMPLES = ResultTable(
    "atp_examples",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("example_id", pa.int32()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("clean_ld", pa.float64()),
            ("atp_ld", pa.float64()),
            ("effect_atp", pa.float64()),
            ("effect_exact", pa.float64()),
        ],
    ),
    {
        "split": "task split of the example (the analysis split)",
        "example_id": "example id in the task file",
        "layer": "layer l of the head, 0-based",
        "clean_ld": "logit(correct) − logit(incorrect) at the final position, clean prompt "
        "(AtP's clean forward)",
        "atp_ld": "first-order estimate of the patched LD: clean_ld + Σ_t (z^ref − z)·∂LD/∂z "
        "of head (l, h) (AtP: two forwards and one backward per batch)",
        "effect_atp": "AtP's drop clean_ld − atp_ld",
        "effect_exact": "the exact drop d_{l,h}(x) of the effects file (the head patched and "
        "the model rerun)",
    },
    "(example, layer, head) of the analysis split of one (model, seed, task)",
)
ATP_HEADS = ResultTable(
    "atp_heads",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("n_examples", pa.int64()),
            ("effect_exact", pa.float64()),
            ("effect_atp", pa.float64()),
            ("miss", pa.float64()),
            ("rank_exact", pa.int64()),
            ("rank_atp", pa.int64()),
            ("top_exact", pa.bool_()),
            ("top_atp", pa.bool_()),
        ],
    ),
    {
        "split": "split whose examples are averaged (the analysis split)",
        "n_examples": "examples averaged",
        "effect_exact": "signed mean exact drop e_{l,h} over the split's examples (the "
        "concentration heads file's e)",
        "effect_atp": "signed mean AtP drop over the same examples",
        "miss": "effect_atp − effect_exact, logit units",
        "rank_exact": "rank of |effect_exact| among the L·H heads, 1 = largest; ties in "
        "row-major (layer, head) order",
        "rank_atp": "rank of |effect_atp|, the same way",
        "top_exact": "rank_exact ≤ k (the agreement file's top_k)",
        "top_atp": "rank_atp ≤ k",
    },
    "(layer, head) of the analysis split of one (model, seed, task)",
)
ATP_AGREEMENT = ResultTable(
    "atp_agreement",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("n_examples", pa.int64()),
            ("n_heads", pa.int64()),
            ("spearman_rho", pa.float64()),
            ("spearman_p", pa.float64()),
            ("spearman_rho_abs", pa.float64()),
            ("top_k", pa.int64()),
            ("top_k_overlap", pa.float64()),
            ("top_k_boundary_tie", pa.bool_()),
            ("E_exact", pa.float64()),
            ("E_atp", pa.float64()),
            ("N_eff_exact", pa.float64()),
            ("N_eff_atp", pa.float64()),
            ("max_abs_miss", pa.float64()),
            ("miss_layer", pa.list_(pa.int32())),
            ("miss_head", pa.list_(pa.int32())),
            ("miss_exact", pa.list_(pa.float64())),
            ("miss_atp", pa.list_(pa.float64())),
        ],
    ),
    {
        "split": "split whose per-head means are compared (the analysis split)",
        "n_examples": "examples averaged into each head's effects",
        "n_heads": "heads compared, L·H",
        "spearman_rho": "Spearman ρ of the signed effects e_exact vs e_atp over the heads "
        "(scipy.stats.spearmanr, average ranks for ties); null when a side is constant",
        "spearman_p": "two-sided p of spearman_rho (scipy); null with it",
        "spearman_rho_abs": "Spearman ρ of |e_exact| vs |e_atp| (the ranking by size)",
        "top_k": "k = min(10, n_heads)",
        "top_k_overlap": "|top-k by |e_exact| ∩ top-k by |e_atp|| / k; ties in |e| broken "
        "in row-major (layer, head) order",
        "top_k_boundary_tie": "the k-th and (k+1)-th largest |e| are equal on either side, "
        "so the overlap depends on the tie-break",
        "E_exact": "Σ|e_exact| (docs §10.2)",
        "E_atp": "Σ|e_atp|",
        "N_eff_exact": "N_eff of e_exact (docs §10.2); null when every effect is zero",
        "N_eff_atp": "N_eff of e_atp, what AtP would report",
        "max_abs_miss": "max over heads of |e_atp − e_exact|, logit units",
        "miss_layer": "layers of the heads with the largest |e_atp − e_exact|, largest first "
        "(ties row-major)",
        "miss_head": "their head indices",
        "miss_exact": "their e_exact",
        "miss_atp": "their e_atp",
    },
    "(model, seed, task, split)",
)

# --- concentration (heads/stages/concentration.py) ------------------------------------------------
_STAT_DESCRIPTIONS = {
    "n_examples": "examples averaged into e",
    "E": "Σ|e_{l,h}|, logit units: separate single-head interventions, not a joint one",
    "N_eff": "exp of the Shannon entropy (nats) of p = |e|/E: effective number of heads",
    "top_head_share": "max |e| / E",
    "N_index": "exp H(index marginal q_h = Σ_l p_{l,h}) (docs §10.3)",
    "N_layer_given_index": "exp Σ_h q_h H(layer | h); N_eff = N_index · N_layer_given_index",
    "N_eff_abs": "N_eff with p from the per-example-absolute effects E_x|d(x)| (docs §12.3)",
    "N_eff_abs_ratio": "N_eff_abs / N_eff",
}
HEADS = ResultTable(
    "heads",
    _schema(
        _RUN_TASK_SPLIT,
        [("layer", pa.int32()), ("head", pa.int32()), ("e", pa.float64()), ("p", pa.float64())],
    ),
    {
        "e": "signed mean drop e_{l,h} over the split's examples, logit units (docs §10.1)",
        "p": "share |e_{l,h}| / E; null when every effect is zero (docs §10.2)",
    },
    "(split, layer, head) of one (model, seed, task)",
)
_SUMMARY_SCHEMA = _schema(
    _RUN_TASK_SPLIT,
    [
        ("n_examples", pa.int64()),
        ("E", pa.float64()),
        ("N_eff", pa.float64()),
        ("top_head_share", pa.float64()),
        ("top_layer", pa.int32()),
        ("top_head", pa.int32()),
        ("N_index", pa.float64()),
        ("N_layer_given_index", pa.float64()),
    ],
)
SUMMARY = ResultTable(
    "summary",
    _SUMMARY_SCHEMA,
    {
        **{k: v for k, v in _STAT_DESCRIPTIONS.items() if k in _SUMMARY_SCHEMA.names},
        "top_layer": "layer of the head with the largest |e| (first in row-major order on ties)",
        "top_head": "head index of that head",
    },
    "split of one (model, seed, task)",
)
ROBUSTNESS = ResultTable(
    "robustness",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("n_examples", pa.int64()),
            ("n_layers", pa.int32()),
            ("n_heads", pa.int32()),
            ("E", pa.float64()),
            ("N_eff", pa.float64()),
            ("top_head_share", pa.float64()),
            ("N_index", pa.float64()),
            ("N_layer_given_index", pa.float64()),
            ("index_meaningful", pa.bool_()),
            ("N_index_null_median", pa.float64()),
            ("N_index_p_lower", pa.float64()),
            ("n_permutations", pa.int64()),
            ("permutation_seed", pa.int64()),
            ("N_eff_abs", pa.float64()),
            ("N_eff_abs_ratio", pa.float64()),
            ("N_eff_boot_median", pa.float64()),
            ("N_eff_ci_low", pa.float64()),
            ("N_eff_ci_high", pa.float64()),
            ("ci_level", pa.float64()),
            ("n_bootstrap", pa.int64()),
            ("bootstrap_seed", pa.int64()),
            ("n_lexical_groups", pa.int64()),
            ("logo_max_rel_change", pa.float64()),
            ("logo_max_rel_change_group", pa.string()),
        ],
    ),
    {
        **_STAT_DESCRIPTIONS,
        "split": "analysis split (config concentration.split; the evaluation split of docs §12)",
        "n_layers": "layers L of the model",
        "n_heads": "heads per layer H of the model",
        "index_meaningful": "the model has the base architecture's heads per layer, so head "
        "indices form the paper's lanes and the index decomposition/null are reported "
        "(docs §10.3: 12-head models); false for write-routed and multiscreen models",
        "N_index_null_median": "median N_index over within-layer head-index permutations (§10.4)",
        "N_index_p_lower": "lower one-sided p = (1 + #{N_index_null ≤ N_index}) / (1 + "
        "n_permutations); uncorrected across models",
        "n_permutations": "within-layer permutation draws of the index null",
        "permutation_seed": "seed of numpy Generator(PCG64) for the permutations",
        "N_eff_boot_median": "median N_eff over bootstrap resamples of the examples",
        "N_eff_ci_low": "lower end of the percentile bootstrap interval of N_eff (§12.4)",
        "N_eff_ci_high": "upper end of the percentile bootstrap interval of N_eff (§12.4)",
        "ci_level": "coverage of the percentile interval (0.95: 2.5 and 97.5 percentiles)",
        "n_bootstrap": "bootstrap resamples (examples drawn with replacement)",
        "bootstrap_seed": "seed of numpy Generator(PCG64) for the resamples (same indices as "
        "the paired bootstrap across models)",
        "n_lexical_groups": "lexical groups left out in turn (§12.6)",
        "logo_max_rel_change": "max over left-out lexical groups of |N_eff(without group) − "
        "N_eff| / N_eff (§12.6)",
        "logo_max_rel_change_group": "lexical group whose removal changes N_eff most",
    },
    "analysis split of one (model, seed, task)",
)
CONDITIONS = ResultTable(
    "conditions",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("condition", pa.string()),
            ("n_examples", pa.int64()),
            ("E", pa.float64()),
            ("N_eff", pa.float64()),
            ("top_head_share", pa.float64()),
            ("N_eff_abs", pa.float64()),
        ],
    ),
    {
        **{k: _STAT_DESCRIPTIONS[k] for k in ("E", "N_eff", "top_head_share", "N_eff_abs")},
        "n_examples": "examples of the condition (docs §12.5: 60 per condition)",
    },
    "condition of the analysis split of one (model, seed, task)",
)
LOGO = ResultTable(
    "logo",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("lexical_group", pa.string()),
            ("n_dropped", pa.int64()),
            ("n_kept", pa.int64()),
            ("N_eff", pa.float64()),
            ("N_eff_all", pa.float64()),
            ("rel_change", pa.float64()),
        ],
    ),
    {
        "lexical_group": "the lexical group left out (docs §12.6)",
        "n_dropped": "examples of the group, dropped",
        "n_kept": "examples kept",
        "N_eff": "N_eff on the kept examples",
        "N_eff_all": "N_eff on all examples of the split",
        "rel_change": "(N_eff − N_eff_all) / N_eff_all, signed",
    },
    "left-out lexical group of the analysis split of one (model, seed, task)",
)

# --- paired comparisons (heads/stages/compare_concentration.py) -----------------------------------
_PAIR_FIELDS = [
    ("task", pa.string()),
    ("split", pa.string()),
    ("model_a", pa.string()),
    ("seed_a", pa.int64()),
    ("model_b", pa.string()),
    ("seed_b", pa.int64()),
    ("pair_label", pa.string()),
]
_PAIR_DESCRIPTIONS = {
    "split": "analysis split (config concentration.split)",
    "model_a": "model A of the difference N_eff(A) − N_eff(B)",
    "seed_a": "training seed of model A",
    "model_b": "model B",
    "seed_b": "training seed of model B",
    "pair_label": "'<A> s<seed> − <B> s<seed>'",
}
PAIRED = ResultTable(
    "paired",
    _schema(
        _PAIR_FIELDS,
        [
            ("n_examples", pa.int64()),
            ("N_eff_a", pa.float64()),
            ("N_eff_b", pa.float64()),
            ("diff", pa.float64()),
            ("ratio", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            ("ci_level", pa.float64()),
            ("n_bootstrap", pa.int64()),
            ("bootstrap_seed", pa.int64()),
            ("resolved", pa.bool_()),
            ("logo_n_groups", pa.int64()),
            ("logo_sign_reversals", pa.int64()),
            ("logo_min_diff", pa.float64()),
            ("logo_max_diff", pa.float64()),
            ("logo_reversal_groups", pa.string()),
        ],
    ),
    {
        **_PAIR_DESCRIPTIONS,
        "n_examples": "examples shared by both models",
        "N_eff_a": "N_eff of A on all shared examples",
        "N_eff_b": "N_eff of B on all shared examples",
        "diff": "N_eff(A) − N_eff(B) on all shared examples",
        "ratio": "N_eff(A) / N_eff(B)",
        "ci_low": "lower end of the paired-bootstrap percentile interval of diff (docs §12.4)",
        "ci_high": "upper end of that interval",
        "ci_level": "coverage of the interval (0.95: the 2.5 and 97.5 percentiles)",
        "n_bootstrap": "paired resamples: the same example multiplicities applied to A and B",
        "bootstrap_seed": "seed of numpy Generator(PCG64) for the resamples",
        "resolved": "the interval excludes 0",
        "logo_n_groups": "lexical groups left out in turn (docs §12.6)",
        "logo_sign_reversals": "left-out groups whose diff has the opposite sign of diff",
        "logo_min_diff": "smallest diff over left-out groups",
        "logo_max_diff": "largest diff over left-out groups",
        "logo_reversal_groups": "comma-separated groups whose removal reverses the sign ('' if "
        "none)",
    },
    "pair of (model, seed) on one task",
)
PAIRED_LOGO = ResultTable(
    "paired_logo",
    _schema(
        _PAIR_FIELDS,
        [
            ("lexical_group", pa.string()),
            ("n_kept", pa.int64()),
            ("N_eff_a", pa.float64()),
            ("N_eff_b", pa.float64()),
            ("diff", pa.float64()),
            ("sign_reversed", pa.bool_()),
        ],
    ),
    {
        **_PAIR_DESCRIPTIONS,
        "lexical_group": "lexical group left out of both models (docs §12.6)",
        "n_kept": "examples kept",
        "N_eff_a": "N_eff of A without the group",
        "N_eff_b": "N_eff of B without the group",
        "diff": "N_eff(A) − N_eff(B) without the group",
        "sign_reversed": "diff has the opposite sign of the all-example diff",
    },
    "(pair, left-out lexical group) on one task",
)

# --- loss versus concentration (heads/stages/concentration_loss.py) -------------------------------
LOSS_TASKS = TASKS
LOSS = ResultTable(
    "loss",
    _schema(
        _RUN,
        [
            ("display_name", pa.string()),
            ("geometry", pa.string()),
            ("corpus", pa.string()),
            ("reader_type", pa.string()),
            ("n_head", pa.int32()),
            ("index_meaningful", pa.bool_()),
            ("val_loss", pa.float64()),
            *[(f"N_eff_{t}", pa.float64()) for t in LOSS_TASKS],
            ("N_eff_geomean", pa.float64()),
            ("included", pa.bool_()),
        ],
    ),
    {
        "display_name": "the paper's name of the configuration",
        "geometry": "read/write geometry (docs §6)",
        "corpus": "training corpus of the paper (R or S); null when the study does not say",
        "reader_type": "free (learned W_QKV after the shared LN) or block readers (marker of "
        "paper Figure 4)",
        "n_head": "heads per layer (16-head models are flagged in paper Figure 4)",
        "index_meaningful": "n_head equals the base architecture's (the paper's 12-head models)",
        "val_loss": "validation loss (nats) of the final checkpoint, from its manifest "
        "(val_loss_nats); x of paper Figure 4",
        **{f"N_eff_{t}": f"N_eff on {t}, analysis split" for t in LOSS_TASKS},
        "N_eff_geomean": "geometric mean of N_eff over the three tasks; y of paper Figure 4",
        "included": "in the loss-versus-N_eff correlation (config concentration.loss_models)",
    },
    "(model, seed)",
)
SPEARMAN = ResultTable(
    "spearman",
    pa.schema(
        [
            ("analysis", pa.string()),
            ("subset", pa.string()),
            ("task", pa.string()),
            ("n", pa.int64()),
            ("rho", pa.float64()),
            ("p_value", pa.float64()),
        ]
    ),
    {
        "analysis": "loss_vs_N_eff: validation loss vs geometric-mean N_eff over (model, seed) "
        "(docs §12.7); N_eff_vs_N_eff_abs: N_eff vs per-example-absolute N_eff (METHODS "
        "§12.3)",
        "subset": "loss_vs_N_eff: all (every included (model, seed)) or base_heads (included "
        "models with the base head count). N_eff_vs_N_eff_abs: paper_pairs (every (model, seed, "
        "task) of the base architecture, no multiscreen control: the paper's 57 pairs), "
        "figure3 (one task, the runs of paper Figure 3), every_run (every run, pooled when "
        "task is null, else one task; an extra view)",
        "task": "task of a per-task row; null otherwise",
        "n": "points correlated",
        "rho": "Spearman ρ (scipy.stats.spearmanr); null when n < 3 or a variable is constant",
        "p_value": "two-sided p of ρ (scipy); null with ρ",
    },
    "(analysis, subset, task) correlation",
)

# --- lanes (heads/stages/lanes.py) ----------------------------------------------------------------
LANES = ResultTable(
    "lanes",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("lambda_score", pa.float64()),
            ("p_value", pa.float64()),
            ("n_permutations", pa.int64()),
            ("permutation_seed", pa.int64()),
            ("chance", pa.float64()),
            ("n_layers", pa.int32()),
            ("n_heads", pa.int32()),
        ],
    ),
    {
        "split": "split whose effects e_{l,h} were used",
        "lambda_score": "Λ: share of cross-layer positive-effect pair mass in same-index pairs; "
        "null when undefined",
        "p_value": "one-sided upper permutation p, (1 + #{Λ_perm ≥ Λ}) / (1 + n_permutations), "
        "head labels shuffled within each layer; uncorrected; null when Λ is undefined",
        "n_permutations": "permutations drawn",
        "permutation_seed": "seed of numpy Generator(PCG64) for the permutations",
        "chance": "1 / n_heads",
        "n_layers": "layers L of the model",
        "n_heads": "heads per layer H of the model",
    },
    "(model, seed, task)",
)

# --- leakage (heads/stages/leakage.py) ------------------------------------------------------------
LEAKAGE = ResultTable(
    "leakage",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("source_layer", pa.int32()),
            ("source_head", pa.int32()),
            ("reader_layer", pa.int32()),
            ("reader_head", pa.int32()),
            ("read_type", pa.string()),
            ("leakage", pa.float64()),
            ("rho", pa.float64()),
            ("leakage_over_rho", pa.float64()),
            ("pk", pa.float64()),
            ("write_dim", pa.int32()),
            ("read_dim", pa.int32()),
            # --- paper §5.1: direct vs total responses, attention TV (docs §11.5, §11.6), same pass
            ("response_cosine", pa.float64()),
            ("response_norm_ratio", pa.float64()),
            ("response_projection", pa.float64()),
            ("tv_query", pa.float64()),
            ("tv_keys", pa.float64()),
            ("tv_direct", pa.float64()),
            ("tv_total", pa.float64()),
        ],
    ),
    {
        "split": "task split whose examples (all positions) pool the perturbation",
        "source_layer": "layer l of the patched source head i",
        "source_head": "head h of the source",
        "reader_layer": "layer l' > l of the reader j",
        "reader_head": "head h' of the reader",
        "read_type": "Q, K or V: which reader map defines the folded read space (K, V of "
        "grouped-query attention: the shared key/value head's, on every query head of its "
        "group, docs §11.8)",
        "leakage": "L = Σ‖P_R δ_i‖² / Σ‖δ_i‖² over examples and positions; null if δ_i = 0",
        "rho": "isotropic expectation PK(U^i, R) / dim U^i, U^i = Im W_O^i",
        "leakage_over_rho": "leakage / rho; null if either is undefined or rho = 0",
        "pk": "projection kernel PK(U^i, R) = ‖U^iᵀ R‖_F²",
        "write_dim": "dim U^i (rank of W_O^i)",
        "read_dim": "dim R (rank of the folded read map)",
        # --- paper §5.1: direct vs total responses, attention TV (docs §11.5, §11.6)
        "response_cosine": "Σ⟨Δ_direct, Δ_total⟩ / √(Σ‖Δ_direct‖² Σ‖Δ_total‖²) at reader j's "
        "X projection, pooled over examples and positions (docs §11.5); null if either is 0",
        "response_norm_ratio": "√Σ‖Δ_direct‖² / √Σ‖Δ_total‖² (docs §11.5)",
        "response_projection": "Σ⟨Δ_direct, Δ_total⟩ / Σ‖Δ_total‖² = cosine × norm ratio "
        "(docs §11.5; not bounded by 1)",
        "tv_query": "attention TV of reader j at the final position, query from x + δ_i, "
        "clean keys; mean over examples (docs §11.6); one value per (source, reader), "
        "repeated on its Q, K and V rows; null where attention is not softmax(q·k/√d) of "
        "the projections (rotary positions, q/k norms: transformers models but GPT-2, docs §11.8)",
        "tv_keys": "the same with every key from x + δ_i and the clean query",
        "tv_direct": "the same with query and keys from x + δ_i",
        "tv_total": "the same with query and keys from the patched forward's residual",
    },
    "(source head, later reader head, read type) of one (model, seed, task, split)",
)

# --- paper §5.1 exclusivity summaries (docs §11.3–11.6; heads/stages/exclusivity.py) --------------
EXCLUSIVITY_HEADS = ResultTable(
    "exclusivity_heads",
    _schema(
        _RUN_TASK,
        [
            ("selection", pa.string()),
            ("split", pa.string()),
            ("ranking", pa.string()),
            ("rank", pa.int32()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("e", pa.float64()),
        ],
    ),
    {
        "selection": "evaluation (signed e, the §5.1 selection), evaluation_abs (|e|, logged "
        "only) or discovery (signed e on the discovery split, the selection check)",
        "split": "split whose effects rank the heads",
        "ranking": "signed (largest e first) or abs (largest |e| first); ties row-major",
        "rank": "1, 2, 3",
        "e": "the head's mean drop e_{l,h} on that split (logit units)",
    },
    "(model, seed, task, selection, rank)",
)
_PAIR_EXTRA = [
    ("selection", pa.string()),
    ("geometry", pa.string()),
    ("percentile_all_later", pa.float64()),
    ("percentile_same_layer", pa.float64()),
    ("tv_query_percentile", pa.float64()),
    ("tv_total_percentile", pa.float64()),
]
_PAIR_EXTRA_DESCRIPTIONS = {
    "selection": "evaluation or discovery: the split whose top-3 heads make the pair",
    "geometry": "the model's geometry (learned, write-common-axis, ...)",
    "percentile_all_later": "mid-rank percentile 100·(#{<} + ½#{=})/n of L among every "
    "later reader of the same source and X, the pair included (docs §11.4)",
    "percentile_same_layer": "the same among the readers of the pair's reader layer only "
    "(layer-matched control)",
    "tv_query_percentile": "mid-rank percentile of the pair's query-only TV among every "
    "later head of the same source (docs §11.6)",
    "tv_total_percentile": "the same for total TV",
}
EXCLUSIVITY_PAIRS = ResultTable(
    "exclusivity_pairs",
    pa.schema([*LEAKAGE.schema, *[pa.field(n, t) for n, t in _PAIR_EXTRA]]),
    {**LEAKAGE.descriptions, **_PAIR_EXTRA_DESCRIPTIONS},
    "(selection, model, seed, task, top source, later top reader, X): the ordered top pairs",
)
EXCLUSIVITY = ResultTable(
    "exclusivity",
    _schema(
        [
            ("quantity", pa.string()),
            ("scope", pa.string()),
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("read_type", pa.string()),
            ("value", pa.float64()),
            ("n", pa.int64()),
            ("split", pa.string()),
        ]
    ),
    {
        "quantity": "which §5.1 number (docs/results.md lists them; discovery_ prefix: the "
        "discovery-selected top heads)",
        "scope": "what it pools: run (one model and seed, all tasks), run_task, "
        "run_task_range, all (every top pair of the study), geometry:<g>, top_pairs, "
        "all_pairs, all_later_heads, other_later_heads, top3_sources",
        "model": "model, for run and run_task scopes (else null)",
        "seed": "seed, for run and run_task scopes",
        "task": "task, for the run_task scope",
        "read_type": "X, where the number is per read type (else null)",
        "value": "the number: fractions of energy, ratios, percentiles (0–100), shares (0–1), "
        "correlations, counts",
        "n": "how many pairs, heads or sources it summarises",
        "split": "the analysis split of the leakage rows (evaluation)",
    },
    "(quantity, scope, model, seed, task, read_type)",
)


# --- clamps (docs §13.3, §15.3; heads/stages/clamps.py) -------------------------------------------
_CLAMP_SOURCE = {
    "split": "split whose examples the clamp runs average over (docs §16.1: evaluation)",
    "source_layer": "layer l_i of the patched source head i",
    "source_head": "head index h_i of the source",
    "source_rank": "rank of the source by signed evaluation effect (0 = largest)",
}
CLAMP_PAIRS = ResultTable(
    "clamp_pairs",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("source_layer", pa.int32()),
            ("source_head", pa.int32()),
            ("source_rank", pa.int32()),
            ("later_layer", pa.int32()),
            ("later_head", pa.int32()),
            ("later_rank", pa.int32()),
            ("same_index", pa.bool_()),
            ("e_unclamped", pa.float64()),
            ("e_head_clamped", pa.float64()),
            ("e_mlps_clamped", pa.float64()),
            ("reduction_head", pa.float64()),
            ("reduction_mlps", pa.float64()),
        ],
    ),
    {
        **_CLAMP_SOURCE,
        "later_layer": "layer l_j > l_i of the later top head j",
        "later_head": "head index of j",
        "later_rank": "rank of j by signed evaluation effect",
        "same_index": "h_i = h_j (a same-index pair: one lane)",
        "e_unclamped": "e_∅: mean drop LD_clean − LD_patched with source i patched (docs §10.1)",
        "e_head_clamped": "the same with head j's z held at its clean value",
        "e_mlps_clamped": "the same with every MLP from layer l_i on held clean",
        "reduction_head": "(e_∅ − e_head_clamped) / e_∅; may be < 0 or > 1; null if e_∅ = 0",
        "reduction_mlps": "(e_∅ − e_mlps_clamped) / e_∅; null if e_∅ = 0",
    },
    "ordered pair (source i, later j) of the top-3 heads with l_i < l_j, per (model, seed, task)",
)
CLAMP_PATHS = ResultTable(
    "clamp_paths",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("rank", pa.int32()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("e_stored", pa.float64()),
            ("delta_none", pa.float64()),
            ("delta_later_heads", pa.float64()),
            ("delta_mlps", pa.float64()),
            ("delta_both", pa.float64()),
            ("delta_all_but_source", pa.float64()),
            ("direct_closed_form", pa.float64()),
            ("direct", pa.float64()),
            ("via_mlps_a", pa.float64()),
            ("via_attention_a", pa.float64()),
            ("via_attention_b", pa.float64()),
            ("via_mlps_b", pa.float64()),
            ("interaction", pa.float64()),
        ],
    ),
    {
        "split": _CLAMP_SOURCE["split"],
        "rank": "rank of the head by signed evaluation effect (0 = largest; top 5)",
        "layer": "layer l of the source head",
        "head": "head index h of the source head",
        "e_stored": "its stored effect e_{l,h} (heads/stages/concentration.py heads)",
        "delta_none": "Δ(∅): mean drop with the source patched, nothing clamped (= e_stored)",
        "delta_later_heads": "Δ(later heads): every head of layers > l held clean",
        "delta_mlps": "Δ(MLPs): every MLP from layer l on held clean",
        "delta_both": "Δ(both): later heads and MLPs from l held clean",
        "delta_all_but_source": "every head but the source and every MLP held clean (C13)",
        "direct_closed_form": "drop from adding only δ_i = W_O(z_ref − z) at the final position "
        "to the clean final residual (C13 reference)",
        "direct": "direct = Δ(both); the same in both orders",
        "via_mlps_a": "order A (release the MLP clamp first): Δ(later heads) − direct",
        "via_attention_a": "order A: Δ(∅) − Δ(later heads)",
        "via_attention_b": "order B (release the head clamp first): Δ(MLPs) − direct",
        "via_mlps_b": "order B: Δ(∅) − Δ(MLPs)",
        "interaction": "I = Δ(∅) − Δ(later heads) − Δ(MLPs) + Δ(both) "
        "= via_attention_a − via_attention_b = via_mlps_b − via_mlps_a",
    },
    "top-5 head (by signed evaluation effect) of one (model, seed, task)",
)
CLAMP_LUMPED = ResultTable(
    "clamp_lumped",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("index_shift", pa.int32()),
            ("same_index", pa.bool_()),
            ("n_sources", pa.int32()),
            ("sources", pa.string()),
            ("sum_unclamped", pa.float64()),
            ("sum_clamped", pa.float64()),
            ("reduction", pa.float64()),
        ],
    ),
    {
        "split": _CLAMP_SOURCE["split"],
        "index_shift": "s: for each source (l, h) every head of index (h + s) mod H in layers "
        "> l is held clean (no MLP clamp); s = 0 is the source's own index",
        "same_index": "s = 0 (the lumped lane clamp); other shifts are the control",
        "n_sources": "top heads summed (5)",
        "sources": "the summed sources, L<layer>H<head>, by rank",
        "sum_unclamped": "Σ_i e_∅(i) over the sources",
        "sum_clamped": "Σ_i e_C(i) with the shift's clamp",
        "reduction": "(sum_unclamped − sum_clamped) / sum_unclamped; null if the sum is 0",
    },
    "index shift s = 0..H−1 of one (model, seed, task)",
)

# --- dynamics (docs §13.2–14.5; heads/stages/dynamics.py, heads/stages/scalar_ablation.py) --------
_STEP = {
    "step": "training step of the checkpoint (optimizer updates; 0 = initialisation; the "
    "final step is the run's model.safetensors)",
    "is_final": "the run's final checkpoint",
    "checkpoint_sha256": "SHA-256 of the checkpoint bytes, verified against its manifest",
}
TIMELINE = ResultTable(
    "timeline",
    _schema(
        _RUN,
        [
            ("step", pa.int64()),
            ("is_final", pa.bool_()),
            ("checkpoint_sha256", pa.string()),
            ("tokens_seen", pa.int64()),
            ("val_loss", pa.float64()),
            ("sva_accuracy", pa.float64()),
            ("sva_margin", pa.float64()),
            ("sva_n", pa.int64()),
            ("lambda_score", pa.float64()),
            ("lambda_p", pa.float64()),
            ("lane_split", pa.string()),
            ("chance", pa.float64()),
            ("own_best_fraction", pa.float64()),
            ("own_best_fraction_layer0", pa.float64()),
            ("rho_self_mean", pa.float64()),
            ("idempotence_median", pa.float64()),
        ],
    ),
    {
        **_STEP,
        "tokens_seen": "training tokens seen at the step (manifest)",
        "val_loss": "validation loss in nats at the step (manifest)",
        "sva_accuracy": "SVA clean accuracy, evaluation split (docs §13.2; "
        "heads/stages/evaluate_clean.py)",
        "sva_margin": "SVA mean logit difference, evaluation split",
        "sva_n": "SVA evaluation examples",
        "lambda_score": "Λ of SVA (docs §10.5) on the lane split's patching effects; null when "
        "undefined",
        "lambda_p": "its within-layer permutation p (uncorrected)",
        "lane_split": "split of the Λ effects (discovery)",
        "chance": "1/H: the chance level of Λ and of the own-best fraction",
        "own_best_fraction": "fraction of heads in layers ≥ 1 whose V read space overlaps most "
        "with their own write space (docs §14.1–14.2)",
        "own_best_fraction_layer0": "the same in layer 0",
        "rho_self_mean": "mean ρ_self over heads in layers ≥ 1",
        "idempotence_median": "median scaled idempotence P(T_h) over every head (docs §14.3)",
    },
    "checkpoint (step) of one timeline run (model, seed)",
)
TAU = ResultTable(
    "tau",
    _schema(
        _RUN,
        [
            ("step", pa.int64()),
            ("is_final", pa.bool_()),
            ("checkpoint_sha256", pa.string()),
            ("n_examples", pa.int64()),
            ("n_positions", pa.int64()),
            ("adjacent_cosine_mean", pa.float64()),
            ("adjacent_cosine_min", pa.float64()),
            ("adjacent_cosine_max", pa.float64()),
            ("same_index_cosine", pa.float64()),
            ("different_index_cosine", pa.float64()),
            ("same_index_internal_cosine", pa.float64()),
            ("different_index_internal_cosine", pa.float64()),
            ("lane_index", pa.int64()),
            ("lane_share", pa.float64()),
            ("lane_share_max_other", pa.float64()),
            ("lane_share_chance", pa.float64()),
        ],
    ),
    {
        **_STEP,
        "n_examples": "SVA evaluation examples of the gradient (docs §13.4: 240)",
        "n_positions": "positions of τ_l flattened over examples (Σ prompt lengths)",
        "adjacent_cosine_mean": "mean over l of cos(τ_l, τ_{l+1}), τ_l = ∂ mean LD / ∂ attention "
        "output of layer l, flattened over examples and positions",
        "adjacent_cosine_min": "smallest cos(τ_l, τ_{l+1})",
        "adjacent_cosine_max": "largest cos(τ_l, τ_{l+1})",
        "same_index_cosine": "cos(P_{l,h}τ_l, P_{l',h}τ_{l'}) averaged over layer pairs l < l' "
        "and heads h; P_{l,h} projects onto the write space U^{l,h} position-wise",
        "different_index_cosine": "the same for head pairs h ≠ k (zero by geometry where write "
        "spaces are shared across layers and orthogonal across indices)",
        "same_index_internal_cosine": "cos((W_O^{l,h})ᵀτ_l, (W_O^{l',h})ᵀτ_{l'}) averaged as above",
        "different_index_internal_cosine": "the same with heads h ≠ k",
        "lane_index": "the final SVA lane index: head index of most top-3 SVA heads of the final "
        "checkpoint (lane split)",
        "lane_share": "‖P_{l,h}τ_l‖²/‖τ_l‖² for h = lane_index, averaged over layers",
        "lane_share_max_other": "the largest lane share of any other head index",
        "lane_share_chance": "1/H (the share of an isotropic gradient)",
    },
    "checkpoint (step) of one timeline run (model, seed)",
)
VALUE_GRADIENTS = ResultTable(
    "value_gradients",
    _schema(
        _RUN,
        [
            ("step", pa.int64()),
            ("is_final", pa.bool_()),
            ("checkpoint_sha256", pa.string()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("own_trace", pa.float64()),
            ("max_other_abs_trace", pa.float64()),
            ("own_largest", pa.bool_()),
            ("scalar_trace", pa.float64()),
            ("n_tokens", pa.int64()),
        ],
    ),
    {
        **_STEP,
        "own_trace": "tr(G_h O_h), G_h = ∂L/∂W_V^h of the LM loss (docs §14.4), O_h the write "
        "block the forward pass applies",
        "max_other_abs_trace": "max over the layer's other heads j of |tr(G_h O_j)|",
        "own_largest": "|tr(G_h O_h)| exceeds every |tr(G_h O_j)|, j ≠ h (chance 1/H)",
        "scalar_trace": "tr(V_hᵀ O_h) = tr(W_V^h O_h) at this checkpoint: the sign of the "
        "scalar part of the own-block value map",
        "n_tokens": "validation tokens of the LM loss (sequences × n_ctx)",
    },
    "head (layer, head) at one checkpoint step of one timeline run",
)
SCALAR_ABLATION = ResultTable(
    "scalar_ablation",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("edit", pa.string()),
            ("kind", pa.string()),
            ("draw", pa.int64()),
            ("layers", pa.string()),
            ("n_heads_edited", pa.int64()),
            ("scalar_norm", pa.float64()),
            ("margin_unedited", pa.float64()),
            ("margin", pa.float64()),
            ("drop", pa.float64()),
            ("accuracy", pa.float64()),
            ("n", pa.int64()),
            ("checkpoint_sha256", pa.string()),
            ("haar_seed", pa.int64()),
        ],
    ),
    {
        "split": "split of the logit differences (docs §14.5: evaluation)",
        "edit": "edited checkpoint: scalar (M ← M − sI) or random<k> (M ← M − sR, draw k)",
        "kind": "scalar or random",
        "draw": "Haar draw k of a random control; null for the scalar edit",
        "layers": "edited layers, comma-separated",
        "n_heads_edited": "heads whose own-lane map M (w×w block of W_V^h) was edited",
        "scalar_norm": "Σ over edited heads of ‖sI_w‖_F = |s|·√w (= ‖sR‖_F), s = tr M / w",
        "margin_unedited": "mean logit difference of the unedited checkpoint",
        "margin": "mean logit difference of the edited checkpoint",
        "drop": "margin_unedited − margin (> 0: the edit hurts)",
        "accuracy": "fraction LD > 0 of the edited checkpoint",
        "n": "examples",
        "checkpoint_sha256": "SHA-256 of the edited checkpoint (its manifest names the parent)",
        "haar_seed": "seed of numpy Generator(PCG64) for the random controls (per draw: "
        "Generator([seed, draw]))",
    },
    "(model, seed, task, edit)",
)

# --- the results catalog (heads/stages/catalog.py) ------------------------------------------------
CATALOG = ResultTable(
    "catalog",
    pa.schema(
        [
            ("path", pa.string()),
            ("rule", pa.string()),
            ("template", pa.string()),
            ("wildcards", pa.string()),
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("size_bytes", pa.int64()),
            ("sha256", pa.string()),
            ("manifest", pa.string()),
            ("manifest_sha256", pa.string()),
        ]
    ),
    {
        "path": "the artifact's path from the workflow's working directory: results/<study>/…",
        "rule": "the Snakemake rule that writes it",
        "template": "the rule's output path template it matches (wildcards in braces)",
        "wildcards": "its wildcard values, canonical JSON ({} for a cross-run file)",
        "model": "model wildcard; null for a cross-run file",
        "seed": "seed wildcard; null for a cross-run file",
        "task": "task wildcard; null when the artifact is not per task",
        "size_bytes": "file size in bytes",
        "sha256": "SHA-256 of the file's bytes",
        "manifest": "the checkpoint manifest of the run it came from (per-run artifacts)",
        "manifest_sha256": "SHA-256 of that manifest's bytes; null when it has none",
    },
    "artifact (file) of the study's results folder",
)


# ============================================================================= ablation
# Ablation modes and the block ablation atlas (heads/stages/ablation_atlas.py,
# heads/stages/compare_modes.py; headgeom.heads.analysis.ablation, docs §10.6).
ABLATION_ATLAS = ResultTable(
    "ablation_atlas",
    _schema(
        _RUN,
        [
            ("block", pa.string()),
            ("layer", pa.int32()),
            ("head", pa.int32()),
            ("label", pa.string()),
            ("ablation", pa.string()),
            ("kl", pa.float64()),
            ("top1_base", pa.float64()),
            ("delta_top1", pa.float64()),
            ("retention_sva", pa.float64()),
            ("retention_quote", pa.float64()),
            ("retention_plural", pa.float64()),
            ("size", pa.float64()),
            ("constant_part", pa.float64()),
        ],
    ),
    {
        "block": "written block: attn (the attention block's output hook_attn_out, b_O "
        "included), mlp (hook_mlp_out) or head (one head's z before W_O, so W_O^h z^h)",
        "layer": "layer l of the block, 0-based",
        "head": "head index h for block = head; null for attn and mlp",
        "label": "L<l>.attn, L<l>.mlp or L<l>.H<h>",
        "ablation": "zero (the write deleted) or mean (the write replaced by its mean over the "
        "held-out mean windows, positions t >= 1), at every position",
        "kl": "KL(original ‖ edited) of next-token distributions, nats, averaged over every "
        "input position of the evaluation windows of the validation file",
        "top1_base": "top-1 next-token accuracy of the unedited model on those positions",
        "delta_top1": "edited − unedited top-1 next-token accuracy (negative: the edit hurts)",
        "retention_sva": "share of SVA evaluation prompts the unedited model gets right "
        "(LD > 0) that stay right when edited; null when it gets none right",
        "retention_quote": "the same for Quote",
        "retention_plural": "the same for Plural",
        "size": "RMS of the write ÷ RMS of the residual stream entering the layer (evaluation "
        "windows, positions t >= 1)",
        "constant_part": "‖mean write‖² ÷ mean ‖write‖² over the same positions: 1 = a fixed "
        "bias, about 1/n for n equally frequent orthogonal writes",
    },
    "(block, layer, head, ablation) of one (model, seed)",
)

ABLATION_MODES = ResultTable(
    "ablation_modes",
    _schema(
        _RUN_TASK,
        [
            ("mode", pa.string()),
            ("base_mode", pa.string()),
            ("split", pa.string()),
            ("E", pa.float64()),
            ("N_eff", pa.float64()),
            ("top_head_share", pa.float64()),
            ("N_index", pa.float64()),
            ("N_layer_given_index", pa.float64()),
            ("top_layer", pa.int32()),
            ("top_head", pa.int32()),
            ("lambda_score", pa.float64()),
            ("lambda_p", pa.float64()),
            ("lambda_split", pa.string()),
            ("spearman_vs_base", pa.float64()),
            ("N_eff_ratio", pa.float64()),
            ("E_ratio", pa.float64()),
        ],
    ),
    {
        **{
            k: _STAT_DESCRIPTIONS[k]
            for k in ("E", "N_eff", "top_head_share", "N_index", "N_layer_given_index")
        },
        "mode": "head-patching ablation mode: resample (reference prompt's z, the paper's), "
        "mean (the head's mean z over held-out validation positions) or zero",
        "base_mode": "the study's patching.mode, which the ratios and ρ compare against",
        "split": "split of E, N_eff, shares and ρ (config concentration.split)",
        "top_layer": "layer of the head with the largest |e|",
        "top_head": "head index of that head",
        "lambda_score": "lane score Λ of the lanes split (docs §10.5); null when undefined",
        "lambda_p": "its one-sided permutation p (uncorrected)",
        "lambda_split": "split of Λ (config lanes.split)",
        "spearman_vs_base": "Spearman ρ between this mode's and base_mode's per-head signed "
        "effects e_{l,h} (L·H heads); null when either is constant",
        "N_eff_ratio": "N_eff / N_eff of base_mode",
        "E_ratio": "E / E of base_mode",
    },
    "(model, seed, task, mode)",
)

# --- edges (docs §15.1, §15.4; heads/stages/edges.py, heads/stages/acdc.py) -----------------------
_EDGE = [
    ("writer_layer", pa.int32()), ("writer_head", pa.int32()),
    ("reader_layer", pa.int32()), ("reader_head", pa.int32()), ("read_type", pa.string()),
]  # fmt: skip
_EDGE_DESCRIPTIONS = {
    "split": "split of the examples (docs §15.1: the first 16 SVA validation examples)",
    "writer_layer": "layer l of the writer head i",
    "writer_head": "head index of i",
    "reader_layer": "layer l' > l of the reader head j",
    "reader_head": "head index of j",
    "read_type": "X ∈ {Q, K, V}: the input of j that is patched",
}
EDGES = ResultTable(
    "edges",
    _schema(
        _RUN_TASK_SPLIT,
        _EDGE,
        [
            ("kl", pa.float64()),
            ("kl_max", pa.float64()),
            ("pk", pa.float64()),
            ("same_index", pa.bool_()),
        ],
    ),  # fmt: skip
    {
        **_EDGE_DESCRIPTIONS,
        "kl": "mean over examples of KL(P_clean ‖ P_patched), full vocabulary, final position "
        "(nats), with only j's X-input computed from x + δ_i (docs §15.1)",
        "kl_max": "largest per-example KL of the edge",
        "pk": "weight-space PK(Im W_O^i, R_{X,0}^j) (docs §9.3; block readers: effective W_X)",
        "same_index": "writer and reader have the same head index",
    },
    "edge (writer head → reader head's X-input), per (model, seed, task)",
)
EDGE_SUMMARY = ResultTable(
    "edge_summary",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("n_examples", pa.int64()),
            ("n_edges", pa.int64()),
            ("pooled_spearman", pa.float64()),
            ("pooled_p", pa.float64()),
            ("median_within_Q", pa.float64()),
            ("median_within_K", pa.float64()),
            ("median_within_V", pa.float64()),
            ("n_groups_Q", pa.int64()),
            ("n_groups_K", pa.int64()),
            ("n_groups_V", pa.int64()),
            ("pk_min", pa.float64()),
            ("pk_max", pa.float64()),
            ("zero_pk_share", pa.float64()),
        ],
    ),  # fmt: skip
    {
        "split": _EDGE_DESCRIPTIONS["split"],
        "n_examples": "examples the KL is averaged over",
        "n_edges": "edges measured (3·H²·L(L−1)/2)",
        "pooled_spearman": "Spearman ρ(PK, KL) over every edge (Table 7 'Pooled')",
        "pooled_p": "two-sided p of the pooled ρ",
        "median_within_Q": "median over reader heads j of Spearman ρ(PK, KL) over the Q edges "
        "into j (groups with constant PK or KL left out)",
        "median_within_K": "the same for K",
        "median_within_V": "the same for V",
        "n_groups_Q": "reader groups with a defined ρ (Q)",
        "n_groups_K": "reader groups with a defined ρ (K)",
        "n_groups_V": "reader groups with a defined ρ (V)",
        "pk_min": "smallest edge PK",
        "pk_max": "largest edge PK",
        "zero_pk_share": "share of edges with PK < 1e-12 (structural zeros, e.g. all-common-axis)",
    },
    "(model, seed, task)",
)
ACDC = ResultTable(
    "acdc",
    _schema(
        _RUN_TASK_SPLIT,
        [
            ("source_kind", pa.string()),
            ("source_layer", pa.int32()),
            ("source_head", pa.int32()),
            ("target_kind", pa.string()),
            ("target_layer", pa.int32()),
            ("target_head", pa.int32()),
            ("kl_if_removed", pa.float64()),
            ("kl_before", pa.float64()),
        ],
    ),  # fmt: skip
    {
        "split": "split of the examples (docs §15.4: 16 SVA validation examples)",
        "source_kind": "embed (token + position), head (its W_O z) or mlp (its output)",
        "source_layer": "layer of the source (−1 for embed)",
        "source_head": "head index of a head source (−1 otherwise)",
        "target_kind": "q, k, v (a head's input), mlp (an MLP's input) or logits",
        "target_layer": "layer of the target (−1 for logits)",
        "target_head": "head index of a q/k/v target (−1 otherwise)",
        "kl_if_removed": "circuit KL(P_clean ‖ P_circuit) had the edge been removed when ACDC "
        "visited it",
        "kl_before": "circuit KL at that moment; kept because the rise is ≥ the threshold",
    },
    "edge of the ACDC circuit (after pruning nodes that no longer reach the logits)",
)


# --- coordinate concentration (docs §15.2; heads/stages/coordinates.py) ---------------------------
COORDINATES = ResultTable(
    "coordinates",
    _schema(
        _RUN_TASK,
        [
            ("site", pa.string()),
            ("best_layer", pa.int64()),
            ("best_head", pa.int64()),
            ("best_effect", pa.float64()),
            ("n_validation", pa.int64()),
            ("n_evaluation", pa.int64()),
            ("n_directions", pa.int64()),
            ("k", pa.int64()),
            ("share_evaluation", pa.float64()),
            ("share_in_sample", pa.float64()),
            ("share_evaluation_in_sample", pa.float64()),
            ("positive_sum_evaluation", pa.float64()),
            ("total_evaluation", pa.float64()),
            ("top_directions", pa.string()),
            ("null_mean", pa.float64()),
            ("null_p95", pa.float64()),
            ("null_max", pa.float64()),
            ("null_fraction_at_least", pa.float64()),
            ("null_p_value", pa.float64()),
            ("beats_every_random_set", pa.bool_()),
            ("null_strata", pa.string()),
            ("null_incl_selected_mean", pa.float64()),
            ("null_incl_selected_max", pa.float64()),
            ("null_incl_selected_p_value", pa.float64()),
            ("n_random_sets", pa.int64()),
            ("null_seed", pa.int64()),
            ("rotation_seed", pa.int64()),
        ],
    ),  # fmt: skip
    {
        "site": "after_wo: one residual coordinate c of layer l*'s attention output (after W_O, "
        "before the residual add) set to its reference value; before_wo: coordinate k of head "
        "h's z (H·d directions); before_wo_rotated: direction R_h e_k of head h's z, R_h a "
        "Haar-random orthogonal d×d matrix per head (docs §15.2)",
        "best_layer": "l*: layer of the task's top head by signed evaluation effect",
        "best_head": "that head",
        "best_effect": "its evaluation effect e (mean logit-difference drop)",
        "n_validation": "validation examples (directions are selected on them)",
        "n_evaluation": "evaluation examples (the share is reported on them)",
        "n_directions": "directions of the site: D (after_wo) or H·d (before_wo*)",
        "k": "size of the selected set (10)",
        "share_evaluation": "Σ of the evaluation mean drops of the k directions with the largest "
        "validation mean drop / Σ of all positive evaluation mean drops (the reported share)",
        "share_in_sample": "top-k share on validation: the k largest validation drops / Σ positive",
        "share_evaluation_in_sample": "top-k share on evaluation selected on evaluation",
        "positive_sum_evaluation": "Σ of the positive evaluation mean drops (the denominator)",
        "total_evaluation": "Σ of all evaluation mean drops (signed)",
        "top_directions": "the k selected directions, comma-separated (c, or j = h·d + k)",
        "null_mean": "mean evaluation share of the magnitude-matched random sets (drawn "
        "without the selected directions; see n_random_sets)",
        "null_p95": "their 95th percentile",
        "null_max": "their largest share",
        "null_fraction_at_least": "#{random sets with share ≥ share_evaluation} / n_random_sets "
        "(ties within 100·eps relative count as ≥)",
        "null_p_value": "Monte Carlo p-value (1 + #{random sets with share ≥ share_evaluation}) "
        "/ (1 + n_random_sets) (Phipson & Smyth 2010); smallest possible 1/(1 + n_random_sets)",
        "beats_every_random_set": "share_evaluation > every random set's share (beyond the tie "
        "tolerance), i.e. null_p_value = 1/(1 + n_random_sets)",
        "null_strata": "the magnitude strata the random sets are matched on: decile indices "
        "(0 smallest), comma-separated, '+' joining deciles merged because a decile had fewer "
        "non-selected directions than the selected set has in it (docs §15.2); 'none: …' where "
        "the site has fewer non-selected directions than selected ones (no null: its columns "
        "NaN, beats_every_random_set false)",
        "null_incl_selected_mean": "earlier draw, kept for comparison: mean share of random "
        "sets drawn from the whole decile, the selected directions included (biased upward; "
        "a set can be the selected set itself)",
        "null_incl_selected_max": "that draw's largest share",
        "null_incl_selected_p_value": "(1 + #{sets of that draw with share ≥ "
        "share_evaluation}) / (1 + n_random_sets)",
        "n_random_sets": "random sets of k directions, each with the selected set's count of "
        "directions per stratum (null_strata) of mean |patch difference| on validation, drawn "
        "uniformly without replacement from the stratum's directions outside the selected set",
        "null_seed": "seed of the numpy Generator(PCG64) drawing the random sets (each draw, "
        "with and without the selected directions, from a fresh generator of this seed)",
        "rotation_seed": "seed of the Generator drawing the Haar rotations (before_wo_rotated)",
    },
    "run, task and site",
)

# --------------------------------------------------------------- coordinate directions (docs §15.2)
COORDINATE_DIRECTIONS = ResultTable(
    "coordinate_directions",
    _schema(
        _RUN_TASK,
        [
            ("site", pa.string()),
            ("direction", pa.int64()),
            ("head", pa.int64()),
            ("index_in_head", pa.int64()),
            ("drop_validation", pa.float64()),
            ("drop_evaluation", pa.float64()),
            ("magnitude_validation", pa.float64()),
            ("magnitude_decile", pa.int64()),
            ("rank_validation", pa.int64()),
            ("selected", pa.bool_()),
        ],
    ),  # fmt: skip
    {
        "site": "as in coordinates.parquet: after_wo, before_wo or before_wo_rotated",
        "direction": "c (after_wo: residual coordinate 0..D−1) or j = h·d + k (before_wo*)",
        "head": "h of a before-W_O direction (null after W_O)",
        "index_in_head": "k of a before-W_O direction (null after W_O)",
        "drop_validation": "mean logit-difference drop LD_clean − LD_patched over validation "
        "examples when only this direction takes its reference value (final position, l*)",
        "drop_evaluation": "the same over the evaluation examples",
        "magnitude_validation": "mean |patch difference| on validation (|a_c^ref − a_c| after "
        "W_O, |r^T(z^ref − z)| before): what the random sets are matched on",
        "magnitude_decile": "its decile among the site's directions (0 smallest .. 9)",
        "rank_validation": "rank by drop_validation (1 = largest; ties by direction)",
        "selected": "in the selected set (rank_validation ≤ k = 10) whose evaluation share "
        "coordinates.parquet reports",
    },
    "run, task, site and direction",
)


# ----------------------------------------------------------------------------- checks (§18)
CHECKS = ResultTable(
    "checks",
    pa.schema(
        [
            ("check", pa.string()),
            ("part", pa.string()),
            ("title", pa.string()),
            ("section", pa.string()),
            ("rule", pa.string()),
            ("path", pa.string()),
            ("scope", pa.string()),
            ("model", pa.string()),
            ("seed", pa.int64()),
            ("task", pa.string()),
            ("kind", pa.string()),
            ("residual", pa.float64()),
            ("tolerance", pa.float64()),
            ("passed", pa.bool_()),
            ("enforced", pa.bool_()),
            ("note", pa.string()),
        ]
    ),
    {
        "check": "C1–C16 of docs §18, designed-pk (§9.4) or loss-order (§7.3); "
        "headgeom.checks.CATALOG",
        "part": "which part of a check with several (C3: null closed form, rejection 1% rule, "
        "range paper interval; C16: null all 9 models, twelve-head); null for one-part checks",
        "title": "what the check compares",
        "section": "the docs/methods.md section that defines it",
        "rule": "the Snakemake rule that ran it (checks: computed by this rule from numbers)",
        "path": "the artifact whose metadata logs it (null: computed by rule checks)",
        "scope": "what inside the artifact the row covers (a basis family; a corpus), or null",
        "model": "model of the run the artifact belongs to; null for a study-wide artifact",
        "seed": "seed of that run; null for a study-wide artifact",
        "task": "task of the artifact; null when it is not per task",
        "kind": "abs: max absolute residual; rel: max relative residual; count: number of "
        "mismatching items (exact checks)",
        "residual": "the logged residual; null where the check does not apply to the artifact",
        "tolerance": "the check passes when residual ≤ tolerance",
        "passed": "residual ≤ tolerance; null where the check does not apply",
        "enforced": "a failure stops the producing job; false where it is only reported "
        "(designed-pk and loss-order below the paper's size)",
        "note": "what the residual covers, or why the check does not apply",
    },
    "(check and part, artifact, scope)",
)


#: Every result table of this module by name (docs/results.md's column tables and the tests
#: walk it), gathered once from the definitions above.
TABLES: Mapping[str, ResultTable] = MappingProxyType(
    {v.name: v for v in list(globals().values()) if isinstance(v, ResultTable)}
)
