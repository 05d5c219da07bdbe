"""The weight-space geometry of one checkpoint as result tables (docs §9.1–9.4, §14.1,
§14.3; check C14): pairwise projection kernels and a one-row summary.

The measurements are in :mod:`headgeom.heads.analysis.weightspace`; this module assembles them into
``results.GEOMETRY_PK`` and ``results.GEOMETRY_SUMMARY`` rows and runs check C14: where every
layer's writes form an orthogonal decomposition of R^D (detected from the weights),
Σ_h PK(U^{l,h}, R) = dim R must hold to 1e-8, else the run stops; and the designed-PK check
of §9.4 (:func:`designed_pk`) on the frozen head blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headgeom import checks
from headgeom.heads.analysis.weightspace import (
    PROP1_TOLERANCE,
    head_maps,
    head_spaces,
    idempotence,
    index_stats,
    pk_matrix,
    proposition1,
    self_alignment,
    write_read_pk,
    write_write_pk,
)
from headgeom.model import registry
from headgeom.model.geometries import AXIS

#: The designed-PK check (docs §9.4): measured PKs of frozen head blocks equal their designed
#: values to this absolute error. PKs are sums of d² squared inner products of float64
#: orthonormal bases (D entries each) from an SVD; the bound 4·d·D·ε_64 is 4.4e-11 at
#: D = 768, d = 64, orders below the smallest designed gap (1/256 between cross-member PKs).
DESIGNED_PK_EPS_FACTOR = 4


def designed_pk_tolerance(d_model: int, d_head: int) -> float:
    return DESIGNED_PK_EPS_FACTOR * d_head * d_model * float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class Geometry:
    pk: pd.DataFrame  # results.GEOMETRY_PK rows
    summary: dict  # the one results.GEOMETRY_SUMMARY row
    heads: pd.DataFrame  # results.GEOMETRY_HEADS rows: what the summary aggregates
    prop1_applies: bool
    prop1_max_residual: float
    decomposition_residual: float
    designed_pk_residual: float | None = None  # None: no frozen head blocks to check
    designed_pk_pairs: int = 0


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
    idem_heads = idempotence(maps)
    idem = idem_heads["idempotence"]
    heads = selfal[["layer", "head", "pk_self", "pk_best_other", "own_best", "rho_self"]].merge(
        idem_heads, on=["layer", "head"], how="left", validate="one_to_one"
    )
    heads.insert(0, "seed", seed)
    heads.insert(0, "model", model_name)
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
    designed, n_designed = designed_pk(model, spaces)
    return Geometry(
        pk,
        summary,
        heads,
        prop1.applies,
        prop1.max_residual,
        prop1.decomposition_residual,
        designed,
        n_designed,
    )


def designed_pk(model, spaces) -> tuple[float | None, int]:
    """The designed-PK check (docs §9.4): max |measured − designed| PK over the frozen head
    blocks of ``model`` (None where it has none), and how many pairs it covers.

    Measured: write spaces U^{l,h} (``spaces``, from the forward pass's W_O) and the block
    readers' frozen blocks S^{l,h}. Designed, from ``registry.frozen_bases`` and the basis
    family: d for the same block of one basis (the same index of the axis basis or of one
    member), 0 for two blocks of one basis, ``family.pk`` across members (docs §5.5 item 3;
    paper: 64 / 0 / 5.332–5.336). Pairs: writes of layers l < l', and with block readers
    the write of l and the reader of l' ≥ l (all-rotated-self: 64 on its own diagonal)."""
    cfg = model.cfg
    bases = registry.frozen_bases(cfg)
    if "write" not in bases:
        return None, 0
    family = registry.basis_family(cfg)
    H, d = cfg.n_head, cfg.d_head

    def expected(a, b) -> np.ndarray | None:  # (H, H) designed PK of basis a vs basis b
        if a == b:
            return d * np.eye(H)
        if AXIS in (a, b):
            return None
        return family.pk[a, b]

    with torch.no_grad():
        reads = [_blocks64(block.attn.reader) for block in model.blocks] if "read" in bases else []
    worst, n = 0.0, 0
    L = len(spaces.write)
    pairs = [("write", a, b) for a in range(L) for b in range(a + 1, L)]
    pairs += [("read", a, b) for a in range(L) for b in range(a, L)] if reads else []
    for role, a, b in pairs:  # the write of layer a against the write or reader of layer b
        want = expected(bases["write"][a], bases[role][b])
        if want is None:
            continue
        other = spaces.write[b] if role == "write" else list(reads[b])
        got = pk_matrix(spaces.write[a], other)
        worst = max(worst, float(np.max(np.abs(got - want))))
        n += got.size
    return worst, n


def _blocks64(reader) -> np.ndarray:
    """S_h of a block reader, (H, D, d) float64 (its frozen basis)."""
    return reader.read_blocks().detach().cpu().to(torch.float64).numpy()


def c14_metadata(geometry: Geometry) -> dict:
    """Check C14 as file metadata (the residual is null where it does not apply)."""
    residual = geometry.prop1_max_residual
    note = None if geometry.prop1_applies else "writes do not decompose R^D orthogonally"
    return {
        "check_C14_applies": geometry.prop1_applies,
        **checks.record("C14", None if np.isnan(residual) else residual, PROP1_TOLERANCE,
                        note=note),
    }  # fmt: skip


def designed_pk_metadata(geometry: Geometry, d_model: int, d_head: int, paper_size: bool) -> dict:
    """The designed-PK check (docs §9.4) as file metadata: enforced (a failure stops the job)
    at the paper's size, reported below it (toy models)."""
    tolerance = designed_pk_tolerance(d_model, d_head)
    note = (f"{geometry.designed_pk_pairs} frozen head-block pairs"
            if geometry.designed_pk_residual is not None
            else "no frozen head blocks")  # fmt: skip
    return checks.enforce(
        "designed-pk",
        geometry.designed_pk_residual,
        tolerance,
        enforced=paper_size,
        what="a frozen head-block PK differs from its designed value (docs §9.4)",
        note=note,
    )
