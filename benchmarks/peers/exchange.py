"""What our harness hands each peer and reads back (benchmarks/peer_patching.py).

An exchange directory holds:

* ``model/``: the model as a ``transformers`` GPT-2 directory (``headgeom.model.interop
  .export_hf``: config.json, model.safetensors), which every peer loads in its own way;
* ``examples.parquet``: one row per example, ``clean_ids`` and ``ref_ids`` (list<int64>,
  model ids, equal lengths within a row), ``correct_id`` and ``incorrect_id`` (int64);
* after a peer has run, ``<peer>.npz``: ``effects`` (L, H) float64, the mean over examples of
  e_{l,h} = LD(clean) − LD(clean with head (l, h)'s output, every position, taken from the
  ref run), LD = logit[correct] − logit[incorrect] at the last position; ``wall`` and ``cpu``
  (seconds of the patching sweep, the model already loaded), and ``version`` (the peer's).

Peers patch per equal-length group (the metric is the group's mean LD) and weight groups by
their size, as TransformerLens's ``get_act_patch_attn_head_out_all_pos`` is used in
benchmarks/patching_engine.py.

    python benchmarks/peers/exchange.py --tiny DIR   # a small model and examples, and our
                                                     # effects as DIR/ours.npz (for peer tests)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

COLUMNS = ("clean_ids", "ref_ids", "correct_id", "incorrect_id")


def write_examples(path: str | Path, pairs) -> None:
    clean, ref, correct, incorrect = pairs
    table = pa.table({
        "clean_ids": pa.array([np.asarray(x, dtype=np.int64) for x in clean],
                              type=pa.list_(pa.int64())),
        "ref_ids": pa.array([np.asarray(x, dtype=np.int64) for x in ref],
                            type=pa.list_(pa.int64())),
        "correct_id": pa.array(np.asarray(correct, dtype=np.int64)),
        "incorrect_id": pa.array(np.asarray(incorrect, dtype=np.int64)),
    })  # fmt: skip
    pq.write_table(table, path)


def read_examples(path: str | Path):
    """(clean, ref, correct, incorrect) as written; lists of int64 arrays, then arrays."""
    table = pq.read_table(path)
    missing = set(COLUMNS) - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}; expected {COLUMNS}")
    cols = table.to_pydict()
    return ([np.asarray(x, dtype=np.int64) for x in cols["clean_ids"]],
            [np.asarray(x, dtype=np.int64) for x in cols["ref_ids"]],
            np.asarray(cols["correct_id"], dtype=np.int64),
            np.asarray(cols["incorrect_id"], dtype=np.int64))  # fmt: skip


def groups(clean) -> list[np.ndarray]:
    """Indices of each equal-length group of examples, shortest first."""
    lengths = np.array([len(x) for x in clean])
    return [np.flatnonzero(lengths == n) for n in np.unique(lengths)]


def group_batches(pairs):
    """Per equal-length group: (size, clean, ref, correct, incorrect) as torch tensors."""
    import torch

    clean, ref, correct, incorrect = pairs
    for idx in groups(clean):
        yield (len(idx), torch.as_tensor(np.stack([clean[i] for i in idx])),
               torch.as_tensor(np.stack([ref[i] for i in idx])),
               torch.as_tensor(correct[idx]), torch.as_tensor(incorrect[idx]))  # fmt: skip


def mean_ld(last, correct, incorrect):
    """The group's mean logit difference at the last position, of its logits ``last`` (B, V)."""
    import torch

    rows = torch.arange(len(last))
    return (last[rows, correct] - last[rows, incorrect]).mean()


def peer_main(load, sweep, name: str, argv: list[str] | None = None) -> int:
    """A head-patching peer's command line: ``--exchange DIR --out FILE.npz [--threads N]``;
    ``load(model_dir) -> (model, version)``, ``sweep(model, pairs) -> effects`` (L, H), timed
    without gradients, the model already loaded."""
    import torch

    parser = argparse.ArgumentParser(description=f"{name} head patching on an exchange")
    parser.add_argument("--exchange", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, version = load(args.exchange / "model")
    pairs = read_examples(args.exchange / "examples.parquet")
    with torch.no_grad():
        wall, cpu = time.perf_counter(), time.process_time()
        effects = sweep(model, pairs)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    write_effects(args.out, effects, wall, cpu, f"{name} {version}")
    return 0


def write_effects(path: str | Path, effects, wall: float, cpu: float, version: str) -> None:
    np.savez(path, effects=np.asarray(effects, dtype=np.float64), wall=wall, cpu=cpu,
             version=version)  # fmt: skip


def read_effects(path: str | Path) -> dict:
    with np.load(path) as f:
        return {"effects": f["effects"], "wall": float(f["wall"]), "cpu": float(f["cpu"]),
                "version": str(f["version"])}  # fmt: skip


def write_exchange(model, pairs, out: str | Path) -> Path:
    """``out`` with ``model/`` and ``examples.parquet`` for the peers."""
    from headgeom.model.interop import export_hf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    export_hf(model, np.arange(model.cfg.n_vocab), out / "model")
    write_examples(out / "examples.parquet", pairs)
    return out


def ours(model, pairs) -> np.ndarray:
    """Our exact engine's mean e_{l,h} (L, H) on the same pairs."""
    from headgeom.heads.analysis.patching import patch_all_heads_fast

    clean_ld, patched = patch_all_heads_fast(model, *pairs, batch_size=len(pairs[0]), max_rows=4096)
    return (clean_ld[:, None, None] - patched).mean(axis=0)


def tiny(out: str | Path, seed: int = 0):
    """A small learned-geometry model (3 layers × 4 heads, D = 32, V = 101) with seeded
    random weights, 6 examples of two lengths, and our effects as ``ours.npz``."""
    import torch

    from headgeom.model import registry, zoo

    torch.manual_seed(seed)
    arch = dict(n_layer=3, n_head=4, d_model=32, d_head=8, d_mlp=64, n_ctx=32)
    model = registry.build_model(zoo.derive_model_config("learned", arch, {}), 101).eval()
    rng = np.random.default_rng(seed)
    clean, ref = [], []
    for n in (7, 7, 7, 9, 9, 9):
        c = rng.integers(0, 101, n)
        r = c.copy()
        r[2] = (c[2] + 1 + rng.integers(0, 100)) % 101  # one differing token
        clean.append(c)
        ref.append(r)
    pairs = (clean, ref, rng.integers(0, 101, 6), rng.integers(0, 101, 6))
    write_exchange(model, pairs, out)
    write_effects(Path(out) / "ours.npz", ours(model, pairs), 0.0, 0.0, "headgeom")
    return model, pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", required=True, type=Path, help="the exchange folder to write")
    args = parser.parse_args(argv)
    tiny(args.tiny)
    print(f"wrote {args.tiny}/model, examples.parquet, ours.npz", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
