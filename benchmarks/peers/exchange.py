"""What our harness hands each peer and reads back (benchmarks/peer_patching.py).

An exchange directory holds:

* ``model/``: the model as a ``transformers`` directory (config.json, model.safetensors),
  which every peer loads in its own way: one of our GPT models as a GPT-2
  (``headgeom.model.interop.export_hf``), a ``transformers`` model we wrap
  (``headgeom.model.hf.HFCausalLM``, e.g. SmolLM2 dequantised from its GGUF) as itself, its
  float32 weights bit for bit (:func:`save_transformers`);
* ``examples.parquet``: one row per example, ``clean_ids`` and ``ref_ids`` (list<int64>,
  model ids, equal lengths within a row), ``correct_id`` and ``incorrect_id`` (int64);
* after a peer has run, ``<peer>.npz``: ``effects`` (L, H) float64, the mean over examples of
  e_{l,h} = LD(clean) − LD(clean with head (l, h)'s output, every position, taken from the
  ref run), LD = logit[correct] − logit[incorrect] at the last position; ``wall`` and ``cpu``
  (seconds of the patching sweep, the model already loaded), and ``version`` (the peer's).

A peer finds each layer's output projection, whose input is every query head's output
(z) concatenated head-major, by the directory's ``model_type`` (:data:`LAYOUT`,
:func:`out_projections`).

Peers patch per equal-length group (the metric is the group's mean LD) and weight groups by
their size, as TransformerLens's ``get_act_patch_attn_head_out_all_pos`` is used in
benchmarks/patching_engine.py.

    python benchmarks/peers/exchange.py --tiny DIR   # a small model and examples, and our
                                                     # effects as DIR/ours.npz (for peer tests)
    python benchmarks/peers/exchange.py --tiny DIR --llama   # the same, a grouped-query Llama
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
#: model_type -> (the ModuleList of layers, a layer's output projection), dotted paths.
LAYOUT = {
    "gpt2": ("transformer.h", "attn.c_proj"),
    "llama": ("model.layers", "self_attn.o_proj"),
}


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


def head_shape(config) -> tuple[int, int, int]:
    """(layers, query heads, d_head) of a ``transformers`` config (GPT-2's names are aliases
    of these; a config without ``head_dim`` splits the width evenly)."""
    n_head = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_head
    return config.num_hidden_layers, n_head, d_head


def _walk(obj, dotted: str):
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def out_projections(root, config) -> list:
    """Each layer's output projection under ``root``: a ``transformers`` model or anything
    that mirrors its module tree by attribute and index (nnsight's ``NNsight(model)``)."""
    if config.model_type not in LAYOUT:
        raise ValueError(
            f"model_type {config.model_type!r}: no layout for the peers; known: {sorted(LAYOUT)}"
        )
    layers, proj = LAYOUT[config.model_type]
    layers = _walk(root, layers)
    return [_walk(layers[i], proj) for i in range(config.num_hidden_layers)]


def load_transformers(model_dir: Path):
    """The exchange's model as ``transformers`` loads any causal LM directory, float32, eval."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


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


def save_transformers(hf, out: str | Path) -> Path:
    """A ``transformers`` model as a plain directory (config.json, model.safetensors), its
    tensors as they are. A model dequantised from a GGUF file keeps the GGUF's
    ``quantization_config``, which ``save_pretrained`` refuses: the copy saved is the same
    class on the same tensors (no copy: ``assign``) with that entry dropped, and with its
    ``architectures`` named (some peers read it)."""
    import torch

    d = hf.config.to_dict()
    d.pop("quantization_config", None)
    config = type(hf.config).from_dict(d)
    config.architectures = [type(hf).__name__]
    with torch.device("meta"):  # no second set of initialised weights
        plain = type(hf)(config)
    plain.load_state_dict(hf.state_dict(), assign=True)
    plain.tie_weights()  # tied embeddings: the head is the embedding again
    plain.save_pretrained(out, safe_serialization=True)
    return Path(out)


def write_exchange(model, pairs, out: str | Path) -> Path:
    """``out`` with ``model/`` and ``examples.parquet`` for the peers: a ``transformers``
    model we wrap (``model.hf``) as itself, one of ours as a GPT-2."""
    from headgeom.model.interop import export_hf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "hf"):
        save_transformers(model.hf, out / "model")
    else:
        export_hf(model, np.arange(model.cfg.n_vocab), out / "model")
    write_examples(out / "examples.parquet", pairs)
    return out


def ours(model, pairs) -> np.ndarray:
    """Our exact engine's mean e_{l,h} (L, H) on the same pairs."""
    from headgeom.heads.analysis.patching import patch_all_heads_fast

    clean_ld, patched = patch_all_heads_fast(model, *pairs, batch_size=len(pairs[0]), max_rows=4096)
    return (clean_ld[:, None, None] - patched).mean(axis=0)


def tiny(out: str | Path, seed: int = 0, llama: bool = False):
    """A small model with seeded random weights, 6 examples of two lengths, and our effects
    as ``ours.npz``: learned geometry (3 layers × 4 heads, D = 32, V = 101), or with
    ``llama`` a ``transformers`` Llama of the same size whose 4 query heads share 2
    key/value heads (rotary positions, gated MLP, tied embeddings)."""
    import torch

    from headgeom.model import registry, zoo

    torch.manual_seed(seed)
    if llama:
        import transformers  # the hf extra: only the Llama needs it

        from headgeom.model.hf import HFCausalLM

        config = transformers.LlamaConfig(
            vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=32, tie_word_embeddings=True, initializer_range=0.3,
        )  # fmt: skip
        model = HFCausalLM.wrap(transformers.LlamaForCausalLM(config).eval())
    else:
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
    parser.add_argument("--llama", action="store_true", help="a grouped-query Llama")
    args = parser.parse_args(argv)
    tiny(args.tiny, llama=args.llama)
    print(f"wrote {args.tiny}/model, examples.parquet, ours.npz", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
