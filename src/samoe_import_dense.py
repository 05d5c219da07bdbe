"""The dense source of a paper-scale SA-MoE family (SAMOE §4, §19.2): a pinned Hugging Face
checkpoint (SmolLM2-135M, Gemma-3-270m).

    python src/samoe_import_dense.py --config-json '{"family":"smollm2","hf":{"repo_id":
        "HuggingFaceTB/SmolLM2-135M","revision":"93efa2f0..."}}' --checkpoint model.safetensors \\
        --log train_log.parquet --manifest manifest.json

It needs the Hub: offline (``HF_HUB_OFFLINE=1``, or no route to huggingface.co) it stops
before writing anything and says which repository and revision it needs. With the weights
in hand it stops too, naming what is missing: this version upcycles the workspace GPT (the
toy families) only; the paper-scale wrap of the Hub decoder layers (SAMOE §4: each layer's
``mlp`` replaced by the SA-MoE block, the state threaded through a forward-scoped context)
is not built yet. Nothing is written in either case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "log", "manifest"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    repo, revision = cfg["hf"]["repo_id"], cfg["hf"]["revision"]
    where = f"{repo}@{revision}"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        sys.exit(f"samoe_import_dense {cfg['family']}: needs the Hugging Face Hub for {where} "
                 "(HF_HUB_OFFLINE is set); run it where huggingface.co is reachable")  # fmt: skip
    from huggingface_hub import model_info

    try:
        info = model_info(repo, revision=revision, timeout=30)
    except Exception as err:  # no route, no such revision, gated without a token
        sys.exit(f"samoe_import_dense {cfg['family']}: cannot reach {where} on the Hugging "
                 f"Face Hub ({type(err).__name__}: {err}); the paper study needs network "
                 "access for the weights")  # fmt: skip
    sys.exit(
        f"samoe_import_dense {cfg['family']}: {where} ({info.config.get('model_type')}) "
        "is reachable, but this version upcycles the workspace GPT only (the toy "
        "families); the SA-MoE wrap of Hub decoder layers (SAMOE §4) is not built yet"
    )


if __name__ == "__main__":
    sys.exit(main())
