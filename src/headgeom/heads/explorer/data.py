"""What the explorer shows, read from a study's Parquets (docs §19): one table per view, per
run, with the rows exactly as the Parquet holds them and only the columns the view uses.

A view never computes science of its own. The one number that is not a stored column is a
head's 95% interval, the Student-t interval of the mean drop e over the split's examples
(e is the mean of the per-example drops d in the effects Parquet, docs §10.1), so the grid
can show how sure each cell is; :func:`head_intervals` derives it with ``scipy.stats``.

Each table records where it came from (:class:`Source`: the path and the SHA-256 the results
catalog lists for it), and the page says so under every view.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from headgeom import results
from headgeom.hashing import sha256_file
from headgeom.io import read_table
from headgeom.paths import rerun_hint

#: [CHOICE] Coverage of a head's interval in the grid's hover (two-sided Student-t).
INTERVAL_LEVEL = 0.95
#: [CHOICE] The leakage view marks a source head's strongest readers: this many, by L.
TOP_PAIRS = 3
#: [CHOICE] The edge view lists a head's strongest edges in and out: this many each, by KL.
TOP_EDGES = 8

#: view -> (result table, the columns the view embeds). Per-run views; timeline is global.
COLUMNS: dict[str, tuple[results.ResultTable, tuple[str, ...]]] = {
    "heads": (results.HEADS, ("task", "split", "layer", "head", "e", "p")),
    "geometry": (
        results.GEOMETRY_HEADS,
        ("layer", "head", "pk_self", "pk_best_other", "own_best", "rho_self", "idempotence"),
    ),
    "leakage": (
        results.LEAKAGE,
        (
            "task",
            "split",
            "source_layer",
            "source_head",
            "reader_layer",
            "reader_head",
            "read_type",
            "leakage",
            "rho",
            "leakage_over_rho",
        ),
    ),  # fmt: skip
    "clamps": (
        results.CLAMP_PATHS,
        (
            "task",
            "split",
            "rank",
            "layer",
            "head",
            "e_stored",
            "direct",
            "via_attention_a",
            "via_mlps_a",
            "via_attention_b",
            "via_mlps_b",
            "interaction",
        ),
    ),  # fmt: skip
    "edges": (
        results.EDGES,
        (
            "task",
            "split",
            "writer_layer",
            "writer_head",
            "reader_layer",
            "reader_head",
            "read_type",
            "kl",
            "pk",
        ),
    ),  # fmt: skip
    "atlas": (
        results.ABLATION_ATLAS,
        (
            "block",
            "layer",
            "head",
            "label",
            "ablation",
            "kl",
            "top1_base",
            "delta_top1",
            "retention_sva",
            "retention_quote",
            "retention_plural",
            "size",
            "constant_part",
        ),
    ),  # fmt: skip
    "timeline": (
        results.TIMELINE,
        (
            "model",
            "seed",
            "step",
            "is_final",
            "tokens_seen",
            "val_loss",
            "sva_accuracy",
            "lambda_score",
            "lambda_p",
            "own_best_fraction",
            "rho_self_mean",
            "idempotence_median",
        ),
    ),  # fmt: skip
}
#: The kinds of input the explorer reads: the views' tables plus the effects behind the
#: grid's intervals.
KINDS = (*COLUMNS, "effects")


class ExplorerInputError(ValueError):
    """An input the explorer cannot use (a file of another run, a missing catalog row)."""


@dataclass(frozen=True)
class Source:
    """One Parquet a view was drawn from, as the results catalog lists it."""

    view: str
    path: str
    sha256: str
    model: str | None = None
    seed: int | None = None
    task: str | None = None


def run_key(model: str, seed: int) -> str:
    """How the page names a run ("learned s42"): its selectors, and the key that ties each
    cited source to its run, must spell it the same way."""
    return f"{model} s{int(seed)}"


@dataclass
class Run:
    """One (model, seed) and its per-view tables (absent views: not computed for it)."""

    model: str
    seed: int
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return run_key(self.model, self.seed)


@dataclass
class ExplorerData:
    runs: list[Run]
    timeline: pd.DataFrame
    sources: list[Source]
    tasks: list[str]
    splits: list[str]


def catalog_digests(catalog: str | os.PathLike) -> dict[str, str]:
    """path -> SHA-256 of every artifact in a results catalog."""
    frame = read_table(catalog, columns=["path", "sha256"]).to_pandas()
    return dict(zip(frame["path"], frame["sha256"], strict=True))


def _read(view: str, path: str) -> pd.DataFrame:
    table, columns = COLUMNS[view]
    return read_table(path, columns=list(table.columns("model", "seed", *columns))).to_pandas()


def head_intervals(effects: pd.DataFrame, level: float = INTERVAL_LEVEL) -> pd.DataFrame:
    """Per (task, split, layer, head): n, and the Student-t interval of the mean drop,
    e ± t_{(1+level)/2, n−1} · s / √n (s: the sample standard deviation, ddof = 1); null
    bounds for one example."""
    keys = ["task", "split", "layer", "head"]
    grouped = effects.groupby(keys, sort=False)["effect"]
    out = grouped.agg(n="size", mean="mean", sd="std").reset_index()  # pandas std: ddof = 1
    n = out["n"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = stats.t.ppf(0.5 + level / 2, n - 1) * out["sd"].to_numpy() / np.sqrt(n)
    half = np.where(n > 1, half, np.nan)
    out["ci_low"] = out["mean"] - half
    out["ci_high"] = out["mean"] + half
    return out[[*keys, "n", "ci_low", "ci_high"]]


def _run_of(frame: pd.DataFrame, path: str) -> tuple[str, int]:
    runs = frame[["model", "seed"]].drop_duplicates()
    if len(runs) != 1:
        raise ExplorerInputError(
            f"{path}: expected the rows of one run (model, seed), found {len(runs)}"
        )
    return str(runs["model"].iloc[0]), int(runs["seed"].iloc[0])


def gather(inputs: Mapping[str, Sequence[str]], catalog: str | os.PathLike) -> ExplorerData:
    """Read every input Parquet (``inputs``: kind of :data:`KINDS` -> paths) into per-run
    tables; each path must be in ``catalog`` (its SHA-256 is what the page cites)."""
    unknown = sorted(set(inputs) - set(KINDS))
    if unknown:
        raise ExplorerInputError(f"unknown explorer input kinds {unknown}; known: {list(KINDS)}")
    digests = catalog_digests(catalog)
    runs: dict[tuple[str, int], Run] = {}
    sources: list[Source] = []
    timeline = []
    effects: dict[tuple[str, int], list[pd.DataFrame]] = {}
    for kind in KINDS:
        for path in inputs.get(kind, ()):
            if path not in digests:
                raise ExplorerInputError(
                    f"{path}: not in the results catalog {catalog}; rerun rule catalog"
                )
            actual = sha256_file(path)
            if actual != digests[path]:  # the page would cite bytes it did not read
                raise ExplorerInputError(
                    f"{path}: SHA-256 {actual} differs from {digests[path]} in the results "
                    f"catalog {catalog}; {rerun_hint(path)}, then rule catalog"
                )
            if kind == "effects":
                frame = read_table(
                    path, columns=["model", "seed", "task", "split", "layer", "head", "effect"]
                ).to_pandas()
            else:
                frame = _read(kind, path)
            model, seed = _run_of(frame, path)
            task = str(frame["task"].iloc[0]) if "task" in frame and len(frame) else None
            view = "heads" if kind == "effects" else kind
            sources.append(Source(view, path, digests[path], model, seed, task))
            if kind == "timeline":
                timeline.append(frame)
                continue
            if kind == "effects":
                effects.setdefault((model, seed), []).append(frame)
                continue
            run = runs.setdefault((model, seed), Run(model, seed))
            previous = run.tables.get(kind)
            frame = frame.drop(columns=["model", "seed"])
            run.tables[kind] = (
                frame if previous is None else pd.concat([previous, frame], ignore_index=True)
            )
    for key, frames in effects.items():
        if key not in runs or "heads" not in runs[key].tables:
            raise ExplorerInputError(f"effects of {key[0]} s{key[1]} without its heads Parquets")
        heads = runs[key].tables["heads"]
        merged = heads.merge(
            head_intervals(pd.concat(frames, ignore_index=True)),
            on=["task", "split", "layer", "head"],
            how="left",
            validate="one_to_one",
        )
        runs[key].tables["heads"] = merged
    for run in runs.values():
        if "leakage" in run.tables:
            run.tables["leakage"] = mark_top_pairs(run.tables["leakage"])
    ordered = sorted(runs.values(), key=lambda r: (r.model, r.seed))
    heads = [r.tables["heads"] for r in ordered if "heads" in r.tables]
    tasks = list(dict.fromkeys(t for h in heads for t in h["task"]))
    splits = list(dict.fromkeys(s for h in heads for s in h["split"]))
    frame = pd.concat(timeline, ignore_index=True) if timeline else pd.DataFrame()
    return ExplorerData(ordered, frame, sources, tasks, splits)


def mark_top_pairs(leakage: pd.DataFrame, k: int = TOP_PAIRS) -> pd.DataFrame:
    """``top_pair``: the row is among its source head's ``k`` largest L (over every later
    reader and read type, within one task and split); ties by row order."""
    keys = ["task", "split", "source_layer", "source_head"]
    rank = leakage.groupby(keys, sort=False)["leakage"].rank(method="first", ascending=False)
    return leakage.assign(top_pair=(rank <= k).to_numpy())
