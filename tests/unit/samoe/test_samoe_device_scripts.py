"""The SA-MoE analysis scripts' ``--device`` on the CPU: each refuses a CUDA device this
machine lacks before reading anything, naming the flag; and capture, probes, interventions
and Li, run on tiny random checkpoints, write bitwise the same tables with ``--device cpu``
as with the default, recording the device in each Parquet's metadata. (The CUDA path has
not been run on a GPU here.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from headgeom.hashing import sha256_file
from headgeom.io import write_manifest
from headgeom.samoe import results
from headgeom.samoe.checkpoint import save_moe
from headgeom.samoe.rankings import select_targets
from headgeom.samoe.stages import audit_cost as samoe_audit_cost
from headgeom.samoe.stages import capture as samoe_capture
from headgeom.samoe.stages import interventions as samoe_interventions
from headgeom.samoe.stages import li as samoe_li
from headgeom.samoe.stages import probes as samoe_probes
from headgeom.samoe.stages import quality as samoe_quality
from tests.helpers import samoe as h

T, LAYERS = 24, [4, 5]
CONFIG = {
    "local_suppression": {"lambdas": [1.0, 0.5, 0.0]},
    "probes": {"pairs": [[2, 4], [3, 5]], "long_horizon": [[2, 4]], "budgets": [60, 120],
               "dim": 4, "n_random_projections": 2, "C_grid": [0.1, 1.0],
               "controls_at_top_budget_only": True},
    "interventions": {"bootstrap": 100, "bootstrap_seed": 2000},
}  # fmt: skip
SCRIPTS = {
    "capture": samoe_capture,
    "probes": samoe_probes,
    "interventions": samoe_interventions,
    "li": samoe_li,
    "quality": samoe_quality,
    "audit_cost": samoe_audit_cost,
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Pools (construction 6, calibration 3, final 6 of which 3 intervention sequences), the
    corpus manifest over them, the audited targets and a checkpoint with its manifest per
    variant (the vocabulary map is the identity)."""
    d = tmp_path_factory.mktemp("samoe_devices")
    rng = np.random.default_rng(0)
    rows = []
    for role, n in (("construction", 6), ("calibration", 3), ("final", 6)):
        for i in range(n):
            rows.append({"role": role, "domain": ("prose", "code", "math")[i % 3],
                         "seq_id": f"{role}-{i:04d}", "intervention": role == "final" and i < 3,
                         "tokens": rng.integers(0, h.N_VOCAB, T).astype(np.int32)})  # fmt: skip
    pools = pd.DataFrame(rows)
    results.POOLS.write(d / "pools.parquet", pools)
    write_manifest(d / "corpus.json", {"files": {"pools": sha256_file(d / "pools.parquet")}})
    sub = pools[pools.intervention]
    targets = select_targets("toy", sub.seq_id.tolist(), np.stack(sub.tokens), LAYERS, eos=-1)
    results.TARGETS.write(d / "targets.parquet", targets.assign(family="toy"))
    out = {"dir": d, "pools": d / "pools.parquet", "corpus": d / "corpus.json",
           "targets": d / "targets.parquet"}  # fmt: skip
    for variant, kwargs in (("persistent", {"seed": 3, "write_std": 0.4}),
                            ("latest", {"seed": 3, "write_std": 0.4}),
                            ("ordinary", {"seed": 4})):  # fmt: skip
        ckpt = d / f"{variant}.safetensors"
        save_moe(ckpt, h.random_model(variant, **kwargs), np.arange(h.N_VOCAB))
        write_manifest(d / f"{variant}.json", {"checkpoint_file_sha256": sha256_file(ckpt)})
        out[variant] = ckpt
    return out


def argv(script: str, inp: dict, variant: str, out: Path) -> list[str]:
    """The script's arguments for ``variant``, its outputs under ``out``."""
    if script == "audit_cost":
        v = ("ordinary", "latest", "persistent")
        return ["--family", "toy", "--seed", "42", "--device", "auto",
                "--checkpoints", *(str(inp[x]) for x in v),
                "--manifests", *(str(inp["dir"] / f"{x}.json") for x in v),
                "--pools", str(inp["pools"]), "--targets", str(inp["targets"]),
                "--corpus-manifest", str(inp["corpus"]),
                "--audit-cost", str(out / "audit_cost.parquet"),
                "--runtime", str(out / "runtime.parquet")]  # fmt: skip
    common = ["--run-json", json.dumps({"family": "toy", "variant": variant, "seed": 42}),
              "--device", "auto",  # config analysis_device's default
              "--checkpoint", str(inp[variant]),
              "--manifest", str(inp["dir"] / f"{variant}.json"),
              "--pools", str(inp["pools"]), "--corpus-manifest", str(inp["corpus"])]  # fmt: skip
    if script == "quality":
        return [*common, "--downstream", str(inp["dir"] / "downstream.parquet"),
                "--out", str(out / "quality.parquet")]  # fmt: skip
    common += ["--config-json", json.dumps(CONFIG)]
    if script == "probes":
        return [*common, "--out", str(out / "probes.parquet")]
    common += ["--targets", str(inp["targets"])]
    if script == "capture":
        return [*common, *(x for name in ("state-geometry", "local-suppression", "history",
                                          "history-pool")
                           for x in (f"--{name}", str(out / f"{name}.parquet")))]  # fmt: skip
    return [*common, "--out", str(out / f"{script}.parquet"),
            "--rankings", str(out / "rankings.parquet")]  # fmt: skip


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_cuda_without_cuda_is_refused_before_any_input_is_read(script, tmp_path, monkeypatch,
                                                               capsys):  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    missing = {"dir": tmp_path, **{k: tmp_path / "missing" for k in
               ("pools", "corpus", "targets", "persistent", "latest", "ordinary")}}  # fmt: skip
    with pytest.raises(SystemExit) as err:
        SCRIPTS[script].main([*argv(script, missing, "persistent", tmp_path), "--device", "cuda"])
    assert err.value.code == 2
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


def tables(folder: Path) -> dict[str, tuple]:
    """Every Parquet of ``folder``: (its data, its metadata) by file name."""
    out = {}
    for path in sorted(folder.glob("*.parquet")):
        table = pq.read_table(path)
        out[path.name] = (table.replace_schema_metadata(None), table.schema.metadata)
    return out


@pytest.mark.parametrize("script, variant", [("capture", "persistent"), ("capture", "latest"),
                                             ("probes", "persistent"),
                                             ("interventions", "persistent"),
                                             ("li", "ordinary")])  # fmt: skip
def test_explicit_cpu_writes_bitwise_the_default_tables(script, variant, inputs, tmp_path):
    default, explicit = tmp_path / "default", tmp_path / "cpu"
    default.mkdir(), explicit.mkdir()
    assert SCRIPTS[script].main(argv(script, inputs, variant, default)) == 0
    assert SCRIPTS[script].main([*argv(script, inputs, variant, explicit), "--device", "cpu"]) == 0
    got, want = tables(explicit), tables(default)
    assert list(got) == list(want) and got
    for name, (data, meta) in want.items():
        assert got[name][0].equals(data), name  # the same values, bit for bit
        assert got[name][1] == meta, name  # and the same metadata, the device included
        assert meta[b"device"] == b"cpu", name  # strings are stored as they are
