"""The order in which the SA-MoE workflow starts its ready jobs (Snakemake ``priority:``):
the job with the longest chain of work still ahead of it first (critical-path scheduling).

A job's chain is its own time plus the longest chain of the jobs that read its output, in
seconds of one demo job (rounded, from the demo's ``benchmark:`` files on a 2-core Intel
Xeon, 2026-12-06; the persistent and latest probes apart, which the cost model's calibration
``benchmarks/samoe_demo_cpu.tsv`` does not split). Only their order matters. The persistent
runs' probes outlast every other analysis, so their chain (upcycle -> train -> probes) starts
first and the short jobs fill the cores at the end, instead of the last probes job running
alone on one core. Only the order changes, never a result; on a cluster it orders the
submissions.
"""

from __future__ import annotations

#: Seconds of one job of each per-run rule in the demo (by variant where they differ).
OWN_SECONDS: dict[str, float | dict[str, float]] = {
    "samoe_upcycle": 4, "samoe_train": 35, "samoe_capture": 8, "samoe_interventions": 22,
    "samoe_li": 30, "samoe_quality": 9, "samoe_probes": {"persistent": 90, "latest": 30},
}  # fmt: skip
#: The per-run rules that read each rule's output.
BELOW = {
    "samoe_upcycle": ("samoe_train",),
    "samoe_train": ("samoe_probes", "samoe_capture", "samoe_li", "samoe_quality"),
    "samoe_capture": ("samoe_interventions",),
}
#: Rules that only one kind of run has: the state variants' captures, interventions and
#: probes; the ordinary model's post-hoc attribution (Li).
STATE_ONLY = frozenset({"samoe_capture", "samoe_interventions", "samoe_probes"})
ORDINARY_ONLY = frozenset({"samoe_li"})


def chain_seconds(rule: str, variant: str) -> float:
    """Seconds of ``rule``'s job of a ``variant`` run and of the longest chain below it
    (0 where that run has no such job)."""
    if rule not in OWN_SECONDS:
        raise KeyError(f"{rule}: no demo time for it in headgeom.samoe.schedule.OWN_SECONDS")
    if rule in (STATE_ONLY if variant == "ordinary" else ORDINARY_ONLY):
        return 0
    own = OWN_SECONDS[rule]
    own = own[variant] if isinstance(own, dict) else own
    return own + max((chain_seconds(r, variant) for r in BELOW.get(rule, ())), default=0)
