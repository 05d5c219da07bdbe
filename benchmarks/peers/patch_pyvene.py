"""Per-head activation patching with pyvene, for benchmarks/peer_patching.py.

Runs in the peer's own environment (.peers/pyvene-0.1, benchmarks/peers/envs.py) on an
exchange directory (benchmarks/peers/exchange.py) and writes ``--out`` with the mean effect
e_{l,h} of patching head (l, h)'s output, every position, from the ref run into the clean run.

pyvene's GPT-2 component ``head_attention_value_output`` is the input of ``attn.c_proj``
split per head (pyvene/models/gpt2/modelings_intervenable_gpt2.py): each head's output before
the output projection, i.e. TransformerLens's ``hook_z``, not the value vectors
(``head_value_output``, the output of ``c_attn``).

    .peers/pyvene-0.1/bin/python benchmarks/peers/patch_pyvene.py --exchange DIR --out F.npz
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyvene as pv
import torch
from transformers import GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).parent))
import exchange  # noqa: E402


def logit_diff(logits: torch.Tensor, correct: torch.Tensor, incorrect: torch.Tensor) -> float:
    """The group's mean LD at the last position (float64, as our engine reports)."""
    last = logits[:, -1].double()
    rows = torch.arange(len(last))
    return (last[rows, correct] - last[rows, incorrect]).mean().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchange", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    model = GPT2LMHeadModel.from_pretrained(args.exchange / "model", dtype=torch.float32).eval()
    n_layer, n_head = model.config.n_layer, model.config.n_head
    clean, ref, correct, incorrect = exchange.read_examples(args.exchange / "examples.parquet")
    # One wrapper per layer, each a single VanillaIntervention (source replaces base) on the
    # per-head attention output; the unit "h.pos" lets one call pick one head, all positions.
    wrapped = [
        pv.IntervenableModel(pv.IntervenableConfig(
            {"layer": layer, "component": "head_attention_value_output", "unit": "h.pos"},
            intervention_types=pv.VanillaIntervention), model=model)
        for layer in range(n_layer)
    ]  # fmt: skip

    wall, cpu = time.perf_counter(), time.process_time()
    effects = np.zeros((n_layer, n_head))
    for idx in exchange.groups(clean):
        base = {"input_ids": torch.as_tensor(np.stack([clean[i] for i in idx]))}
        source = {"input_ids": torch.as_tensor(np.stack([ref[i] for i in idx]))}
        good, bad = torch.as_tensor(correct[idx]), torch.as_tensor(incorrect[idx])
        clean_ld = logit_diff(model(**base).logits, good, bad)
        batch, seq = base["input_ids"].shape
        for layer in range(n_layer):
            for head in range(n_head):
                # One intervention: ([heads], [positions]) per example, the same for the source
                # (where the activation is read) and the base (where it is written).
                side = [[[[head]] * batch, [list(range(seq))] * batch]]
                _, out = wrapped[layer](
                    base, [source], unit_locations={"sources->base": (side, side)}
                )
                patched = logit_diff(out.logits, good, bad)
                effects[layer, head] += len(idx) * (clean_ld - patched)
    effects /= len(clean)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu

    exchange.write_effects(args.out, effects, wall, cpu, f"pyvene {version('pyvene')}")
    print(f"wrote {args.out} ({wall:.2f} s wall)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
