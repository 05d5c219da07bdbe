"""The SA-MoE acceptance checks (SAMOE §20, K1–K15): the catalog and one way to run one.

:func:`enforce` returns the metadata keys of a logged check in the workspace format of
``headgeom.checks`` (``check_K6_max_abs_residual``, ``check_K6_tolerance``, …) and raises
``headgeom.checks.CheckFailed`` — residual, tolerance and SAMOE section in its message —
when the check fails, so a stage stops before it writes the file the check guards.
"""

from __future__ import annotations

from headgeom.checks import KINDS, Check, CheckFailed, passes

#: SAMOE §20, in its order.
CATALOG: dict[str, Check] = {
    c.id: c
    for c in (
        Check("K1", "step-0 writes exactly 0; P and LWO step-0 logits bitwise equal", "§5.4"),
        Check("K2", "state bounds |s| ≤ 5 (P), |s| ≤ 1 (LWO)", "§5.4"),
        Check("K3", "upcycling: re-init fraction, shared copy, biases, distinct experts, "
              "expert hashes across variants", "§6, §2"),
        Check("K4", "LR groups: shared 0 while frozen, every group ends at 0.1 × its peak", "§7"),
        Check("K5", "parameter counts, FLOPs and trace sizes match the formula", "§8"),
        Check("K6", "ledger reconstruction max |Σ c − ωᵀ s_L|", "§10.4"),
        Check("K7", "logit reconstruction max |W^x x + W^s s − z|", "§10.4"),
        Check("K8", "state-only replay Δm = −c where no clamp is touched", "§10.4"),
        Check("K9", "local suppression at λ = 1 changes no Top-2 set", "§12"),
        Check("K10", "probe convergence, training-only scalers", "§13.3"),
        Check("K11", "suppression hook at α = 1 and on a zero write is a no-op", "§14.2"),
        Check("K12", "target registry identical across variants", "§14.1"),
        Check("K13", "gradient×write matches the finite difference within 5%", "§14.4"),
        Check("K14", "Li reconstruction within 1e-5", "§15"),
        Check("K15", "demo wall time ≤ 12 min", "§19.1"),
    )
}  # fmt: skip


def record(check: str, residual: float | None, tolerance: float, kind: str = "abs") -> dict:
    """The metadata keys of one logged check (``headgeom.checks`` format)."""
    if check.split(".")[0] not in CATALOG:
        raise ValueError(f"unknown SA-MoE check {check!r}; known: {list(CATALOG)}")
    if kind not in KINDS:
        raise ValueError(f"check {check}: kind {kind!r} is not one of {list(KINDS)}")
    value = None if residual is None else (int(residual) if kind == "count" else float(residual))
    return {f"check_{check}_{KINDS[kind]}": value, f"check_{check}_tolerance": float(tolerance)}


def enforce(
    check: str,
    residual: float | None,
    tolerance: float,
    kind: str = "abs",
    *,
    what: str = "",
    needs: str | None = None,
) -> dict:
    """:func:`record`, raising ``CheckFailed`` (residual, tolerance, section, and ``needs``:
    the setting the check relies on, e.g. :func:`headgeom.kernels.bitwise_requirement` for
    a bit-for-bit comparison of two forwards) on failure."""
    out = record(check, residual, tolerance, kind)
    if passes(residual, tolerance) is False:
        label = {"abs": "max |residual|", "rel": "max relative residual", "count": "mismatches"}
        detail = f" ({what})" if what else ""
        raise CheckFailed(
            f"check {check} failed{detail}: {label[kind]} {residual:.6g} > tolerance "
            f"{tolerance:.3g} (SAMOE {CATALOG[check.split('.')[0]].section}: "
            f"{CATALOG[check.split('.')[0]].title})" + (f"; {needs}" if needs else "")
        )
    return out
