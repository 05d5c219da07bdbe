"""Paper figures from tiny hand-made Parquets (docs §17.2)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from matplotlib.patches import Circle
from scipy.stats import spearmanr

from headgeom.heads.paper.alignment import figure7, figure7_data
from headgeom.heads.paper.concentration import figure3, figure3_data
from headgeom.heads.paper.lanes import figure5, figure5_data
from headgeom.heads.paper.loss import figure4, figure4_data, figure4_spearman
from headgeom.heads.paper.setup import figure1, figure1_data, pk_heatmap_matrix
from headgeom.heads.stages.make_figure import main as make_figure_main
from headgeom.io import write_parquet
from tests.helpers.results import train_log_s as train_log

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
def figure1_inputs(tmp_path, pk_paths):
    runs = [
        train_log(tmp_path / f"{m}.log.parquet", m, m) for m in ("learned", "write-common-axis")
    ]
    return {"runs": runs, "pk": pk_paths}


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


def test_figure_builders_give_one_panel_per_model(figure1_inputs, summary_paths):
    data = figure1_data(figure1_inputs)
    fig = figure1(data)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_visible()]
    assert "learned (s42)" in titles and "write-common-axis (s42)" in titles
    data7 = figure7_data({"geometry": summary_paths})
    assert data7["chance_own_best"].tolist() == [0.5] * 3
    assert data7["chance_rho_self"].tolist() == [0.5] * 3
    fig7 = figure7(data7)
    assert len(fig7.axes) == 2


def test_figure1_refuses_two_seeds_of_one_model(tmp_path, figure1_inputs):
    again = write_table(tmp_path / "s43.parquet", pk_rows("learned", 43, 1.0, 1.0))
    with pytest.raises(ValueError, match="one checkpoint per model"):
        figure1_data(dict(figure1_inputs, pk=[*figure1_inputs["pk"], again]))


def test_figure1_notes_that_folded_block_readers_lose_a_dimension(tmp_path, figure1_inputs):
    """docs §9.2, §17.2: a block reader's folded read space is the centred block, at most
    d − 1 = 3 dimensional here; all-common-axis (other-index write→read PK 0) still reads no
    other lane, all-rotated (uniform PK) does; free readers get no such note."""
    inputs = {k: list(v) for k, v in figure1_inputs.items()}
    for model, same, other in (("all-common-axis", 4.0, 0.0), ("all-rotated", 1.0, 1.0)):
        inputs["pk"].append(write_table(tmp_path / f"{model}.pk.parquet",
                                        pk_rows(model, 42, same, other)))  # fmt: skip
        inputs["runs"].append(train_log(tmp_path / f"{model}.log.parquet", model, model))
    data = figure1_data(inputs)
    kinds = data.drop_duplicates("model").set_index("model")["reader_kind"].to_dict()
    assert kinds == {"learned": "free", "write-common-axis": "free",
                     "all-common-axis": "block", "all-rotated": "block"}  # fmt: skip
    notes = {ax.get_title(loc="left"): ax.get_xlabel() for ax in figure1(data).axes
             if ax.get_visible() and ax.get_title(loc="left")}  # fmt: skip
    assert notes["all-common-axis (s42)"].endswith(
        "folded readers ≤ 3-dim (LN centres the block),\nstill orthogonal to other lanes"
    )
    assert notes["all-rotated (s42)"].endswith("folded readers ≤ 3-dim (LN centres the block)")
    assert "folded" not in notes["write-common-axis (s42)"] + notes["learned (s42)"]
    with pytest.raises(ValueError, match=r"no training log given for \[\['all-rotated', 42\]\]"):
        figure1_data(dict(inputs, runs=inputs["runs"][:-1]))


# --------------------------------------------------------------------------- Figures 3–5
def write_rows(path, rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    schema = pa.Schema.from_pandas(frame, preserve_index=False).remove_metadata()
    write_parquet(path, frame, schema)
    return str(path)


#: 3 layers × 4 heads (not square, so a transposed image cannot pass). Panel ("b", "sva")
#: has its largest |e| negative (−2.0 at layer 2, head 1) and its largest e at (0, 3).
L5, H5 = 3, 4
E5 = {
    ("a", "sva"): np.arange(L5 * H5, dtype=float).reshape(L5, H5) / 10 - 0.3,
    ("a", "quote"): np.diag([1.5, -0.1, 0.05]) @ np.ones((L5, H5)) * 0.5,
    ("b", "sva"): np.array([[0.1, 0.0, 0.2, 1.2], [0.0, -0.1, 0.3, 0.0], [0.05, -2.0, 0.0, 0.1]]),
    ("b", "quote"): np.full((L5, H5), 0.01) + np.eye(L5, H5) * 0.6,
}


@pytest.fixture
def figure5_inputs(tmp_path):
    inputs = {"runs": [], "heads": [], "lanes": [], "eval": []}
    for model in ("a", "b"):
        inputs["runs"].append(train_log(tmp_path / f"{model}.run.parquet", model, "learned"))
    for (model, task), e in E5.items():
        rows = [
            {
                "model": model,
                "seed": 42,
                "task": task,
                "split": split,
                "layer": layer,
                "head": head,
                "e": float(e[layer, head] * scale),
            }
            for split, scale in (("discovery", 1.0), ("evaluation", -7.0))
            for layer in range(L5)
            for head in range(H5)
        ]
        stem = tmp_path / f"{model}.{task}"
        inputs["heads"].append(write_rows(f"{stem}.heads.parquet", rows))
        lane = {
            "model": model,
            "seed": 42,
            "task": task,
            "split": "discovery",
            "lambda_score": 0.5,
            "p_value": 0.0123,
        }
        inputs["lanes"].append(write_rows(f"{stem}.lanes.parquet", [lane]))
        inputs["eval"].append(
            write_rows(
                f"{stem}.eval.parquet",
                [
                    {
                        "model": model,
                        "seed": 42,
                        "task": task,
                        "split": s,
                        "n": 8,
                        "accuracy": 1.0,
                        "margin": m,
                    }
                    for s, m in (("discovery", 3.25), ("evaluation", 9.0))
                ],
            )
        )
    return inputs


def panels(fig) -> dict[tuple[str, str], object]:
    """(row label, task title) → axes of every heat-map panel."""
    out = {}
    for ax in fig.axes:
        if ax.images and ax.get_title(loc="left"):
            task = ax.get_title(loc="left").split(":")[0]
            out[(ax.get_subplotspec().rowspan.start, task)] = ax
    return out


def test_figure5_draws_layer0_at_the_bottom_and_heads_on_x(figure5_inputs):
    data = figure5_data(figure5_inputs)
    fig = figure5(data)
    found = panels(fig)
    assert len(found) == 4
    for (row, task), ax in found.items():
        e = E5[("ab"[row], task.lower())]
        image = ax.images[0]
        array = np.asarray(image.get_array())
        assert array.shape == (L5, H5)  # rows = layers, columns = head index
        np.testing.assert_array_equal(array, e)  # discovery split, not evaluation
        assert image.origin == "lower"
        # where layer 0 and the last layer land on the canvas: layer 0 is lower
        y0 = ax.transData.transform((0, 0))[1]
        y_last = ax.transData.transform((0, L5 - 1))[1]
        assert y0 < y_last
        x0, x_last = ax.transData.transform((0, 0))[0], ax.transData.transform((H5 - 1, 0))[0]
        assert x0 < x_last
        assert [int(t) for t in ax.get_yticks()] == list(range(L5))


def test_figure5_shares_one_asinh_colour_scale(figure5_inputs):
    data = figure5_data(figure5_inputs)
    fig = figure5(data)
    images = [ax.images[0] for ax in panels(fig).values()]
    norm = images[0].norm
    assert all(im.norm is norm for im in images)  # one object: one scale
    vmax = max(np.abs(e).max() for e in E5.values())  # 2.0, over every panel
    assert (norm.vmin, norm.vmax) == (-vmax, vmax)
    for x in (-1.7, -0.2, 0.0, 0.05, 0.3, 2.0):
        expected = (np.arcsinh(x / 0.2) + np.arcsinh(vmax / 0.2)) / (2 * np.arcsinh(vmax / 0.2))
        assert float(norm(x)) == pytest.approx(expected, abs=1e-12)
    red, blue = images[0].cmap(norm(1.0)), images[0].cmap(norm(-1.0))
    assert red[0] > red[2] and blue[2] > blue[0]  # positive (patch hurts) = red
    colourbar = [ax for ax in fig.axes if not ax.get_title(loc="left") and not ax.images][0]
    ticks = list(colourbar.get_yticks())
    assert ticks == [-2.0, -1.0, -0.2, 0.0, 0.2, 1.0, 2.0]  # logit units, not asinh units
    labels = [t.get_text() for t in colourbar.get_yticklabels()]
    assert labels == ["−2", "−1", "−0.2", "0", "0.2", "1", "2"]


def test_figure5_circles_the_largest_drop_not_the_largest_magnitude(figure5_inputs):
    data = figure5_data(figure5_inputs)
    fig = figure5(data)
    for (row, task), ax in panels(fig).items():
        e = E5[("ab"[row], task.lower())]
        layer, head = np.unravel_index(np.argmax(e), e.shape)  # signed: the largest drop
        rings = [p for p in ax.patches if isinstance(p, Circle)]
        assert len(rings) == 2  # a black ring on a white one, both around the top head
        assert {r.center for r in rings} == {(head, layer)}  # x = head, y = layer
        assert f"top L{layer}.H{head}" in ax.get_title(loc="left")
        assert "base LD 3.25" in ax.get_title(loc="left")  # discovery margin
        assert "Λ 0.50 (p 0.012)" in ax.get_title(loc="left")
    b_sva = data[(data["model"] == "b") & (data["task"] == "sva")]
    ringed = b_sva[b_sva["is_top_head"]]
    # e = +1.2 at L0.H3 is the largest drop; e = −2.0 at L2.H1 (a patch that helps) is the
    # largest |e|, the older view's ring, kept in the source data only
    assert (int(ringed["layer"].iloc[0]), int(ringed["head"].iloc[0])) == (0, 3)
    older = b_sva[b_sva["is_largest_abs_head"]]
    assert (int(older["layer"].iloc[0]), int(older["head"].iloc[0])) == (2, 1)
    share = ringed["top_head_share"].iloc[0]
    assert share == pytest.approx(1.2 / np.abs(E5[("b", "sva")]).sum())


def test_figure5_marks_a_lambda_beyond_the_papers_runs_as_extra(tmp_path, figure5_inputs):
    """docs §13.1: learned on corpus S is one of the paper's Λ runs; write-common-axis on
    corpus S is not (the paper's is plain-identity42 on R): its Λ is extra."""
    runs = [figure5_inputs["runs"][0],
            train_log(tmp_path / "b.wca.parquet", "b", "write-common-axis")]  # fmt: skip
    data = figure5_data(dict(figure5_inputs, runs=runs))
    assert data.groupby("model")["paper_lambda"].first().to_dict() == {"a": True, "b": False}
    titles = {r: ax.get_title(loc="left") for (r, _), ax in panels(figure5(data)).items()}
    assert "Λ 0.50 (p 0.012)" in titles[0] and "extra" not in titles[0]
    assert "Λ 0.50 (p 0.012, extra)" in titles[1]


def test_figure5_refuses_a_panel_without_its_lane_row(figure5_inputs):
    inputs = dict(figure5_inputs, lanes=figure5_inputs["lanes"][1:])
    with pytest.raises(ValueError, match=r"no lanes of split 'discovery' row for \[\['a', 42"):
        figure5_data(inputs)


# Paper Table 6 N_eff (SVA, quote, plural) and §6.1 validation losses of the 9 corpus-S
# models of Figure 4; C16: Spearman −0.767 (9 models) and −0.943 (six 12-head models).
PAPER_FIGURE4 = [
    ("learned", "free", 12, 3.508, (10.4, 12.0, 9.2)),
    ("write-rotated", "free", 12, 3.563, (16.2, 22.2, 22.2)),
    ("write-routed A", "free", 16, 3.542, (18.9, 31.6, 20.3)),
    ("write-routed B", "free", 16, 3.543, (29.1, 29.0, 21.6)),
    ("write-routed C", "free", 16, 3.553, (31.1, 39.7, 15.8)),
    ("read-common", "block", 12, 3.610, (8.1, 11.0, 10.0)),
    ("all-common-axis", "block", 12, 3.698, (8.1, 12.7, 3.9)),
    ("all-rotated", "block", 12, 3.751, (9.1, 11.4, 3.6)),
    ("all-rotated-self", "block", 12, 3.753, (8.8, 7.9, 3.9)),
]


@pytest.fixture
def loss_path(tmp_path):
    rows = [
        {
            "model": name,
            "seed": 42,
            "display_name": name,
            "geometry": name,
            "corpus": "S",
            "reader_type": reader,
            "n_head": heads,
            "index_meaningful": heads == 12,
            "val_loss": loss,
            "N_eff_sva": n[0],
            "N_eff_quote": n[1],
            "N_eff_plural": n[2],
            "N_eff_geomean": float(np.exp(np.mean(np.log(n)))),
            "included": True,
        }
        for name, reader, heads, loss, n in PAPER_FIGURE4
    ]
    rows.append(dict(rows[0], model="extra", display_name="extra", val_loss=9.0))
    return write_rows(tmp_path / "loss.parquet", rows)


def test_figure4_spearman_is_scipys_on_the_plotted_points(loss_path):
    models = [name for name, *_ in PAPER_FIGURE4]
    data = figure4_data({"loss": [loss_path]}, models=models)
    assert data["model"].tolist() == models  # "extra" is not plotted
    rho = figure4_spearman(data)
    assert rho["all"][0] == pytest.approx(
        spearmanr(data["val_loss"], data["N_eff_geomean"]).statistic, abs=1e-15
    )
    twelve = data[data["n_head"] == 12]
    assert rho["base_heads"] == (
        pytest.approx(spearmanr(twelve["val_loss"], twelve["N_eff_geomean"]).statistic),
        6,
    )
    # C16 (docs §12.7): the paper's own numbers
    assert round(rho["all"][0], 3) == -0.767 and round(rho["base_heads"][0], 3) == -0.943
    fig = figure4(data)
    ax = fig.axes[0]
    assert "−0.77 (9 models)" in ax.get_title(loc="left")
    assert "−0.94 (6 with base heads/layer)" in ax.get_title(loc="left")
    # plotted points are the data: x = loss, y = geometric-mean N_eff
    xy = np.vstack([c.get_offsets() for c in ax.collections])
    assert sorted(map(tuple, xy)) == sorted(
        zip(data["val_loss"], data["N_eff_geomean"], strict=True)
    )
    open_markers = [c for c in ax.collections if len(c.get_facecolors()) == 0]
    assert len(open_markers) == 1 and len(open_markers[0].get_offsets()) == 3  # 16 heads
    with pytest.raises(ValueError, match=r"models \['nope'\] are not in the loss Parquet"):
        figure4_data({"loss": [loss_path]}, models=["nope"])


@pytest.fixture
def figure3_inputs(tmp_path):
    runs = [train_log(tmp_path / f"{m}.run.parquet", m, m) for m in ("learned", "all-rotated")]
    rows = []
    for i, (model, task) in enumerate(itertools.product(("learned", "all-rotated"), E5_TASKS)):
        n_eff = 5.0 + i
        ci = (n_eff - 1.0, n_eff + 0.5) if model == "learned" else (np.nan, np.nan)
        rows.append(
            {
                "model": model,
                "seed": 42,
                "task": task,
                "split": "evaluation",
                "N_eff": n_eff,
                "N_eff_ci_low": ci[0],
                "N_eff_ci_high": ci[1],
                "ci_level": 0.95,
                "n_bootstrap": 2000,
            }
        )
    paths = [write_rows(tmp_path / f"r{i}.parquet", [r]) for i, r in enumerate(rows)]
    return {"runs": runs, "robustness": paths}


E5_TASKS = ("sva", "quote", "plural")


def test_figure3_bars_are_n_eff_with_bootstrap_error_bars(figure3_inputs):
    data = figure3_data(figure3_inputs)
    fig = figure3(data)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 9) for p in ax.patches)
    assert heights == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # error bars only where an interval exists (learned), spanning [low, high]
    segments = [s for c in ax.collections for s in c.get_segments()]
    spans = sorted((round(s[0][1], 9), round(s[1][1], 9)) for s in segments)
    assert spans == [(4.0, 5.5), (5.0, 6.5), (6.0, 7.5)]
    assert "95% bootstrap percentile intervals (2,000 resamples" in ax.get_title(loc="left")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["SVA", "Quote", "Plural"]


@pytest.mark.parametrize("figure", ["figure1", "figure3", "figure4", "figure5", "figure7"])
def test_make_figure_writes_png_svg_csv_and_sources(
    tmp_path, figure1_inputs, summary_paths, figure3_inputs, loss_path, figure5_inputs, figure
):
    inputs = {
        "figure1": figure1_inputs,
        "figure3": figure3_inputs,
        "figure4": {"loss": [loss_path]},
        "figure5": figure5_inputs,
        "figure7": {"geometry": summary_paths},
    }[figure]
    out = tmp_path / "out"

    def run(suffix: str) -> dict:
        names = {ext: out / f"{figure}{suffix}.{ext}" for ext in ("png", "svg", "csv", "json")}
        argv = ["--figure", figure]
        for kind, paths in inputs.items():
            argv += ["--input", kind, *paths]
        if figure == "figure4":
            argv += ["--models", *[name for name, *_ in PAPER_FIGURE4]]
        argv += ["--out-png", str(names["png"]), "--out-svg", str(names["svg"])]
        argv += ["--out-csv", str(names["csv"]), "--out-sources", str(names["json"])]
        assert make_figure_main(argv) == 0
        return names

    names = run("")
    assert names["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert names["png"].stat().st_size > 5000
    svg = names["svg"].read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and len(svg) > 5000
    assert len(pd.read_csv(names["csv"])) > 0
    sources = json.loads(names["json"].read_text())
    assert set(sources["inputs"]) == {p for paths in inputs.values() for p in paths}
    assert set(sources["kinds"]) == set(inputs)
    again = run("-again")  # same inputs, same bytes
    assert again["svg"].read_bytes() == names["svg"].read_bytes()
    assert again["png"].read_bytes() == names["png"].read_bytes()


def test_coordinate_shares_curve_is_the_cumulative_share_in_validation_order(tmp_path):
    from headgeom.heads.paper.coordinates import coordinate_shares, coordinate_shares_data

    # 4 directions, validation ranks 2, 1, 4, 3; evaluation drops 0.5, 1.0, -0.5, 0.5
    # (Σ positive = 2.0): in rank order 1.0, 0.5, 0.5, -0.5 → cumulative .5, .75, 1.0, .75
    ident = {"model": "learned", "seed": 42, "task": "sva", "site": "after_wo"}
    directions = [
        {**ident, "direction": g, "drop_evaluation": e, "rank_validation": r}
        for g, (e, r) in enumerate([(0.5, 2), (1.0, 1), (-0.5, 4), (0.5, 3)])
    ]
    summary = [{**ident, "best_layer": 1, "best_head": 0, "share_evaluation": 1.0,
                "share_in_sample": 1.0, "null_p95": 0.6,
                "beats_every_random_set": True}]  # fmt: skip
    inputs = {
        "runs": [train_log(tmp_path / "log.parquet", "learned", "learned")],
        "directions": [write_rows(tmp_path / "directions.parquet", directions)],
        "coordinates": [write_rows(tmp_path / "coordinates.parquet", summary)],
    }
    data = coordinate_shares_data(inputs)
    assert data["rank_validation"].tolist() == [1, 2, 3, 4]
    assert data["direction"].tolist() == [1, 0, 3, 2]
    np.testing.assert_allclose(data["cumulative_share"], [0.5, 0.75, 1.0, 0.75])
    assert (data["null_p95"] == 0.6).all()
    fig = coordinate_shares(data)
    (ax,) = [a for a in fig.axes if a.lines]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.75, 1.0, 0.75])
    del inputs["directions"]
    with pytest.raises(ValueError, match="directions"):
        coordinate_shares_data(inputs)
