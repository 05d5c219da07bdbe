"""The SA-MoE results contract (docs/samoe.md): every Parquet the SA-MoE workflow writes, as
:class:`headgeom.results.ResultTable` (explicit schema, a description of every column stored
in the file, what one row is). Token files and the vocabulary are the workspace's own
``results.TOKENS`` and ``results.VOCAB``."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd
import pyarrow as pa

from headgeom.io import read_table
from headgeom.results import ResultTable

_RUN = [("family", pa.string()), ("variant", pa.string()), ("seed", pa.int64())]
_RUN_DESCRIPTIONS = {
    "family": "dense source family (config families key; the toy study's is `toy`)",
    "variant": "architecture: ordinary (Ordinary MoE), latest (latest-write-only), persistent",
    "seed": "training seed of the upcycled run (experts byte-identical across its variants)",
}
_ROLE = "pool role: construction, calibration or final (SAMOE §3.2)"
_DOMAIN = "domain of the sequence: prose, code or math"


def _table(name: str, fields: list, descriptions: dict, one_row_per: str) -> ResultTable:
    names = {f[0] for f in fields}
    run = {k: v for k, v in _RUN_DESCRIPTIONS.items() if k in names}
    return ResultTable(name, pa.schema(fields), {**run, **descriptions}, one_row_per)


POOLS = _table(
    "samoe_pools",
    [("role", pa.string()), ("domain", pa.string()), ("seq_id", pa.string()),
     ("intervention", pa.bool_()), ("tokens", pa.list_(pa.int32()))],
    {"role": _ROLE, "domain": _DOMAIN,
     "seq_id": "sequence id <domain>-<NNNN>, stable across variants (paired comparisons)",
     "intervention": "in the fixed intervention subset (final pool: first per domain in "
                     "SHA-256 order of id)",
     "tokens": "GPT-2 ids of the sequence (T tokens, documents EOS-joined)"},
    "held-out pool sequence",
)  # fmt: skip
DOWNSTREAM = _table(
    "samoe_downstream",
    [("task", pa.string()), ("example_id", pa.int32()), ("context", pa.list_(pa.int32())),
     ("choices", pa.list_(pa.list_(pa.int32()))), ("choice_texts", pa.list_(pa.string())),
     ("label", pa.int32())],
    {"task": "toy downstream task: sva, quote, plural or arith (SAMOE §11)",
     "example_id": "example id within the task (0-based)",
     "context": "GPT-2 ids of the context",
     "choices": "GPT-2 ids of each choice's continuation",
     "choice_texts": "text of each choice (acc_norm divides by its character length)",
     "label": "index of the correct choice"},
    "downstream multiple-choice example",
)  # fmt: skip
DENSE_LOG = _table(
    "samoe_dense_log",
    [("step", pa.int64()), ("loss", pa.float64()), ("lr", pa.float64()),
     ("val_loss", pa.float64())],
    {"step": "optimizer update (1-based)", "loss": "training cross-entropy of the batch (nats)",
     "lr": "learning rate of the update",
     "val_loss": "validation cross-entropy (nats) where evaluated, else null"},
    "optimizer update of the dense source",
)  # fmt: skip
CPT_LOG = _table(
    "samoe_train_log",
    [*_RUN, ("step", pa.int64()), ("loss", pa.float64()), ("load_balance", pa.float64()),
     ("z_loss", pa.float64()), ("total_loss", pa.float64()), ("grad_norm", pa.float64()),
     ("lr_base", pa.float64()), ("lr_shared", pa.float64()), ("lr_router_write", pa.float64())],
    {"step": "optimizer update (1-based)",
     "loss": "next-token cross-entropy of the batch (nats)",
     "load_balance": "layer-mean load-balance loss (SAMOE §5.3)",
     "z_loss": "layer-mean router z-loss (SAMOE §5.3)",
     "total_loss": "loss + coefficients × auxiliary losses (what is minimised)",
     "grad_norm": "global gradient norm before clipping",
     "lr_base": "LR of the base group: routed experts, attention, embeddings, norms (SAMOE §7)",
     "lr_shared": "LR of the shared expert (0 while frozen)",
     "lr_router_write": "LR of the routers and write heads"},
    "optimizer update of continued pretraining",
)  # fmt: skip
COUNTS = _table(
    "samoe_counts",
    [("family", pa.string()), ("variant", pa.string()), ("total_params", pa.int64()),
     ("active_params", pa.int64()), ("flops_per_token", pa.int64()),
     ("active_rel", pa.float64()), ("flops_rel", pa.float64()),
     ("trace_writes_mib", pa.float64()), ("trace_state_mib", pa.float64()),
     ("trace_writes_top3_mib", pa.float64())],
    {"total_params": "every parameter (tied embedding once)",
     "active_params": "non-routed + shared + top_k routed experts per layer",
     "flops_per_token": "analytical forward FLOPs per token (SAMOE §8)",
     "active_rel": "active parameters relative to the Ordinary MoE, minus 1",
     "flops_rel": "FLOPs per token relative to the Ordinary MoE, minus 1",
     "trace_writes_mib": "bf16 MiB of every realised write of one sequence (N·T·r)",
     "trace_state_mib": "bf16 MiB of the live state of one sequence (T·r)",
     "trace_writes_top3_mib": "writes plus the clean Top-3 ids and logits (N·T·3·4 bytes)"},
    "variant of a family",
)  # fmt: skip
QUALITY = _table(
    "samoe_quality",
    [*_RUN, ("metric", pa.string()), ("subset", pa.string()), ("value", pa.float64()),
     ("n", pa.int64())],
    {"metric": "ppl (final pool perplexity), acc, acc_norm, or primary (the task's reported "
               "metric; macro = their mean)",
     "subset": "all / prose / code / math for ppl; the task (or macro) for accuracies",
     "value": "perplexity, or accuracy in [0, 1]",
     "n": "predicted positions (ppl) or examples"},
    "quality metric of one run",
)  # fmt: skip
#: The paper's downstream suite of one run through lm-evaluation-harness (samoe_harness).
HARNESS = _table(
    "samoe_harness",
    [*_RUN, ("task", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
     ("stderr", pa.float64()), ("n", pa.int64()), ("primary", pa.bool_()),
     ("task_version", pa.string()), ("task_config_sha256", pa.string()),
     ("harness_version", pa.string()), ("harness_commit", pa.string())],
    {"task": "lm-eval task: hellaswag, arc_easy, piqa or winogrande (SAMOE §11)",
     "metric": "acc (argmax of the summed log-likelihood) or acc_norm (divided by the "
               "choice's character length), as the harness reports them",
     "value": "accuracy in [0, 1] over the task's examples (zero-shot)",
     "stderr": "the harness's standard error of the accuracy (null where it gives none)",
     "n": "examples scored (the harness's effective sample count)",
     "primary": "the task's reported metric (acc_norm; WinoGrande acc); macro = their mean",
     "task_version": "the task config's metadata version",
     "task_config_sha256": "SHA-256 of the task's full config as the harness ran it "
                           "(canonical JSON)",
     "harness_version": "installed lm-eval version",
     "harness_commit": "the harness's git commit where installed from git (the pin), else "
                       "null (a registry release)"},
    "metric of one lm-eval task for one run",
)  # fmt: skip
TARGETS = _table(
    "samoe_targets",
    [("family", pa.string()), ("seq_index", pa.int64()), ("seq_id", pa.string()),
     ("slot", pa.int64()), ("layer", pa.int64()), ("position", pa.int64())],
    {"seq_index": "row of the sequence in the intervention subset (file order)",
     "seq_id": "intervention sequence id",
     "slot": "target slot j of the sequence (its layer is the family's target_layers[j])",
     "layer": "target router layer L (0-based MoE layer)",
     "position": "token position t (first in SHA-256 order of family|seq_id|slot|t among "
                 "T/8 ≤ t < T − 1, not EOS, distinct within a sequence)"},
    "audited target decision (identical for every variant and seed; SAMOE §14.1)",
)  # fmt: skip
STATE_GEOMETRY = _table(
    "samoe_state_geometry",
    [*_RUN, ("layer", pa.int64()), ("mean_norm", pa.float64()), ("clamp_fraction", pa.float64())],
    {"layer": "router layer l whose input state s_l is measured (0-based; s_0 = 0)",
     "mean_norm": "mean ‖s_l‖₂ over every token of the final pool",
     "clamp_fraction": "fraction of the coordinates of s_l at the clamp (|s| ≥ c)"},
    "state entering one router of a state run",
)  # fmt: skip
LOCAL_SUPPRESSION = _table(
    "samoe_local_suppression",
    [*_RUN, ("lam", pa.float64()), ("layer0", pa.bool_()), ("set_change_rate", pa.float64()),
     ("n_decisions", pa.int64())],
    {"lam": "λ of z(λ) = W^x x + λ W^s s at one router, clean x and s fixed (SAMOE E5)",
     "layer0": "whether layer 0 (s_0 = 0, never changed) is counted",
     "set_change_rate": "fraction of routing decisions of the final pool whose Top-2 set "
                        "differs from that at λ = 1",
     "n_decisions": "routing decisions counted (sequences × positions × layers)"},
    "λ of one state run",
)  # fmt: skip
HISTORY = _table(
    "samoe_history",
    [*_RUN, ("seq_id", pa.string()), ("slot", pa.int64()), ("layer", pa.int64()),
     ("position", pa.int64()), ("e2", pa.int64()), ("e3", pa.int64()), ("margin", pa.float64()),
     ("hidden_term", pa.float64()), ("state_term", pa.float64()), ("mass", pa.float64()),
     ("non_recent", pa.float64()), ("ess", pa.float64()), ("max_share", pa.float64()),
     ("contributions", pa.list_(pa.float64()))],
    {"seq_id": "intervention sequence id", "slot": "target slot", "layer": "target layer L",
     "position": "target position t",
     "e2": "clean expert ranked 2 (selected) at the target",
     "e3": "clean expert ranked 3 (best excluded)",
     "margin": "clean boundary margin z_L[e2] − z_L[e3] (≥ 0)",
     "hidden_term": "(W^x_L[e2] − W^x_L[e3])ᵀ x_L: the hidden stream's part of the margin",
     "state_term": "ωᵀ s_L = Σ_l c_{l→L}: the state's part (signed state term)",
     "mass": "A = Σ_l |c_{l→L}| (null where A = 0: no history metrics)",
     "non_recent": "1 − |c_{L−1→L}| / A: the share of attribution mass before the latest "
                   "write (LWO: 0 by construction)",
     "ess": "effective source support 1 / Σ_l p_l², p_l = |c_l| / A",
     "max_share": "largest source share max_l p_l",
     "contributions": "attribution to sources l = 0 … L − 1: Persistent the ledger c_{l→L} "
                      "(SAMOE E3; float32 algebra, stored as float64), LWO the structural one "
                      "(all of ωᵀ s_L to L − 1)"},
    "audited target of one state run (its routing ledger)",
)  # fmt: skip

HISTORY_POOL = _table(
    "samoe_history_pool",
    [*_RUN, ("layer", pa.int64()), ("n_decisions", pa.int64()), ("n_kept", pa.int64()),
     ("non_recent", pa.float64()), ("ess", pa.float64()), ("max_share", pa.float64()),
     ("signed_state_term", pa.float64())],
    {"layer": "target router layer L ≥ 1 (every decision of the final pool at L)",
     "n_decisions": "routing decisions at L (final-pool sequences × positions)",
     "n_kept": "decisions with attribution mass A > 0 (the history metrics' denominator)",
     "non_recent": "mean over the kept decisions of 1 − |c_{L−1→L}| / A (LWO: 0 by "
                   "construction)",
     "ess": "mean effective source support 1 / Σ_l p_l² over the kept decisions",
     "max_share": "mean largest source share max_l p_l over the kept decisions",
     "signed_state_term": "mean signed state term ωᵀ s_L = Σ_l c_{l→L} over every decision"},
    "target layer of one state run: SAMOE §10.3's supplement over every decision",
)  # fmt: skip

TABLES = {t.name: t for t in (POOLS, DOWNSTREAM, DENSE_LOG, CPT_LOG, COUNTS,
                              QUALITY, HARNESS, TARGETS, STATE_GEOMETRY, LOCAL_SUPPRESSION,
                              HISTORY, HISTORY_POOL)}  # fmt: skip

# --------------------------------------------------------------------------- statistics
_STAT = [("mean", pa.float64()), ("low", pa.float64()), ("high", pa.float64()),
         ("per_seed", pa.list_(pa.float64())), ("n_seeds", pa.int64())]  # fmt: skip
_STAT_DESCRIPTIONS = {
    "quantity": "what is measured (docs/samoe.md §Statistics lists every quantity)",
    "key": "the quantity's subset: a domain, task, λ or layer; empty when it has none",
    "mean": "mean over the training seeds",
    "low": "95% Student-t interval over the seeds, lower end (t_{0.975, n−1} s / √n)",
    "high": "95% Student-t interval over the seeds, upper end",
    "per_seed": "every seed's value, in config seed order",
    "n_seeds": "seeds averaged (the replication unit; SAMOE §17)",
}
SEED_MEANS = _table(
    "samoe_seed_means",
    [("family", pa.string()), ("variant", pa.string()), ("quantity", pa.string()),
     ("key", pa.string()), *_STAT],
    _STAT_DESCRIPTIONS,
    "quantity of one variant, averaged over the seeds",
)  # fmt: skip
CONTRASTS = _table(
    "samoe_contrasts",
    [("family", pa.string()), ("quantity", pa.string()), ("key", pa.string()),
     ("variant", pa.string()), ("reference", pa.string()), ("scale", pa.string()), *_STAT,
     ("all_positive", pa.bool_()), ("bound", pa.float64()), ("decision", pa.string())],
    {**_STAT_DESCRIPTIONS,
     "variant": "the variant v of d_s = f(v, s) − f(reference, s)",
     "reference": "the reference variant (same seed)",
     "scale": "difference (arithmetic), percentage_points (accuracy × 100), or log_ratio "
              "(mean, interval and per_seed back-transformed to relative changes exp(d) − 1)",
     "mean": "mean of the paired per-seed differences",
     "all_positive": "every seed's difference is > 0 (replication evidence, not a test)",
     "bound": "non-inferiority bound of a quality contrast (+0.01 relative PPL, −1 pp "
              "macro), else null",
     "decision": "supported / not supported / inconclusive for a quality contrast, else null"},
    "paired seed contrast of one quantity",
)  # fmt: skip
TABLES |= {t.name: t for t in (SEED_MEANS, CONTRASTS)}
COMPARISON = _table(
    "samoe_comparison",
    [("family", pa.string()), ("quantity", pa.string()), ("paper_smollm2", pa.string()),
     ("paper_gemma", pa.string()), ("ours", pa.string()), ("expected_direction", pa.string()),
     ("agrees", pa.bool_()), ("note", pa.string())],
    {"quantity": "compared quantity (SAMOE §22)",
     "paper_smollm2": "the paper's SmolLM2 value as printed",
     "paper_gemma": "the paper's Gemma value as printed",
     "ours": "this study's value (three-seed mean [95% t-CI] where the paper gives one)",
     "expected_direction": "what the comparison checks: toy magnitudes are not expected to "
                           "match, only the direction (SAMOE §22)",
     "agrees": "whether this study shows that direction; null for descriptive rows",
     "note": "why a row differs, where known"},
    "compared quantity of one family",
)  # fmt: skip
TABLES |= {COMPARISON.name: COMPARISON}
PROBES = _table(
    "samoe_probes",
    [*_RUN, ("source", pa.int64()), ("target", pa.int64()), ("horizon", pa.int64()),
     ("long_horizon", pa.bool_()), ("representation", pa.string()), ("budget", pa.int64()),
     ("accuracy", pa.float64()), ("pooled_accuracy", pa.float64()), ("n_eval", pa.int64()),
     ("transition_share", pa.float64()), ("C", pa.float64()), ("iterations", pa.int64())],
    {"source": "source router layer (the probe reads what it sees)",
     "target": "target router layer (the probe predicts its clean Top-1 expert)",
     "horizon": "target − source (MoE layers)",
     "long_horizon": "one of the long-horizon pairs (the persistence endpoint, SAMOE §13.4)",
     "representation": "native (the state s_src), full_linear (x_src, d dims), hidden_r "
                       "(supervised r-dim subspace of x_src), pca_r, random_r (mean over the "
                       "random projections), mlp_r (one r-unit ReLU bottleneck)",
     "budget": "training examples (nested subsets of the construction pool's positions)",
     "accuracy": "transition-only accuracy on the final pool, per sequence then an equal-"
                 "weight mean over sequences (source-cluster accuracy)",
     "pooled_accuracy": "transition-only accuracy pooled over every final example",
     "n_eval": "final-pool examples that pass the transition mask",
     "transition_share": "share of final-pool examples whose source and target Top-2 sets "
                         "differ (the mask E6)",
     "C": "selected inverse L2 strength (calibration accuracy); null for the MLP",
     "iterations": "L-BFGS iterations of the final fit (MLP: 0)"},
    "probe of one run, pair, representation and budget",
)  # fmt: skip
TABLES |= {PROBES.name: PROBES}
INTERVENTIONS = _table(
    "samoe_interventions",
    [*_RUN, ("seq_id", pa.string()), ("slot", pa.int64()), ("layer", pa.int64()),
     ("position", pa.int64()), ("source", pa.int64()), ("margin_change", pa.float64()),
     ("abs_margin_change", pa.float64()), ("jaccard_downstream", pa.float64()),
     ("jaccard_after_target", pa.float64()), ("output_kl", pa.float64()),
     ("ledger", pa.float64()), ("norm", pa.float64()), ("gradient", pa.float64()),
     ("role", pa.string())],
    {"seq_id": "intervention sequence id", "slot": "target slot", "layer": "target layer L",
     "position": "target position t (the suppressed token)",
     "source": "source layer l < L whose write is suppressed (s_{l+1} ← s_l at t, SAMOE E7)",
     "margin_change": "Δm: intervened − clean z_L[e2] − z_L[e3] on the clean (e2, e3)",
     "abs_margin_change": "|Δm|: the exhaustive effect E_{il} of the rankings",
     "jaccard_downstream": "mean Jaccard distance of clean vs intervened Top-2 sets at t over "
                           "layers l + 1 … N − 1",
     "jaccard_after_target": "the same over layers > L (null when L is the last layer)",
     "output_kl": "KL(p_clean ‖ p_int) of the next-token distribution at t (nats)",
     "ledger": "ledger score |c_{l→L}| (LWO: its structural attribution, all on L − 1)",
     "norm": "‖Δ_l‖₂ at t (largest write norm)",
     "gradient": "gradient×write |∂m/∂α_l| at α = 1 (one autograd call per target)",
     "role": "how the source was chosen besides the exhaustive grid: selected (the ledger's "
             "top for P, L − 1 for LWO), random / norm / distance (matched controls), or "
             "empty; a source can hold one role per target"},
    "suppressed (target, source) of one state run: every eligible source of every target",
)  # fmt: skip
RANKINGS = _table(
    "samoe_rankings",
    [*_RUN, ("method", pa.string()), ("metric", pa.string()), ("value", pa.float64()),
     ("low", pa.float64()), ("high", pa.float64()), ("n_targets", pa.int64())],
    {"method": "ranking: ledger, norm, recency, gradient or random (SAMOE §14.4)",
     "metric": "spearman (within-target, omitted when constant), top_source_accuracy, regret "
               "(normalised oracle regret; targets with max E = 0 dropped)",
     "value": "mean over targets, each sequence's targets averaged first",
     "low": "2.5th percentile of the paired sequence bootstrap (shared resamples)",
     "high": "97.5th percentile of the paired sequence bootstrap",
     "n_targets": "targets the metric is defined on"},
    "ranking metric of one method in one run (within-checkpoint interval)",
)  # fmt: skip
TABLES |= {t.name: t for t in (INTERVENTIONS, RANKINGS)}
LI = _table(
    "samoe_li",
    [*_RUN, ("seq_id", pa.string()), ("slot", pa.int64()), ("layer", pa.int64()),
     ("position", pa.int64()), ("component_layer", pa.int64()), ("component", pa.string()),
     ("li_variance", pa.float64()), ("li_boundary", pa.float64()), ("norm", pa.float64()),
     ("gradient", pa.float64()), ("effect", pa.float64())],
    {"seq_id": "intervention sequence id", "slot": "target slot", "layer": "target layer L",
     "position": "target position t",
     "component_layer": "layer l < L of the residual component",
     "component": "attention, shared (expert) or routed (gated routed experts) output",
     "li_variance": "variance over the experts of α_j = W^x_L φ(v_j) (the reference criterion)",
     "li_boundary": "|α_j[e2] − α_j[e3]|: the component's part of the Top-2 boundary margin",
     "norm": "‖v_j‖₂ at t", "gradient": "gradient×component |∇_{v_j} m · v_j|",
     "effect": "oracle |Δm|: v_j removed at t, the full forward rerun, on the clean (e2, e3)"},
    "residual component of one audited target of an Ordinary MoE (SAMOE §15)",
)  # fmt: skip
TABLES |= {LI.name: LI}
AUDIT_COST = _table(
    "samoe_audit_cost",
    [*_RUN, ("phase", pa.string()), ("wall_s", pa.float64()), ("passes", pa.int64()),
     ("n_targets", pa.int64()), ("n_objects", pa.int64()), ("retained_bytes", pa.int64())],
    {"phase": "capture (one clean forward keeping the audit objects), attribution (ledger, "
              "structural or Li scores from the captured data), gradient (one autograd call "
              "per target), plain_forward (the same batch through the model with no hook: "
              "the reference of the audit's overhead)",
     "wall_s": "median wall time of the phase over the repeats (seconds, this machine)",
     "passes": "forward or backward passes the phase runs",
     "n_targets": "audited targets of the pilot",
     "n_objects": "source interventions (state variants: Σ_i L_i) or residual components "
                  "(Ordinary: 3 Σ_i L_i) the phase covers",
     "retained_bytes": "bytes of what the phase keeps (float32)"},
    "phase of the audit-cost pilot of one variant (SAMOE §16; descriptive)",
)  # fmt: skip
RUNTIME = _table(
    "samoe_runtime",
    [*_RUN, ("measurement", pa.string()), ("batch", pa.int64()), ("median_s", pa.float64()),
     ("repeats", pa.int64())],
    {"measurement": "forward (full-length, no grad) or forward_backward (no optimizer step)",
     "batch": "sequences per pass", "median_s": "median wall time (seconds, this machine)",
     "repeats": "timed repeats after one warm-up"},
    "runtime measurement of one variant (SAMOE §16; descriptive, FLOPs are the cost model)",
)  # fmt: skip
TABLES |= {t.name: t for t in (AUDIT_COST, RUNTIME)}


def read_runs(paths: Sequence[str | os.PathLike], table: ResultTable) -> pd.DataFrame:
    """The rows of ``table`` from every run's file, one frame (empty, with the table's
    columns, when there is no file: a study without that analysis)."""
    frames = [read_table(p, table.names).to_pandas() for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=table.names)
