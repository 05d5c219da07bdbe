"""Figures 1 and 7 from tiny hand-made Parquets (METHODS §17.2)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from headgeom.figures import figure1, figure1_data, figure7, figure7_data, pk_heatmap_matrix
from headgeom.io import write_parquet
from make_figure import main as make_figure_main

N_LAYER, N_HEAD, D_HEAD = 3, 2, 4


def pk_rows(model: str, seed: int, same: float, other: float) -> pd.DataFrame:
    """Write–write rows (l < l') with PK ``same`` on the same index and ``other`` elsewhere,
    plus write→read rows for Q."""
    rows = []
    for (sl, sh), (tl, th) in itertools.product(
        itertools.product(range(N_LAYER), range(N_HEAD)), repeat=2
    ):
        if tl <= sl:
            continue
        pk = same if sh == th else other
        for kind, read_type in (("write_write", None), ("write_read", "Q")):
            rows.append(
                {
                    "model": model,
                    "seed": seed,
                    "kind": kind,
                    "source_layer": sl,
                    "source_head": sh,
                    "target_layer": tl,
                    "target_head": th,
                    "read_type": read_type,
                    "pk": pk,
                    "rho": pk / D_HEAD,
                    "source_dim": D_HEAD,
                    "target_dim": D_HEAD,
                    "same_index": sh == th,
                }
            )
    return pd.DataFrame(rows)


def write_table(path, frame: pd.DataFrame) -> str:
    schema = pa.Schema.from_pandas(frame, preserve_index=False).remove_metadata()
    write_parquet(path, frame, schema, {"analysis": "geometry_stats"})
    return str(path)


@pytest.fixture
def pk_paths(tmp_path):
    return [
        write_table(tmp_path / "learned.parquet", pk_rows("learned", 42, 1.3, 1.4)),
        write_table(tmp_path / "common.parquet", pk_rows("write-common-axis", 42, 4.0, 0.0)),
    ]


@pytest.fixture
def summary_paths(tmp_path):
    paths = []
    for model, seed, frac, frac0, rho in [
        ("learned", 42, 0.75, 1.0, 0.4),
        ("learned", 43, 0.5, 1.0, 0.35),
        ("write-common-axis", 42, 0.25, 0.5, 0.3),
    ]:
        frame = pd.DataFrame(
            [
                {
                    "model": model,
                    "seed": seed,
                    "n_head": N_HEAD,
                    "d_head": D_HEAD,
                    "d_model": N_HEAD * D_HEAD,
                    "own_best_fraction": frac,
                    "own_best_fraction_layer0": frac0,
                    "rho_self_mean": rho,
                }
            ]
        )
        paths.append(write_table(tmp_path / f"{model}-{seed}.parquet", frame))
    return paths


def test_heatmap_matrix_is_symmetric_with_same_layer_blocks_masked():
    rows = pk_rows("m", 1, 4.0, 0.5)
    matrix = pk_heatmap_matrix(rows[rows["kind"] == "write_write"], N_LAYER, N_HEAD)
    n = N_LAYER * N_HEAD
    assert matrix.shape == (n, n)
    for i, j in itertools.product(range(n), repeat=2):
        if i // N_HEAD == j // N_HEAD:
            assert np.isnan(matrix[i, j])
        else:
            assert matrix[i, j] == (4.0 if i % N_HEAD == j % N_HEAD else 0.5)


def test_figure_builders_give_one_panel_per_model(pk_paths, summary_paths):
    data = figure1_data(pk_paths)
    fig = figure1(data)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_visible()]
    assert "learned (s42)" in titles and "write-common-axis (s42)" in titles
    data7 = figure7_data(summary_paths)
    assert data7["chance_own_best"].tolist() == [0.5] * 3
    assert data7["chance_rho_self"].tolist() == [0.5] * 3
    fig7 = figure7(data7)
    assert len(fig7.axes) == 2


def test_figure1_refuses_two_seeds_of_one_model(tmp_path, pk_paths):
    again = write_table(tmp_path / "s43.parquet", pk_rows("learned", 43, 1.0, 1.0))
    with pytest.raises(ValueError, match="one checkpoint per model"):
        figure1_data([*pk_paths, again])


@pytest.mark.parametrize("figure", ["figure1", "figure7"])
def test_make_figure_writes_png_svg_csv_and_sources(tmp_path, pk_paths, summary_paths, figure):
    inputs = pk_paths if figure == "figure1" else summary_paths
    out = tmp_path / "out"

    def run(suffix: str) -> dict:
        names = {ext: out / f"{figure}{suffix}.{ext}" for ext in ("png", "svg", "csv", "json")}
        argv = ["--figure", figure, "--inputs", *inputs, "--out-png", str(names["png"])]
        argv += ["--out-svg", str(names["svg"]), "--out-csv", str(names["csv"])]
        assert make_figure_main([*argv, "--out-sources", str(names["json"])]) == 0
        return names

    names = run("")
    assert names["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert names["png"].stat().st_size > 5000
    svg = names["svg"].read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and len(svg) > 5000
    assert len(pd.read_csv(names["csv"])) > 0
    assert set(json.loads(names["json"].read_text())["inputs"]) == set(inputs)
    again = run("-again")  # same inputs, same bytes
    assert again["svg"].read_bytes() == names["svg"].read_bytes()
    assert again["png"].read_bytes() == names["png"].read_bytes()
