"""Export a `learned` checkpoint as a Hugging Face GPT2LMHeadModel directory.

    python -m headgeom.heads.stages.export_hf --checkpoint CKPT --manifest MANIFEST --out-dir .../hf

Writes ``config.json`` + ``model.safetensors`` (loadable with
``transformers.GPT2LMHeadModel.from_pretrained``; its vocabulary is the checkpoint's model
vocabulary, compact ids) and ``headgeom.json`` (model id → GPT-2 id map and the checkpoint
and manifest hashes). The checkpoint is verified against its manifest first; geometries
other than ``learned`` are refused. Needs neither transformers nor TransformerLens.
"""

from __future__ import annotations

import argparse
import sys

from headgeom import results
from headgeom.model.checkpoint import load_verified
from headgeom.model.interop import export_hf, require_learned
from headgeom.runtime import set_threads


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="safetensors checkpoint")
    parser.add_argument("--manifest", required=True, help="its JSON manifest")
    parser.add_argument("--out-dir", required=True, help="directory to write (replaced)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(args.threads)
    model, vocab, manifest = load_verified(args.checkpoint, args.manifest)
    require_learned(model, args.checkpoint)
    out = export_hf(model, vocab, args.out_dir, results.provenance(manifest))
    print(f"wrote {out} ({model.cfg.n_vocab} model ids)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
