"""Cost model of the SA-MoE workflow: the shared machinery's (``headgeom.cost``: per
rule the work of one job in units that config counts set, fitted from a finished run's
Snakemake ``benchmark:`` files, projected to another study), with units that carry the
model's size, because the toy and the paper differ in shape as well as in counts (the
head-geometry rehearsal has the paper's shapes):

    seconds(target) = s_max / units(measured) · units(target)
    memory(target)  = rss_max + (P(target) − P(measured)) · 4 B · copies

with P the largest family's total parameters (SAMOE §8 counts) and ``copies`` the float32
copies a job holds (weights; + gradients where it differentiates; + two AdamW moments when it
trains). Proportional time from a toy of 2.5M parameters over-estimates a paper job on the
same CPU (small matrices run far below the matmul rate), never under-estimates it; the
activations beyond the toy's measured peak are not modelled (the margin covers the paper's
sequence batches). Forward FLOPs per token are SAMOE §8's (``counts.flops_per_token``) of
the largest family and the persistent variant; T is the family's sequence length.

On GPUs in the paper study: continued pretraining, timed by the FLOP model
(:data:`GPU_TIMED`), and the analyses that load a checkpoint (:data:`GPU_BOUNDED`: their
``--device``), whose requests must still cover their CPU projection: no GPU rate of theirs
is measured, and a job's work moved to the GPU takes no longer than on one core of this CPU
(the argument of ``headgeom.heads.cost`` for the head-geometry GPU rules). Their host memory
keeps the CPU projection too (weights are loaded on the host before they move), an upper bound.

    python -m headgeom.samoe.cost report benchmarks/samoe_smollm2_cpu.tsv \\
        --configfile config/samoe-smollm2.yaml --target config/samoe-paper.yaml   # the requests'
    python -m headgeom.samoe.cost report benchmarks/samoe_demo_cpu.tsv \\
        --configfile config/samoe.yaml --target config/samoe-paper.yaml           # the toy's
    python -m headgeom.samoe.cost summary results/samoe-demo --configfile config/samoe.yaml \\
        --out benchmarks/samoe_demo_cpu.tsv --note "2-core ..., fresh clone"
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from headgeom import config_layers
from headgeom import cost as shared
from headgeom.samoe import counts as C
from headgeom.samoe.study import SAMoEStudy
from headgeom.studies import from_config

#: The toy's compact vocabulary is known only once its corpus is built; the counts take this
#: size (config/samoe.yaml's corpus: 918 tokens; the LM head is ~10% of the toy's FLOPs).
TOY_VOCAB = 918
#: Float32 copies of the largest model's weights a job of each rule holds (1 when not named):
#: training adds gradients and AdamW's two moments; gradient×write and gradient×component
#: a gradient; K1 and the audit pilot hold a seed's three variants; 0: no model loaded.
COPIES = {"samoe_train": 4, "samoe_interventions": 2, "samoe_li": 2, "samoe_seeds": 3,
          "samoe_audit_cost": 3, "samoe_targets": 0, "samoe_stats": 0,
          "samoe_paper": 0}  # fmt: skip
#: Rules that run on GPUs in the paper study, timed by the FLOP model, not by this CPU.
GPU_TIMED = {"samoe_train"}
#: Rules that run on a GPU in the paper study (``--device``), their time bounded by the CPU
#: projection (no GPU rate measured; the CUDA path has not been timed on a GPU).
GPU_BOUNDED = {"samoe_capture", "samoe_quality", "samoe_probes", "samoe_interventions",
               "samoe_li", "samoe_audit_cost"}  # fmt: skip
GPU_NOTE = ("samoe_train's request covers the FLOP model (3 × SAMOE §8 forward FLOPs per "
            "token × tokens at 20% of an H100's bf16 peak on its GPUs; "
            "headgeom.samoe.counts.cpt_hours); the analyses' requests cover their CPU "
            "projection, an upper bound of their GPU time (no GPU rate measured)")  # fmt: skip
#: Rules whose measured job does not do the target's kind of work, with the reason.
NOT_PROJECTED = {
    "samoe_corpus": "the toy tokenizes the embedded domains; the paper streams the Hub "
    "corpora (not built yet)",
    "samoe_dense": "the toy trains its dense source; the paper imports a Hub checkpoint",
    "samoe_import_dense": "a download of the pinned checkpoint (network bound)",
    "samoe_hub_corpus": "a Hub family's corpus: streaming and tokenizing ~30B tokens (network "
    "bound; the toy has no such job)",
    "samoe_harness": "the paper's downstream suite through lm-evaluation-harness on a GPU "
    "(the toy scores its own suite inside samoe_quality)",
}


def shape(study: SAMoEStudy, family: str) -> C.FamilyShape:
    if study.is_toy(family):
        return C.toy_shape(study.dense_config(family).model_config(TOY_VOCAB))
    return study.paper_shape(family)


def _largest(study: SAMoEStudy, of: Callable[[str], float]) -> float:
    """The largest value of ``of(family)`` over the study's families."""
    return max(of(f) for f in study.families)


def _flops(study: SAMoEStudy, family: str) -> float:
    return C.counts(shape(study, family), study.moe_config(), "persistent").flops_per_token


def _seq_forward(study: SAMoEStudy, family: str) -> float:
    """Forward FLOPs of one sequence of the family (T tokens)."""
    return _flops(study, family) * shape(study, family).seq_len


def _pool(study: SAMoEStudy, *roles: str) -> int:
    return sum(study.config["data"]["pools"][r] for r in roles)


def _downstream(study: SAMoEStudy) -> int:
    """Downstream examples a quality job scores: the toy suite's; an imported family's suite
    is samoe_harness's job (or left out), not samoe_quality's."""
    if not study.toy_families:
        return 0
    ds = study.config["downstream"]
    return len(ds["tasks"]) * ds["n_per_task"] + ds["arith"]["n"]


def _slots(study: SAMoEStudy, family: str, per_layer: Callable[[int], int]) -> int:
    """Forwards per intervention sequence: ``per_layer(L)`` summed over the target slots."""
    return sum(per_layer(L) for L in study.target_layers(family))


def _n_seq(study: SAMoEStudy) -> int:
    return study.config["interventions"]["n_sequences"]


def _train(study: SAMoEStudy) -> float:
    cpt = study.config["cpt"]
    return _largest(study, lambda f: max(
        C.cpt_flops(shape(study, f), study.moe_config(), v, cpt["steps"], cpt["batch_size"])
        for v in study.variants))  # fmt: skip


def _probes(study: SAMoEStudy) -> float:
    p = study.config["probes"]
    return _largest(study, lambda f: len(study.probe_pairs(f)) * sum(p["budgets"])
                    * (shape(study, f).d_model + study.moe_config().state_dim))  # fmt: skip


#: Work units of one job per rule (name, value of a study).
UNITS: dict[str, tuple[str, Callable[[SAMoEStudy], float]]] = {
    "samoe_upcycle": ("parameters (largest family)", lambda s: _largest(
        s, lambda f: C.counts(shape(s, f), s.moe_config(), "persistent").total)),
    "samoe_train": ("training FLOPs (3 × forward × tokens)", _train),
    "samoe_quality": ("forward FLOPs: final pool + downstream examples", lambda s: _largest(
        s, lambda f: (_pool(s, "final") + _downstream(s)) * _seq_forward(s, f))),
    "samoe_capture": ("forward FLOPs: every pool", lambda s: _largest(
        s, lambda f: _pool(s, "construction", "calibration", "final") * _seq_forward(s, f))),
    "samoe_probes": ("probe fits: pairs × Σ budgets × (d + r)", _probes),
    "samoe_interventions": ("forward FLOPs: a rerun per target per earlier layer",
                            lambda s: _largest(s, lambda f: _n_seq(s) * _slots(
                                s, f, lambda L: L + 1) * _seq_forward(s, f))),
    "samoe_li": ("forward FLOPs: a rerun per component + a backward per target",
                 lambda s: _largest(s, lambda f: _n_seq(s) * _slots(
                     s, f, lambda L: 3 * L + 3) * _seq_forward(s, f))),
    "samoe_audit_cost": ("forward FLOPs of one sequence", lambda s: _largest(s, lambda f:
                                                                           _seq_forward(s, f))),
}  # fmt: skip
#: Rules whose job is the same work whatever the counts: their measured time as it is.
FIXED = ("samoe_targets", "samoe_seeds", "samoe_stats", "samoe_paper")


def params(study: SAMoEStudy) -> int:
    """Total parameters of the study's largest model."""
    return int(_largest(study, lambda f: C.counts(shape(study, f), study.moe_config(),
                                                  "persistent").total))  # fmt: skip


def fit(measured: Mapping[str, shared.Measured], study: SAMoEStudy,
        target: SAMoEStudy) -> list[shared.Projection]:  # fmt: skip
    """:class:`headgeom.cost.Projection` of every measured rule from ``study`` to ``target``."""
    grown = max(0, params(target) - params(study)) * 4 / 2**20  # MB per float32 copy
    out = []
    for rule, m in sorted(measured.items()):
        unit, units_of = UNITS.get(rule, ("job", lambda s: 1.0))
        units, target_units = units_of(study), units_of(target)
        seconds = m.seconds / units * target_units
        memory = m.max_rss_mb + grown * COPIES.get(rule, 1)
        out.append(shared.Projection(rule, m.jobs, m.seconds, m.max_rss_mb, unit, units,
                                     target_units, seconds, memory))  # fmt: skip
    return out


def report(projections, planned: Mapping[str, dict]) -> str:
    return shared.report(projections, planned, NOT_PROJECTED, GPU_TIMED, {}, GPU_NOTE)


def uncovered(projections, planned: Mapping[str, dict],
              margin: float = 1.0) -> list[str]:  # fmt: skip
    """Rules of the target whose request does not cover ``margin`` × the projection (time
    for every rule but the GPU-timed ones, whose time is the FLOP model's: the analyses on a
    GPU are held to their CPU projection; host memory for all)."""
    out = []
    for p in projections:
        if p.rule not in planned or p.rule in NOT_PROJECTED:
            continue
        mem, runtime = shared.request(planned, p.rule)
        timed = p.rule not in GPU_TIMED
        if p.memory_mb * margin > mem or (timed and p.seconds * margin > runtime * 60):
            out.append(p.rule)
    return out


def _study(path: str) -> SAMoEStudy:
    study = from_config(config_layers.load(path))
    if not isinstance(study, SAMoEStudy):
        raise SystemExit(f"{path}: not an SA-MoE study (kind: samoe)")
    return study


def measured_of(source: str | Path) -> dict[str, shared.Measured]:
    """A run's results folder (its ``benchmarks/samoe`` files) or a summary TSV."""
    if Path(source).is_file():
        return shared.read_summary(source)
    return shared.read_benchmarks(source, "samoe")


def main(argv: list[str] | None = None) -> int:
    parsed = shared.parse_cli(argv, __doc__.split("\n\n")[0], measured_of)
    if parsed is None:
        return 0
    args, measured = parsed
    projections = fit(measured, _study(args.configfile), _study(args.target))
    if args.command == "report":
        print(report(projections, shared.planned_requests(args.target)))
    else:
        for p in projections:
            if p.rule in NOT_PROJECTED:
                continue
            res = shared.suggested(p, args.margin)
            if p.rule in GPU_TIMED:  # its time is the FLOP model's on its GPUs
                res = {"mem_mb": res["mem_mb"]}
            print(f"  {p.rule}: {res}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
