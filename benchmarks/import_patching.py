"""All-heads patching of an imported GPT-2 (docs §10.1): our exact engine against
TransformerLens on the same weights and examples, in one run.

    python benchmarks/import_patching.py                     # 12×12, D = 768, 8 SVA examples
    python benchmarks/import_patching.py --n-examples 16 --threads 2

The model is a random ``transformers`` GPT2LMHeadModel of GPT-2 small's shape (12 layers ×
12 heads, D = 768, V = 50,257, 1,024 positions; nothing is downloaded), written with
``save_pretrained`` to a temporary directory and brought in the way a user brings one:

* ours: ``headgeom.model.importing.import_hf_gpt2`` (the ``import_model`` rule's code), then
  ``patch_all_heads_fast``;
* TransformerLens: a ``HookedTransformer`` loaded from the same HF model with TL's own
  converter (``convert_gpt2_weights``), then ``get_act_patch_attn_head_out_all_pos`` per
  equal-length group with a mean-logit-difference metric.

Examples are the first ``--n-examples`` SVA evaluation examples of the default study's
task generator (real GPT-2 ids, the full vocabulary as imported models use it). Prints both
times (wall and process CPU), the speed-up, and the max |Δ| between the two engines' per-head
mean effects e_{l,h} = mean over examples of (clean − patched) logit difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patching_engine import Clock, run_tl, task_examples  # noqa: E402

from headgeom.heads.analysis.patching import patch_all_heads_fast  # noqa: E402
from headgeom.model.importing import import_hf_gpt2  # noqa: E402


def random_gpt2(seed: int):
    """GPT-2 small's shape with transformers' own random initialisation."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def transformer_lens_of(hf):
    """A HookedTransformer holding ``hf``'s weights via TL's GPT-2 converter (not our code)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head,
        n_heads=c.n_head, d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, act_fn="gelu_new",
        normalization_type="LN", default_prepend_bos=False,
        original_architecture="GPT2LMHeadModel", device="cpu", dtype=torch.float32,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tl = HookedTransformer(cfg)
    state = tl.state_dict()
    state.update(convert_gpt2_weights(hf, cfg))
    tl.load_state_dict(state, strict=True)
    return tl.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-examples", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=128, help="examples per batch (ours)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf = random_gpt2(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        with Clock() as load:
            model, _, record = import_hf_gpt2(tmp)
    print(
        f"imported GPT-2 shape {model.cfg.n_layer}×{model.cfg.n_head}, D = {model.cfg.d_model}, "
        f"V = {model.cfg.n_vocab} ({', '.join(record['files_sha256'])}) in {load.wall:.1f} s; "
        f"{torch.get_num_threads()} threads"
    )
    pairs = task_examples("sva", args.n_examples, "evaluation")
    lengths = sorted({len(x) for x in pairs[0]})
    print(f"{args.n_examples} SVA evaluation examples, lengths {lengths}")
    with Clock() as ours:
        clean_ld, patched = patch_all_heads_fast(
            model, *pairs, batch_size=args.batch_size, max_rows=4096
        )
    e_ours = (clean_ld[:, None, None] - patched).mean(axis=0)
    tl = transformer_lens_of(hf)
    tl_clock, e_tl = run_tl(tl, pairs)
    delta = float(np.max(np.abs(e_ours - e_tl)))
    print(f"ours             {ours.wall:8.1f} s wall {ours.cpu:8.1f} s CPU")
    print(f"TransformerLens  {tl_clock.wall:8.1f} s wall {tl_clock.cpu:8.1f} s CPU")
    print(
        f"speed-up ×{tl_clock.wall / ours.wall:.1f} (wall), ×{tl_clock.cpu / ours.cpu:.1f} (CPU); "
        f"max |Δe| = {delta:.2e} (max |e| = {np.abs(e_tl).max():.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
