"""The weight-space geometry of one checkpoint as result tables (docs §9.1–9.4, §14.1,
§14.3; check C14): pairwise projection kernels and a one-row summary.

The measurements are in :mod:`headgeom.analysis.weightspace`; this module assembles them into
``results.GEOMETRY_PK`` and ``results.GEOMETRY_SUMMARY`` rows and runs check C14: where every
layer's writes form an orthogonal decomposition of R^D (detected from the weights),
Σ_h PK(U^{l,h}, R) = dim R must hold to 1e-8, else the run stops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headgeom.analysis.weightspace import (
    PROP1_TOLERANCE,
    head_maps,
    head_spaces,
    idempotence,
    index_stats,
    proposition1,
    self_alignment,
    write_read_pk,
    write_write_pk,
)


@dataclass(frozen=True)
class Geometry:
    pk: pd.DataFrame  # results.GEOMETRY_PK rows
    summary: dict  # the one results.GEOMETRY_SUMMARY row
    prop1_applies: bool
    prop1_max_residual: float
    decomposition_residual: float


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if len(values) else float("nan")


def _median(values: pd.Series) -> float:
    return float(values.median()) if len(values) else float("nan")


def geometry_tables(model, model_name: str, seed: int, checkpoint: str) -> Geometry:
    """PK rows (write–write and write–read) and the summary row of ``model``."""
    cfg = model.cfg
    maps = head_maps(model)
    spaces = head_spaces(maps)
    ww = write_write_pk(spaces).assign(kind="write_write")
    wr = write_read_pk(spaces).assign(kind="write_read")
    pk = pd.concat([ww, wr], ignore_index=True)
    pk.insert(0, "seed", seed)
    pk.insert(0, "model", model_name)

    prop1 = proposition1(spaces, cfg.d_head)
    if prop1.applies and not prop1.max_residual <= PROP1_TOLERANCE:
        raise ArithmeticError(
            f"{checkpoint}: check C14 failed: Σ_h PK(U^{{l,h}}, R) − dim R reaches "
            f"{prop1.max_residual:.3e} > {PROP1_TOLERANCE:g} although every layer's writes "
            "decompose R^D orthogonally"
        )
    selfal = self_alignment(spaces)
    later, first = selfal[selfal["layer"] >= 1], selfal[selfal["layer"] == 0]
    idem = idempotence(maps)["idempotence"]
    dims = [U.shape[1] for layer in spaces.write for U in layer]
    summary = {
        "model": model_name,
        "seed": seed,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "write_dim_min": min(dims),
        "write_dim_max": max(dims),
        "own_best_fraction": _mean(later["own_best"].astype(float)),
        "own_best_fraction_layer0": _mean(first["own_best"].astype(float)),
        "n_heads_own_best_test": len(later),
        "rho_self_mean": _mean(later["rho_self"]),
        "rho_self_median": _median(later["rho_self"]),
        "idempotence_median": _median(idem.dropna()),
        "idempotence_mean": _mean(idem.dropna()),
        "prop1_applies": prop1.applies,
        "write_decomposition_residual": prop1.decomposition_residual,
        "prop1_max_residual": prop1.max_residual,
    }
    for kind, frame in (("write_write", ww), ("write_read", wr)):
        summary.update({f"{kind}_pk_{k}": v for k, v in index_stats(frame).items()})
    return Geometry(pk, summary, prop1.applies, prop1.max_residual, prop1.decomposition_residual)


def c14_metadata(geometry: Geometry) -> dict:
    """Check C14 as file metadata (the residual is null where it does not apply)."""
    residual = geometry.prop1_max_residual
    return {
        "check_C14_applies": geometry.prop1_applies,
        "check_C14_max_abs_residual": None if np.isnan(residual) else residual,
        "check_C14_tolerance": PROP1_TOLERANCE,
    }
