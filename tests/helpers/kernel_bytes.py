"""The bytes of every numpy/scipy linear-algebra step on the demos' paths, printed as JSON
(one SHA-256 per step), for tests/unit/test_kernel_bytes.py to compare across kernel
settings. Run in a fresh process (the libraries read their kernel variables when they load):

    python -m tests.helpers.kernel_bytes

* every demo run's step-0 model (the Haar draws of the rotated geometries: numpy's QR) and
  every other geometry of the registry that exists at the demo's size, seed 42;
* each of those models' weight-space geometry (rank-revealing SVDs, principal cosines: the
  ``geometry_stats`` stage);
* N_eff of many effect matrices and of bootstrap resamples (numpy's float64 ``exp``, the
  resampled means a GEMM of numpy's OpenBLAS);
* the SA-MoE probes: an L-BFGS-B logistic fit (scipy's OpenBLAS), its supervised subspace
  (SVD and QR) and a Gaussian projection.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from headgeom.heads.analysis.geometry_summary import geometry_tables
from headgeom.heads.analysis.stats import bootstrap_n_eff, n_eff_batch
from headgeom.heads.study import Study
from headgeom.model import registry, zoo
from headgeom.samoe.probes import fit_logistic, random_projection, supervised_subspace
from headgeom.training.loop import initial_model

ROOT = Path(__file__).resolve().parents[2]
N_VOCAB = 97


def digest(*arrays) -> str:
    sha = hashlib.sha256()
    for a in arrays:
        sha.update(np.ascontiguousarray(a).tobytes())
    return sha.hexdigest()


def model_digest(model: torch.nn.Module) -> str:
    state = model.state_dict()
    return digest(*(state[k].detach().numpy() for k in sorted(state)))


def frame_digest(frame: pd.DataFrame) -> str:
    return hashlib.sha256(frame.to_csv(index=False, float_format="%.17g").encode()).hexdigest()


def models() -> dict[str, torch.nn.Module]:
    """The demo's step-0 models, then every other geometry at the demo's size (seed 42)."""
    study = Study.from_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    out = {f"{m}-s{s}": initial_model(study.train_config(m, s), N_VOCAB) for m, s in study.runs}
    demo = {study.models[m]["geometry"] for m in study.models}
    arch = study.config["architecture"]
    for geometry in registry.geometry_names():
        if geometry in demo:
            continue
        try:
            model_config = zoo.derive_model_config(geometry, arch, None)
        except ValueError:  # cannot exist at this size (routed, multiscreen)
            continue
        run = {**study.train_config("learned", 42), "model": model_config}
        out[geometry] = initial_model(run, N_VOCAB)
    return out


def main() -> None:
    torch.set_num_threads(1)
    out = {}
    for name, model in models().items():
        out[f"init {name}"] = model_digest(model)
        geo = geometry_tables(model, name, 42, name)
        out[f"geometry {name}"] = frame_digest(geo.pk) + frame_digest(pd.DataFrame([geo.summary]))
    drops = np.random.default_rng(7).standard_normal((40, 4, 4))
    out["n_eff"] = digest(n_eff_batch(drops))
    out["bootstrap n_eff"] = digest(bootstrap_n_eff(drops, 200, seed=3))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((120, 16)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    probe = fit_logistic(x, y, 3, C=1.0)
    out["probe fit"] = digest(probe.weight, probe.bias)
    out["probe subspace"] = digest(supervised_subspace(probe.weight, 6, seed=0))
    out["random projection"] = digest(random_projection(16, 6, seed=0))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
