"""Scalar-part ablation of own-lane value maps (docs §14.5).

In every head of the chosen layers, the own-lane map M (the w×w block of W_V^h on the
coordinates the head writes) loses its scalar part s·I (s = tr M / w), or, as the control,
an equal-norm random part s·R (R Haar-random orthogonal, one per head). Each edit is a new
checkpoint; :func:`scalar_ablation` measures the drop in mean logit difference of every
task on the edited model as written and reloaded by the caller.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headgeom.data.task_files import PatchInputs
from headgeom.heads.analysis.evaluation import clean_performance, logit_differences
from headgeom.subspace import haar_orthogonal


def own_lane_blocks(write_map: np.ndarray, atol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """(coordinates, dims) of an identity-type write block O_h (D, d): every non-zero column
    is a multiple of a distinct standard basis vector e_c. ``dims`` are the head-internal
    dims whose column is non-zero and ``coordinates`` the residual coordinates they write
    (so O_h[coordinates[i], dims[i]] ≠ 0). Anything else raises ValueError."""
    W = np.asarray(write_map, dtype=np.float64)
    nonzero = np.abs(W) > atol
    dims = np.flatnonzero(nonzero.any(axis=0))
    if dims.size == 0 or (nonzero[:, dims].sum(axis=0) != 1).any():
        raise ValueError("the write block is not identity-type (a column is not a multiple of e_c)")
    coordinates = np.array([int(np.flatnonzero(nonzero[:, j])[0]) for j in dims])
    if len(set(coordinates.tolist())) != len(coordinates):
        raise ValueError("the write block writes one residual coordinate twice")
    return coordinates, dims


def ablate_scalar_part(
    model, layers: Sequence[int], kind: str, rng: np.random.Generator | None = None
) -> pd.DataFrame:
    """Edit ``model`` in place: in every head of ``layers``, the own-lane value map
    M = W_V^h[dims, coordinates] (w×w) loses s·I (``kind="scalar"``) or s·R with R
    Haar-random orthogonal, one per head drawn from ``rng`` in (layer, head) order
    (``kind="random"``; ‖sR‖_F = ‖sI‖_F), s = tr M / w. Returns one row per edited head
    (layer, head, w, s, ‖M‖_F before and after)."""
    if kind not in ("scalar", "random"):
        raise ValueError(f"unknown ablation kind {kind!r}; expected scalar or random")
    if kind == "random" and rng is None:
        raise ValueError("the random control needs its recorded generator")
    rows = []
    with torch.no_grad():
        for layer in layers:
            if not 0 <= layer < len(model.blocks):
                raise ValueError(f"layer {layer} is not in the model's {len(model.blocks)} layers")
            block = model.blocks[layer]
            V = block.attn.reader.read_maps("V")  # (H, d, D): a view of the parameter
            W_O = block.attn.writer.write_maps().double().numpy()
            for h in range(V.shape[0]):
                coords, dims = own_lane_blocks(W_O[h])
                w = len(dims)
                ix = (torch.as_tensor(dims)[:, None], torch.as_tensor(coords)[None, :])
                M = V[h][ix].double().numpy()
                s = float(np.trace(M)) / w
                part = np.eye(w) if kind == "scalar" else haar_orthogonal(w, rng)
                edited = M - s * part
                V[h][ix] = torch.as_tensor(edited, dtype=V.dtype)
                after = block.attn.reader.read_maps("V")[h][ix].double().numpy()
                if not np.allclose(after, edited, atol=1e-6):
                    raise RuntimeError("read_maps('V') is not a view of the reader's W_V")
                rows.append({"layer": layer, "head": h, "w": w, "s": s,
                             "norm_before": float(np.linalg.norm(M)),
                             "norm_after": float(np.linalg.norm(edited))})  # fmt: skip
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ScalarEdit:
    """One edited checkpoint: ``scalar`` (s·I removed) or ``random<k>`` (s·R_k removed, R_k
    from numpy Generator([haar_seed, k]))."""

    name: str
    draw: int | None

    @property
    def kind(self) -> str:
        return "scalar" if self.draw is None else "random"

    def rng(self, haar_seed: int) -> np.random.Generator | None:
        return None if self.draw is None else np.random.default_rng([haar_seed, self.draw])

    def record(self, layers: Sequence[int], haar_seed: int, heads: pd.DataFrame) -> dict:
        """What the edited checkpoint's manifest records of its edit."""
        return {
            "name": self.name,
            "kind": self.kind,
            "draw": self.draw,
            "layers": list(layers),
            "haar_seed": haar_seed,
            "rng": None
            if self.draw is None
            else f"numpy Generator(PCG64)([{haar_seed}, {self.draw}])",
            "heads": heads.to_dict(orient="records"),
        }


def scalar_edits(draws: int) -> list[ScalarEdit]:
    """The scalar edit, then ``draws`` random controls."""
    return [ScalarEdit("scalar", None)] + [ScalarEdit(f"random{k}", k) for k in range(draws)]


def task_margins(model, inputs: Mapping[str, PatchInputs]) -> dict[str, dict]:
    """clean_performance (margin, accuracy, n) of every task's prompts."""
    return {
        name: clean_performance(logit_differences(model, x.clean_ids, x.correct, x.incorrect))
        for name, x in inputs.items()
    }


#: Writes an edited model as a checkpoint with its manifest and returns it reloaded through
#: that manifest with the checkpoint's SHA-256: (name, model, edit record) -> (model, sha).
WriteEdit = Callable[[str, torch.nn.Module, dict], tuple[torch.nn.Module, str]]


def scalar_ablation(
    parent: torch.nn.Module,
    inputs: Mapping[str, PatchInputs],
    layers: Sequence[int],
    draws: int,
    haar_seed: int,
    write_edit: WriteEdit,
    split: str = "evaluation",
) -> pd.DataFrame:
    """One row per (edit, task): the unedited and edited margins and their drop, measured on
    the model ``write_edit`` reloads (what was written, not the in-memory copy). ``parent``
    is left unedited."""
    base = task_margins(parent, inputs)
    rows = []
    for edit in scalar_edits(draws):
        edited = copy.deepcopy(parent)  # every edit starts from the parent
        heads = ablate_scalar_part(edited, layers, edit.kind, edit.rng(haar_seed))
        model, checkpoint_sha = write_edit(edit.name, edited, edit.record(layers, haar_seed, heads))
        scalar_norm = float((heads["s"].abs() * np.sqrt(heads["w"])).sum())
        for task, perf in task_margins(model, inputs).items():
            rows.append({"task": task, "split": split, "edit": edit.name, "kind": edit.kind,
                         "draw": edit.draw, "layers": ",".join(map(str, layers)),
                         "n_heads_edited": len(heads), "scalar_norm": scalar_norm,
                         "margin_unedited": base[task]["margin"], "margin": perf["margin"],
                         "drop": base[task]["margin"] - perf["margin"],
                         "accuracy": perf["accuracy"], "n": perf["n"],
                         "checkpoint_sha256": checkpoint_sha, "haar_seed": haar_seed})  # fmt: skip
    return pd.DataFrame(rows)
