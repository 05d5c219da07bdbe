"""Directional leakage of real patch perturbations into later readers (METHODS §9.5, §11.2–11.3).

    python src/leakage.py --checkpoint CKPT --manifest MANIFEST --task TASK.parquet \\
        --effects effects.parquet --split evaluation --out leakage.parquet

For every source head i = (l, h), every head j of every later layer l' > l and X ∈ {Q, K, V}:
the leakage L_{i→j} = Σ‖P_R δ_i‖² / Σ‖δ_i‖² of the real patch perturbation
δ_i = W_O^i (z_ref − z) (pooled over all positions of all examples of the split) into the
folded read space R_X^j = Im(P_c diag(γ) W_X^jᵀ) of reader j (γ: its LN_1 gain), the
isotropic expectation ρ = PK(Im W_O^i, R) / dim Im W_O^i, and L/ρ.

Two numerical checks run first and are recorded in the file metadata; either failing stops
the run before anything is written:

* C8: the z-patched attention output of layer l minus the clean one equals δ_i (1e-5);
* C9: the effects recomputed by adding δ_i to the attention output reproduce the stored
  head-patch effects e_{l,h} of the effects file (1e-5).

Only models whose readers are free (a shared LN_1 before learned W_Q, W_K, W_V) are
supported (METHODS §11.1).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from headgeom.analysis.leakage import isotropic_expectation, leakage_to_readers
from headgeom.analysis.patching import (
    delta_patch_layer,
    drops_array,
    length_batches,
    metadata_text,
    model_inputs,
    read_task,
)
from headgeom.analysis.stats import effects_from_drops
from headgeom.analysis.subspace import folded_read_basis, orthonormal_basis, projection_kernel
from headgeom.hashing import content_hash, sha256_file, source_freeze
from headgeom.io import read_parquet_metadata, write_parquet
from headgeom.model.checkpoint import load_verified
from headgeom.model.geometries import READ_TYPES

#: METHODS §11.2 / §18: tolerances of checks C8 and C9 (float32 forward passes).
C8_TOLERANCE = 1e-5
C9_TOLERANCE = 1e-5

SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.string()),
        ("split", pa.string()),
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
    ]
)
DESCRIPTIONS = {
    "split": "task split whose examples (all positions) pool the perturbation",
    "source_layer": "layer l of the patched source head i",
    "source_head": "head h of the source",
    "reader_layer": "layer l' > l of the reader j",
    "reader_head": "head h' of the reader",
    "read_type": "Q, K or V: which reader map defines the folded read space",
    "leakage": "L = Σ‖P_R δ_i‖² / Σ‖δ_i‖² over examples and positions; null if δ_i = 0",
    "rho": "isotropic expectation PK(U^i, R) / dim U^i, U^i = Im W_O^i",
    "leakage_over_rho": "leakage / rho; null if either is undefined or rho = 0",
    "pk": "projection kernel PK(U^i, R) = ‖U^iᵀ R‖_F²",
    "write_dim": "dim U^i (rank of W_O^i)",
    "read_dim": "dim R (rank of the folded read map)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--task", required=True, help="task Parquet (src/make_tasks.py)")
    parser.add_argument("--effects", required=True, help="effects Parquet (src/patch_heads.py)")
    parser.add_argument("--split", default="evaluation")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    parser.add_argument("--out", required=True, help="leakage Parquet")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    return args


def require_free_readers(model, checkpoint: str) -> None:
    for layer, block in enumerate(model.blocks):
        if not hasattr(block.attn.reader, "ln_1"):
            raise ValueError(
                f"{checkpoint}: leakage needs free readers (a shared LN_1 before learned "
                f"W_Q/W_K/W_V, METHODS §11.1), but layer {layer} of geometry "
                f"{model.cfg.geometry!r} uses {type(block.attn.reader).__name__}"
            )


def write_bases(model) -> list[list[np.ndarray]]:
    """U^{l,h} = Im W_O^{l,h}: orthonormal (D, r) bases, [layer][head]."""
    with torch.no_grad():
        return [
            [orthonormal_basis(w.cpu().numpy()) for w in block.attn.writer.write_maps()]
            for block in model.blocks
        ]


def read_bases(model) -> list[dict[str, list[np.ndarray]]]:
    """Folded read spaces R_X^{l,h} from W_X and LN_1's γ, [layer][X][head] (METHODS §9.2)."""
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


def stored_effects(path: str, split: str, example_ids: np.ndarray, shape: tuple[int, int]) -> tuple:
    """(identity, e (L, H)) of ``split`` from the effects file; examples must match the task."""
    effects = pq.read_table(path).to_pandas()
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    require_free_readers(model, args.checkpoint)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    model = model.to(device)
    n_layer, n_head = model.cfg.n_layer, model.cfg.n_head

    task = read_task(args.task, [args.split])
    effects_meta = read_parquet_metadata(args.effects)
    for key, expected in (
        ("checkpoint_sha256", manifest["checkpoint_file_sha256"]),
        ("task_dataset_sha256", task.dataset_sha256),
    ):
        found = metadata_text(effects_meta, key, args.effects)
        if found != expected:
            raise ValueError(
                f"{args.effects}: {key} is {found} but the inputs have {expected}; "
                "the effects come from another checkpoint or task (rerun patch_heads)"
            )
    identity, e_stored = stored_effects(
        args.effects, args.split, task.frame["example_id"].to_numpy(), (n_layer, n_head)
    )

    inputs = model_inputs(task.frame, vocab)
    batches = length_batches([len(x) for x in inputs.clean_ids], args.batch_size)
    correct = torch.as_tensor(inputs.correct, device=device)
    incorrect = torch.as_tensor(inputs.incorrect, device=device)
    U, R = write_bases(model), read_bases(model)

    def stack(ids: list[np.ndarray], index: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.stack([ids[i] for i in index]).astype(np.int64), device=device)

    drops = np.empty((len(task.frame), n_layer, n_head))
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
            f"> {C8_TOLERANCE} (METHODS §11.2)"
        )
    if c9 > C9_TOLERANCE:
        raise ArithmeticError(
            f"check C9 failed: effects recomputed from δ differ from {args.effects} by "
            f"{c9:.3g} > {C9_TOLERANCE} (METHODS §11.2)"
        )

    table = pd.DataFrame.from_records(
        records,
        columns=[
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
        ],
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = table["leakage"].to_numpy() / table["rho"].to_numpy()
    table["leakage_over_rho"] = np.where(np.isfinite(ratio), ratio, np.nan)
    for column, value in {**identity, "split": args.split}.items():
        table[column] = value
    write_parquet(
        args.out,
        table,
        SCHEMA,
        metadata={
            "analysis": "leakage",
            "analysis_version": "1",
            **identity,
            "split": args.split,
            "n_examples": len(task.frame),
            "n_layers": n_layer,
            "n_heads": n_head,
            "checkpoint_sha256": manifest["checkpoint_file_sha256"],
            "manifest_content_hash": content_hash(manifest),
            "task_dataset_sha256": task.dataset_sha256,
            "effects_sha256": sha256_file(args.effects),
            "check_C8_max_abs_residual": c8,
            "check_C8_tolerance": C8_TOLERANCE,
            "check_C9_max_abs_residual": c9,
            "check_C9_tolerance": C9_TOLERANCE,
            "read_space": "folded: Im(P_c diag(gamma_LN1) W_X^T) (METHODS §9.2)",
            "rho_definition": "PK(U, R) / dim U (isotropic expectation, METHODS §9.5)",
            "device": str(device),
            "source": source_freeze(),
        },
        descriptions=DESCRIPTIONS,
    )
    print(f"wrote {len(table)} rows to {args.out} (C8 {c8:.2g}, C9 {c9:.2g})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
