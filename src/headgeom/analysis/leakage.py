"""Directional leakage of a patch perturbation into later readers (docs §9.5, §11.2–11.3).

L_{i→j} = Σ‖P_R δ_i‖² / Σ‖δ_i‖², pooled over every row of ``delta`` (rows are
examples × positions). With an orthonormal reader basis ``R`` (D, r), ‖P_R δ‖ = ‖Rᵀδ‖,
so the numerator is one matrix product and never needs the D×D projector.

A perturbation with no energy (Σ‖δ‖² = 0, e.g. a head whose reference and clean outputs
coincide) has no direction; its leakage is NaN, never 0, so it cannot pass as "no leakage".

:func:`leakage_table` runs the whole analysis of one model and task split: for every source
head i = (l, h), every head j of every later layer l' > l and X ∈ {Q, K, V}, the leakage
L_{i→j} of the real patch perturbation δ_i = W_O^i (z_ref − z) (pooled over all positions of
all examples) into the folded read space R_X^j = Im(P_c diag(γ) W_X^jᵀ) of reader j (γ: its
LN_1 gain), the isotropic expectation ρ = PK(Im W_O^i, R) / dim Im W_O^i, and L/ρ. Two
numerical checks run with it and stop the run before anything is written:

* C8: the z-patched attention output of layer l minus the clean one equals δ_i (1e-5);
* C9: the effects recomputed by adding δ_i to the attention output reproduce the stored
  head-patch effects e_{l,h} of the effects file (1e-5).

Only models whose readers are free (a shared LN_1 before learned W_Q, W_K, W_V) are
supported (docs §11.1).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from headgeom.analysis.effects import drops_array
from headgeom.analysis.patching import delta_patch_layer, length_batches
from headgeom.analysis.stats import effects_from_drops
from headgeom.analysis.subspace import folded_read_basis, orthonormal_basis, projection_kernel
from headgeom.data.task_files import PatchInputs
from headgeom.model import registry
from headgeom.model.geometries import READ_TYPES

#: docs §11.2 / §18: tolerances of checks C8 and C9 (float32 forward passes).
C8_TOLERANCE = 1e-5
C9_TOLERANCE = 1e-5


def _rows(delta: np.ndarray) -> np.ndarray:
    """Flatten ``(..., D)`` perturbations to ``(N, D)`` float64 rows."""
    delta = np.asarray(delta, dtype=np.float64)
    if delta.ndim < 1:
        raise ValueError("delta must have a trailing residual axis D")
    return delta.reshape(-1, delta.shape[-1])


def directional_leakage(delta: np.ndarray, R: np.ndarray) -> float:
    """L = Σ‖Rᵀδ‖² / Σ‖δ‖² for perturbations ``delta`` (N, D) and reader basis ``R`` (D, r).

    ``delta`` may also be ``(examples, positions, D)``; all leading axes are pooled.
    ``R`` must have orthonormal columns. Returns NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return float("nan")
    return float(np.sum(np.square(rows @ R))) / total


def leakage_to_readers(delta: np.ndarray, readers: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """L for one source perturbation and many readers at once, shape ``(J,)``.

    ``delta``: ``(N, D)`` or ``(..., D)``, the source head's perturbation rows.
    ``readers``: a sequence of J orthonormal bases ``(D, r_j)`` (ranks may differ, r_j = 0
    gives 0), or a stack ``(J, D, r)``.

    All bases are concatenated into one ``(D, Σr_j)`` matrix so a single product gives every
    column's captured energy. When there are more rows than residual dimensions (N > D) the
    energies come from the Gram matrix G = δᵀδ instead (column k: r_kᵀ G r_k), which needs
    N·D² + D²·Σr operations and a D×Σr buffer rather than N·D·Σr and an N×Σr buffer.
    Returns all-NaN when Σ‖δ‖² = 0.
    """
    rows = _rows(delta)
    bases = list(readers)
    if not bases:
        return np.zeros(0)
    widths = np.array([basis.shape[1] for basis in bases])
    stacked = np.concatenate([np.asarray(basis, dtype=np.float64) for basis in bases], axis=1)
    total = float(np.sum(np.square(rows)))
    if total == 0.0:
        return np.full(len(bases), np.nan)
    if rows.shape[0] > rows.shape[1]:
        gram = rows.T @ rows  # (D, D)
        column_energy = np.einsum("dk,dk->k", gram @ stacked, stacked)
    else:
        column_energy = np.sum(np.square(rows @ stacked), axis=0)  # (Σr,)
    owner = np.repeat(np.arange(len(bases)), widths)  # which reader each column belongs to
    captured = np.bincount(owner, weights=column_energy, minlength=len(bases))
    # The Gram form can round a zero energy to -1e-17; energies are nonnegative by definition.
    return np.maximum(captured, 0.0) / total


def isotropic_expectation(U: np.ndarray, R: np.ndarray) -> float:
    """PK(U, R) / dim U: the leakage of a perturbation isotropic within U (docs §9.5).

    ``U`` (D, a) is the source write space, ``R`` (D, r) the reader's folded read space, both
    orthonormal. When dim U = dim R this equals ρ(U, R); NaN if dim U = 0.
    """
    if U.shape[1] == 0:
        return float("nan")
    return projection_kernel(U, R) / U.shape[1]


# ----------------------------------------------------------------------------- the analysis
def require_free_readers(model, checkpoint: str) -> None:
    spec = registry.geometry_of(model.cfg)
    if not spec.shared_ln1:
        raise ValueError(
            f"{checkpoint}: leakage needs free readers (a shared LN_1 before learned "
            f"W_Q/W_K/W_V, docs §11.1), but geometry {spec.name!r} has {spec.reader} "
            "readers without one"
        )


def write_bases(model) -> list[list[np.ndarray]]:
    """U^{l,h} = Im W_O^{l,h}: orthonormal (D, r) bases, [layer][head]."""
    with torch.no_grad():
        return [
            [orthonormal_basis(w.cpu().numpy()) for w in block.attn.writer.write_maps()]
            for block in model.blocks
        ]


def read_bases(model) -> list[dict[str, list[np.ndarray]]]:
    """Folded read spaces R_X^{l,h} from W_X and LN_1's γ, [layer][X][head] (docs §9.2)."""
    bases = []
    with torch.no_grad():
        for block in model.blocks:
            reader = block.attn.reader
            gamma = reader.ln_1.weight.double().cpu().numpy()
            bases.append(
                {
                    X: [
                        folded_read_basis(w.double().cpu().numpy(), gamma)
                        for w in reader.read_maps(X)
                    ]
                    for X in READ_TYPES
                }
            )
    return bases


def stored_effects(
    effects: pd.DataFrame, split: str, example_ids: np.ndarray, shape: tuple[int, int], path: str
) -> tuple[dict, np.ndarray]:
    """(identity, e (L, H)) of ``split`` from an effects table; examples must match the task."""
    rows = effects[effects["split"] == split]
    if rows.empty:
        raise ValueError(
            f"{path}: no effects for split {split!r} (has {list(pd.unique(effects['split']))})"
        )
    identity = {}
    for column in ("model", "seed", "task"):
        values = pd.unique(rows[column])
        if len(values) != 1:
            raise ValueError(f"{path}: expected one {column}, found {list(values)}")
        identity[column] = values[0].item() if hasattr(values[0], "item") else values[0]
    ids, d = drops_array(rows, *shape)
    if set(ids.tolist()) != set(example_ids.tolist()) or len(ids) != len(example_ids):
        raise ValueError(f"{path}: the {split} examples differ from the task file's")
    return identity, effects_from_drops(d)


@dataclass(frozen=True)
class Leakage:
    """The leakage rows of one model and split (without identity columns) and the checks."""

    table: pd.DataFrame
    c8: float
    c9: float


LEAKAGE_COLUMNS = [
    "source_layer",
    "source_head",
    "reader_layer",
    "reader_head",
    "read_type",
    "leakage",
    "rho",
    "pk",
    "write_dim",
    "read_dim",
]


def leakage_table(
    model,
    inputs: PatchInputs,
    e_stored: np.ndarray,
    batch_size: int,
    device: torch.device,
    effects_path: str,
) -> Leakage:
    """Leakage of every source head into every later reader (module docstring), with
    checks C8 and C9 against the stored effects ``e_stored`` (L, H)."""
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head
    batches = length_batches([len(x) for x in inputs.clean_ids], batch_size)
    correct = torch.as_tensor(inputs.correct, device=device)
    incorrect = torch.as_tensor(inputs.incorrect, device=device)
    U, R = write_bases(model), read_bases(model)

    def stack(ids: list[np.ndarray], index: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.stack([ids[i] for i in index]).astype(np.int64), device=device)

    drops = np.empty((len(inputs.clean_ids), n_layer, n_head))
    c8 = 0.0
    records = []
    bar = tqdm(total=n_layer * len(batches), desc="leakage", unit="batch", file=sys.stderr)
    for layer in range(n_layer):
        rows = []  # δ of this layer's heads at every (example, position): (rows, H, D) chunks
        for index in batches:
            index_t = torch.as_tensor(index, device=device)
            delta, d, residual = delta_patch_layer(
                model,
                stack(inputs.clean_ids, index),
                stack(inputs.ref_ids, index),
                correct[index_t],
                incorrect[index_t],
                layer,
            )
            c8 = max(c8, residual)
            drops[index, layer] = d.cpu().numpy()
            rows.append(delta.flatten(0, 1).cpu().numpy())
            bar.update(1)
        if layer == n_layer - 1:
            break  # no later readers
        deltas = np.concatenate(rows)  # (Σ T, H, D)
        readers = [
            (reader_layer, reader_head, X)
            for reader_layer in range(layer + 1, n_layer)
            for X in READ_TYPES
            for reader_head in range(n_head)
        ]
        reader_bases = [R[rl][X][rh] for rl, rh, X in readers]
        for head in range(n_head):
            leak = leakage_to_readers(deltas[:, head], reader_bases)
            u = U[layer][head]
            for (rl, rh, X), basis, value in zip(readers, reader_bases, leak, strict=True):
                rho = isotropic_expectation(u, basis)
                records.append(
                    (
                        layer,
                        head,
                        rl,
                        rh,
                        X,
                        value,
                        rho,
                        projection_kernel(u, basis),
                        u.shape[1],
                        basis.shape[1],
                    )
                )
    bar.close()

    c9 = float(np.max(np.abs(effects_from_drops(drops) - e_stored)))
    if c8 > C8_TOLERANCE:
        raise ArithmeticError(
            f"check C8 failed: patched − clean attention output differs from δ by {c8:.3g} "
            f"> {C8_TOLERANCE} (docs §11.2)"
        )
    if c9 > C9_TOLERANCE:
        raise ArithmeticError(
            f"check C9 failed: effects recomputed from δ differ from {effects_path} by "
            f"{c9:.3g} > {C9_TOLERANCE} (docs §11.2)"
        )
    table = pd.DataFrame.from_records(records, columns=LEAKAGE_COLUMNS)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table["leakage"].to_numpy() / table["rho"].to_numpy()
    table["leakage_over_rho"] = np.where(np.isfinite(ratio), ratio, np.nan)
    return Leakage(table, c8, c9)
