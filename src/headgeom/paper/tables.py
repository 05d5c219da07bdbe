"""Paper tables as pure functions of result Parquets (docs §17.1).

Each builder takes its inputs by kind (``{"runs": [...], "summaries": [...]}``: the Parquets
of one result type each) and returns a :class:`Table`: the tidy, unrounded frame (the CSV)
and the rendered blocks, written as Markdown and as booktabs LaTeX from the same cells, so
the two always print the same numbers. Derived values are computed from unrounded numbers;
rounding happens only when rendering, to the paper's precision (docs §17).

Input kinds (one file per model × seed × task unless noted):

* ``runs``: ``models/<m>/s<seed>/train_log.parquet``; its metadata (run config, validation
  loss, parameter count) gives display name, repository name, corpus and geometry.
* ``geometry``: ``geometry/<m>/s<seed>/summary.parquet`` (Table 2).
* ``eval``: ``eval/...`` clean accuracy and margin (Table 5).
* ``summaries``: ``concentration/....parquet`` E, N_eff, top-head share per split (Table 6).
* ``robustness``: ``concentration/....robustness.parquet`` decomposition, index null,
  per-example-absolute N_eff (Table 3; /work/coord interface, docs §12.2–12.4).
* ``lanes``, ``leakage``: the lane and leakage Parquets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from scipy.stats import spearmanr

from headgeom import results
from headgeom.io import read_parquet_metadata
from headgeom.paper import references, selections
from headgeom.paper.selections import geometry_registry

TASK_ORDER = ["sva", "quote", "plural"]
TASK_TITLES = {"sva": "SVA", "quote": "Quote", "plural": "Plural"}

Inputs = Mapping[str, Sequence[str]]


# ----------------------------------------------------------------------------- rendering
@dataclass
class Block:
    """One block of rows sharing the table's columns; ``title`` is printed above it. A block
    with ``own_header`` (as many columns, other quantities) prints its own column names."""

    cells: pd.DataFrame  # strings; column names are the header titles
    title: str | None = None
    own_header: bool = False


@dataclass
class Table:
    """A rendered paper table: ``frame`` (tidy, unrounded: the CSV) and its text blocks.

    ``groups`` optionally spans header titles: ``[("", 2), ("N_eff", 3), ("E", 3)]`` prints a
    group row above the titles in LaTeX and prefixes the titles in Markdown."""

    name: str
    frame: pd.DataFrame
    blocks: list[Block]
    caption: str
    groups: list[tuple[str, int]] | None = field(default=None)

    def _titles(self) -> list[str]:
        titles = list(self.blocks[0].cells.columns)
        if not self.groups:
            return titles
        prefixes = [g for g, span in self.groups for _ in range(span)]
        if len(prefixes) != len(titles):
            raise ValueError(f"{self.name}: header groups span {len(prefixes)} of {len(titles)}")
        return [f"{g} {t}" if g else t for g, t in zip(prefixes, titles, strict=True)]

    def markdown(self) -> str:
        parts = [f"{self.caption}\n"]
        titles = self._titles()
        for block in self.blocks:
            if block.title:
                parts.append(f"**{block.title}**\n")
            shown = block.cells if block.own_header else block.cells.set_axis(titles, axis=1)
            parts.append(shown.to_markdown(index=False, disable_numparse=True) + "\n")
        return "\n".join(parts)

    def latex(self) -> str:
        """booktabs tabular in a table float; block titles are full-width italic rows."""
        titles = list(self.blocks[0].cells.columns)
        n = len(titles)
        # numbers right, text left: a column is numeric when any of its cells starts as one
        rows = pd.concat([b.cells.set_axis(range(n), axis=1) for b in self.blocks])
        align = "".join(
            "r" if rows[i].astype(str).map(_looks_numeric).any() else "l" for i in range(n)
        )
        lines = [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{latex_escape(self.caption)}}}",
            rf"\label{{tab:{self.name}}}",
            rf"\begin{{tabular}}{{{align}}}",
            r"\toprule",
        ]
        if self.groups:
            cells, rules, col = [], [], 1
            for group, span in self.groups:
                if group and span > 1:
                    cells.append(rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(group)}}}")
                else:
                    cells += [latex_escape(group)] + [""] * (span - 1)
                if group:
                    rules.append(rf"\cmidrule(lr){{{col}-{col + span - 1}}}")
                col += span
            lines += [" & ".join(cells) + r" \\", " ".join(rules)]
        lines.append(" & ".join(latex_escape(t) for t in titles) + r" \\")
        for block in self.blocks:
            lines.append(r"\midrule")
            if block.title:
                title = rf"\emph{{{latex_escape(block.title)}}}"
                lines += [rf"\multicolumn{{{n}}}{{l}}{{{title}}} \\", r"\midrule"]
            if block.own_header:
                own = " & ".join(latex_escape(str(t)) for t in block.cells.columns)
                lines += [own + r" \\", r"\midrule"]
            for row in block.cells.itertuples(index=False):
                lines.append(" & ".join(latex_escape(str(v)) for v in row) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(lines) + "\n"


def _looks_numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "+-−.")


#: Symbols and paper notation → LaTeX (math where the paper sets math). Longest first.
LATEX_TOKENS = {
    "N_layer|index": r"$N_{\mathrm{layer}\mid\mathrm{index}}$",
    "E_x|d(x)|": r"$\mathbb{E}_x|d(x)|$",
    "|E_x d(x)|": r"$|\mathbb{E}_x d(x)|$",
    "N_index": r"$N_{\mathrm{index}}$",
    "N_eff": r"$N_{\mathrm{eff}}$",
    "ρ_self": r"$\rho_{\mathrm{self}}$",
    "L/ρ": r"$L/\rho$",
    "—": "---",
    "–": "--",
    "−": "$-$",
    "×": r"$\times$",
    "Δ": r"$\Delta$",
    "Λ": r"$\Lambda$",
    "ρ": r"$\rho$",
    "→": r"$\rightarrow$",
    "<": "$<$",
    ">": "$>$",
    "≥": r"$\geq$",
    "≈": r"$\approx$",
    "≤": r"$\leq$",
    "·": r"$\cdot$",
    "|": r"$|$",
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_TOKENS_BY_LENGTH = sorted(LATEX_TOKENS, key=len, reverse=True)


#: Whole cells that are the paper's math symbols.
LATEX_CELLS = {"E": "$E$", "L": "$L$", "X": "$X$"}


def latex_escape(text: str) -> str:
    """Escape ``text`` for LaTeX (pdflatex-safe: the paper's symbols become math)."""
    if text in LATEX_CELLS:
        return LATEX_CELLS[text]
    out, i = [], 0
    while i < len(text):
        for token in _TOKENS_BY_LENGTH:
            if text.startswith(token, i):
                out.append(LATEX_TOKENS[token])
                i += len(token)
                break
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _fmt(spec: str, missing: str = "—") -> Callable:
    """Formatter for a possibly missing (None/NaN) value."""
    return lambda v: missing if v is None or pd.isna(v) else spec.format(v)


def fixed(value: float, decimals: int) -> str:
    """``value`` to ``decimals`` places, without a sign on a value that rounds to zero."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def format_p(p: float) -> str:
    """A permutation p to two significant digits (0.0002, 0.03, 0.17), as the paper prints."""
    return "—" if p is None or pd.isna(p) else f"{p:.2g}"


def _cells(frame: pd.DataFrame, columns: dict[str, tuple[str, Callable]]) -> pd.DataFrame:
    return pd.DataFrame(
        {title: frame[col].map(fmt).to_numpy() for col, (title, fmt) in columns.items()}
    )


# ----------------------------------------------------------------------------- inputs
def grouped_inputs(groups: list[list[str]]) -> dict[str, list[str]]:
    """``[[kind, path, ...], ...]`` → ``{kind: [path, ...]}`` (a kind may repeat)."""
    inputs: dict[str, list[str]] = {}
    for kind, *paths in groups:
        if not paths:
            raise ValueError(f"--input {kind} names no files")
        inputs.setdefault(kind, []).extend(paths)
    return inputs


def need_kind(inputs: Inputs, kind: str, table: str) -> list[str]:
    paths = list(inputs.get(kind, []))
    if not paths:
        raise ValueError(
            f"{table} needs input Parquets of kind {kind!r}; got kinds {sorted(inputs)}"
        )
    return paths


def read_kind(paths: Sequence[str], columns: Sequence[str], what: str) -> pd.DataFrame:
    """Concatenate Parquets, refusing any that lacks a column ``what`` needs."""
    frames = []
    for path in paths:
        table = pq.read_table(path)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(
                f"{path}: lacks columns {missing} needed by {what} (has {table.column_names})"
            )
        frames.append(table.to_pandas())
    return pd.concat(frames, ignore_index=True)


def _meta_json(meta: dict[str, str], key: str, path: str):
    if key not in meta:
        raise KeyError(f"{path}: Parquet metadata lacks {key!r}")
    return json.loads(meta[key])


def read_runs(paths: Sequence[str]) -> pd.DataFrame:
    """One row per (model, seed) from training logs' metadata, in input (config) order."""
    rows = []
    for path in paths:
        meta = read_parquet_metadata(path)
        cfg = _meta_json(meta, "config", path)
        model = cfg["model"]
        rows.append(
            {
                "model": cfg["model_name"],
                "seed": int(cfg["seed"]),
                "display_name": cfg.get("display_name", cfg["model_name"]),
                "repository_name": cfg.get("repository_name"),
                "corpus": cfg.get("corpus", "—"),
                "geometry": model["geometry"],
                "n_params": int(_meta_json(meta, "n_params", path)),
                "val_loss": float(_meta_json(meta, "val_loss_nats", path)),
            }
        )
    if not rows:
        raise ValueError("no training logs given")
    runs = pd.DataFrame(rows)
    if runs.duplicated(["model", "seed"]).any():
        raise ValueError("more than one training log for a (model, seed)")
    runs["order"] = np.arange(len(runs))
    return label_runs(runs)


def label_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """``label`` and ``label_repository`` of each run, unique among ``runs``."""
    runs = runs.copy()
    # "learned (s42)" only where a display name has several seeds on one corpus (paper Table 6)
    several = runs.groupby(["display_name", "corpus"])["seed"].transform("nunique") > 1
    runs["label"] = np.where(
        several, runs["display_name"] + " (s" + runs["seed"].astype(str) + ")", runs["display_name"]
    )
    # a label must name one run: models sharing a display name (on different corpora) get
    # their config key where the table has no corpus column to tell them apart
    clash = runs.duplicated("label", keep=False)
    runs.loc[clash, "label"] = runs["label"] + " [" + runs["model"] + "]"
    # Table 5 names the repository of every checkpoint where the config gives one
    runs["label_repository"] = [
        f"{name} ({repo})" if isinstance(repo, str) else label
        for name, repo, label in zip(
            runs["display_name"], runs["repository_name"], runs["label"], strict=True
        )
    ]
    return runs


def with_runs(frame: pd.DataFrame, runs: pd.DataFrame, what: str) -> pd.DataFrame:
    """Attach run info (label, corpus, order) to result rows; every row needs its run."""
    keys = frame[["model", "seed"]].drop_duplicates()
    known = keys.merge(runs[["model", "seed"]], how="left", indicator=True)
    orphans = known[known["_merge"] == "left_only"]
    if len(orphans):
        raise ValueError(
            f"{what}: no training log given for {orphans[['model', 'seed']].values.tolist()}"
        )
    cols = ["model", "seed", "label", "label_repository", "display_name", "corpus", "order"]
    return frame.merge(runs[cols], on=["model", "seed"], how="left", validate="many_to_one")


def _split_rows(frame: pd.DataFrame, split: str, what: str) -> pd.DataFrame:
    rows = frame[frame["split"] == split]
    if rows.empty:
        raise ValueError(
            f"{what}: no rows of split {split!r} (splits: {sorted(set(frame['split']))})"
        )
    return rows


def _tidy_order(tidy: pd.DataFrame) -> pd.DataFrame:
    """CSV rows in run (config) order, tasks in paper order."""
    rank = tidy["task"].map({t: i for i, t in enumerate(TASK_ORDER)})
    return tidy.assign(_t=rank).sort_values(["order", "_t"]).drop(columns=["order", "_t"])


def _wide(tidy: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """(model, seed) rows in run order × (value, task) columns."""
    if tidy.duplicated(["model", "seed", "task"]).any():
        raise ValueError("more than one row for a (model, seed, task)")
    index = ["order", "model", "seed", "label", "label_repository", "corpus"]
    wide = tidy.pivot_table(index=index, columns="task", values=values, aggfunc="first")
    return wide.sort_index(level="order")


def _row_keys(wide: pd.DataFrame) -> pd.DataFrame:
    return wide.index.to_frame(index=False).drop(columns="order")


# ----------------------------------------------------------------------------- Table 2
#: Geometry columns Table 2 takes from the geometry_stats summaries (docs §9.4, §14.1).
TABLE2_GEOMETRY_COLUMNS = results.GEOMETRY_SUMMARY.columns(
    "own_best_fraction",
    "rho_self_mean",
    "write_write_pk_same_index_mean",
    "write_write_pk_other_index_mean",
    "prop1_applies",
    "prop1_max_residual",
)


def table2(inputs: Inputs) -> Table:
    """Parameters, validation loss and Δ vs learned (paper Table 2), with the designed
    weight-space geometry of each model (optional input kind ``geometry``).

    Δ = val loss − that of the ``learned`` model on the same corpus (comparisons are only
    ever within a corpus, docs §0) with the same seed when one exists, else the mean over
    that corpus's learned seeds; computed from unrounded losses. Runs without a ``corpus``
    key (the demo) share one corpus.
    """
    runs = read_runs(need_kind(inputs, "runs", "table2"))
    frame = runs[["model", "geometry", "seed", "corpus", "n_params", "val_loss"]].copy()
    frame["delta_vs_learned"] = frame["val_loss"] - _learned_reference(frame)
    if inputs.get("geometry"):
        geo = read_kind(inputs["geometry"], ["model", "seed", *TABLE2_GEOMETRY_COLUMNS], "table2")
        geo = geo[["model", "seed", *TABLE2_GEOMETRY_COLUMNS]]
        if geo.duplicated(["model", "seed"]).any():
            raise ValueError("table2: more than one geometry summary for a (model, seed)")
        frame = frame.merge(geo, on=["model", "seed"], how="left", validate="one_to_one")
    else:
        frame = frame.assign(**{c: np.nan for c in TABLE2_GEOMETRY_COLUMNS})

    # NaN where Proposition 1 does not apply (no orthogonal write decomposition) or where
    # no geometry summary was given
    cells = _cells(
        frame,
        {
            "model": ("Model", str),
            "geometry": ("Write / readers", str),
            "corpus": ("Corpus", str),
            "seed": ("Seed", str),
            "n_params": ("Params", lambda v: f"{v:,}"),
            "val_loss": ("Val loss (nats)", lambda v: f"{v:.3f}"),
            "delta_vs_learned": ("Δ vs learned", _fmt("{:+.3f}")),
            "write_write_pk_same_index_mean": ("WW PK same index", _fmt("{:.2f}")),
            "write_write_pk_other_index_mean": ("WW PK other index", _fmt("{:.2f}")),
            "own_best_fraction": ("Own-best (L ≥ 1)", _fmt("{:.2f}")),
            "rho_self_mean": ("ρ_self", _fmt("{:.3f}")),
            "prop1_max_residual": ("Prop. 1 residual (C14)", _fmt("{:.1e}", missing="n/a")),
        },
    )
    caption = (
        "Table 2. Models: parameters, validation loss (nats, final checkpoint) and Δ vs the "
        "learned model on the same corpus (from unrounded losses), with the weight-space "
        "write geometry."
    )
    return Table("table2", frame.reset_index(drop=True), [Block(cells)], caption)


def _learned_reference(frame: pd.DataFrame) -> pd.Series:
    """Validation loss of the learned model each row is compared with (NaN if none)."""
    learned = frame[frame["geometry"].map(geometry_registry().is_baseline)]
    same_seed = learned.set_index(["corpus", "seed"])["val_loss"]
    corpus_mean = learned.groupby("corpus")["val_loss"].mean()
    keys = pd.MultiIndex.from_frame(frame[["corpus", "seed"]])
    ref = pd.Series(same_seed.reindex(keys).to_numpy(), index=frame.index)
    return ref.fillna(frame["corpus"].map(corpus_mean))


def _task_columns(wide: pd.DataFrame, stat: str) -> list[str]:
    return [t for t in TASK_ORDER if (stat, t) in wide.columns]


# ----------------------------------------------------------------------------- Table 3
#: Columns Table 3 reads from the robustness Parquets (coord interface §3).
TABLE3_COLUMNS = results.ROBUSTNESS.columns(
    "model",
    "seed",
    "task",
    "split",
    "N_eff",
    "N_index",
    "N_layer_given_index",
    "index_meaningful",
    "N_index_null_median",
    "N_index_p_lower",
    "n_permutations",
    "N_eff_abs",
)


def decomposition_cell(n_eff: float, n_index: float, n_layer: float) -> str:
    """'N_eff = N_index × N_layer|index', each factor rounded separately (paper Table 3)."""
    if pd.isna(n_index) or pd.isna(n_layer):
        return f"{n_eff:.1f}" if not pd.isna(n_eff) else "—"
    return f"{n_eff:.1f} = {n_index:.1f} × {n_layer:.1f}"


def abs_reversals(tidy: pd.DataFrame) -> pd.DataFrame:
    """Pairs of runs whose N_eff order reverses when p comes from E_x|d(x)| instead of
    |E_x d(x)| (docs §12.3, "reversals of close pairs"), per task: one row per (task, a, b),
    a before b in run order, where (N_eff_a − N_eff_b)(N_eff_abs_a − N_eff_abs_b) < 0 in
    unrounded values (a tie on either side is no reversal)."""
    rows = []
    for task, group in tidy.dropna(subset=["N_eff", "N_eff_abs"]).groupby("task", sort=False):
        runs = list(group.sort_values("order").itertuples(index=False))
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if (a.N_eff - b.N_eff) * (a.N_eff_abs - b.N_eff_abs) < 0:
                    rows.append({
                        "task": task, "label_a": a.label, "label_b": b.label,
                        "order_a": a.order, "order_b": b.order,
                        "N_eff_a": a.N_eff, "N_eff_b": b.N_eff,
                        "N_eff_abs_a": a.N_eff_abs, "N_eff_abs_b": b.N_eff_abs,
                    })  # fmt: skip
    columns = ["task", "label_a", "label_b", "order_a", "order_b", "N_eff_a", "N_eff_b"]
    return pd.DataFrame(rows, columns=[*columns, "N_eff_abs_a", "N_eff_abs_b"])


def _reversal_cell(r) -> str:
    """'9.2 < 10.0 → 24.0 > 21.0': a's value first, as the paper prints a reversal."""

    def sign(x: float, y: float) -> str:
        return "<" if x < y else ">"

    return (
        f"{r.N_eff_a:.1f} {sign(r.N_eff_a, r.N_eff_b)} {r.N_eff_b:.1f} → "
        f"{r.N_eff_abs_a:.1f} {sign(r.N_eff_abs_a, r.N_eff_abs_b)} {r.N_eff_abs_b:.1f}"
    )


def table3(inputs: Inputs) -> Table:
    """N_eff = N_index × N_layer|index per model and task, the index-level permutation null,
    and N_eff from E_x|d(x)| (paper Table 3; docs §10.3–10.4, §12.2–12.3).

    The decomposition and the null are shown only where the head index is comparable across
    layers in the base architecture (``index_meaningful``); elsewhere the cell gives N_eff
    alone."""
    runs = read_runs(need_kind(inputs, "runs", "table3"))
    frame = read_kind(need_kind(inputs, "robustness", "table3"), TABLE3_COLUMNS, "table3")
    splits = sorted(set(frame["split"]))
    if len(splits) != 1:
        raise ValueError(f"table3: robustness rows come from several splits {splits}")
    frame = frame[TABLE3_COLUMNS].copy()
    meaningful = frame["index_meaningful"].astype(bool)
    for col in ("N_index", "N_layer_given_index", "N_index_null_median", "N_index_p_lower"):
        frame.loc[~meaningful, col] = np.nan
    frame["N_eff_abs_ratio"] = frame["N_eff_abs"] / frame["N_eff"]
    tidy = with_runs(frame, runs, "table3")
    values = ["N_eff", "N_index", "N_layer_given_index", "N_index_null_median"]
    values += ["N_index_p_lower", "N_eff_abs"]
    wide = _wide(tidy, values)
    keys = _row_keys(wide)
    tasks = _task_columns(wide, "N_eff")

    def block(render: Callable[[str], list[str]]) -> pd.DataFrame:
        cells = pd.DataFrame({"Model": keys["label"]})
        for task in tasks:
            cells[TASK_TITLES[task]] = render(task)
        return cells

    decomposition = block(
        lambda t: [
            decomposition_cell(*v)
            for v in zip(
                wide[("N_eff", t)],
                wide[("N_index", t)],
                wide[("N_layer_given_index", t)],
                strict=True,
            )
        ]
    )
    null = block(
        lambda t: [
            "—" if pd.isna(n) else f"{n:.1f} vs {m:.1f}, p = {format_p(p)}"
            for n, m, p in zip(
                wide[("N_index", t)],
                wide[("N_index_null_median", t)],
                wide[("N_index_p_lower", t)],
                strict=True,
            )
        ]
    )
    absolute = block(lambda t: [_fmt("{:.1f}")(v) for v in wide[("N_eff_abs", t)]])
    reversals = abs_reversals(tidy)
    pairs = reversals.drop_duplicates(["order_a", "order_b"]).sort_values(["order_a", "order_b"])
    pair_keys = list(zip(pairs["order_a"], pairs["order_b"], strict=True))
    names = [f"{a} vs {b}" for a, b in zip(pairs["label_a"], pairs["label_b"], strict=True)]
    flips = pd.DataFrame({"Model": names or ["none"]})
    for task in tasks:
        in_task = reversals[reversals["task"] == task]
        cell = {(r.order_a, r.order_b): _reversal_cell(r) for r in in_task.itertuples()}
        flips[TASK_TITLES[task]] = [cell.get(k, "—") for k in pair_keys] or ["—"]
    # the CSV names, per (run, task), the runs whose order against it reverses
    partners: dict[tuple[int, str], list[str]] = {}
    for r in reversals.itertuples():
        partners.setdefault((r.order_a, r.task), []).append(r.label_b)
        partners.setdefault((r.order_b, r.task), []).append(r.label_a)
    run_tasks = zip(tidy["order"], tidy["task"], strict=True)
    tidy["abs_reversed_with"] = ["; ".join(partners.get(k, [])) for k in run_tasks]
    n_perm = sorted(set(frame.loc[meaningful, "n_permutations"].astype(int)))
    caption = (
        f"Table 3. Head-level N_eff decomposed into effective head indices and effective "
        f"layers within an index, N_eff = N_index × N_layer|index ({splits[0]} split); each "
        f"value rounded separately, so printed factors need not multiply to the printed "
        f"N_eff. Second: N_index against the median of its within-layer index-permutation "
        f"null ({', '.join(map(str, n_perm)) or '—'} draws) with the lower one-sided p "
        f"(uncorrected across models). Third: N_eff with p from E_x|d(x)| instead of "
        f"|E_x d(x)|. Bottom: every pair of rows whose order by N_eff reverses under "
        f"E_x|d(x)| (from unrounded values; A's value first, docs §12.3)."
    )
    blocks = [
        Block(decomposition, "N_eff = N_index × N_layer|index"),
        Block(null, "N_index vs index-permutation null median (lower p)"),
        Block(absolute, "N_eff from E_x|d(x)|"),
        Block(flips, "Reversals, A vs B: N_eff → N_eff from E_x|d(x)|"),
    ]
    return Table("table3", _tidy_order(tidy), blocks, caption)


# ----------------------------------------------------------------------------- Table 5
def table5(inputs: Inputs) -> Table:
    """Clean accuracy (%) / mean logit margin on the evaluation split (paper Table 5)."""
    runs = read_runs(need_kind(inputs, "runs", "table5"))
    cols = results.EVAL.columns("model", "seed", "task", "split", "n", "accuracy", "margin")
    frame = read_kind(need_kind(inputs, "eval", "table5"), cols, "table5")
    frame = _split_rows(frame, "evaluation", "table5")
    tidy = with_runs(frame[cols], runs, "table5")
    wide = _wide(tidy, ["accuracy", "margin"])
    keys = _row_keys(wide)
    cells = pd.DataFrame({"Model": keys["label_repository"], "Corpus": keys["corpus"]})
    for task in _task_columns(wide, "accuracy"):
        acc, margin = wide[("accuracy", task)], wide[("margin", task)]
        cells[TASK_TITLES[task]] = [
            f"{100 * a:.1f} / {fixed(m, 2)}" for a, m in zip(acc, margin, strict=True)
        ]
    n = sorted(set(tidy["n"].astype(int)))
    caption = (
        f"Table 5. Clean task performance: evaluation-split accuracy (%) / mean logit margin "
        f"(correct − incorrect), {', '.join(map(str, n))} examples per task."
    )
    return Table("table5", _tidy_order(tidy), [Block(cells)], caption)


# ----------------------------------------------------------------------------- Table 6
TABLE6_COLUMNS = results.SUMMARY.columns(
    "model", "seed", "task", "split", "N_eff", "E", "top_head_share"
)


def table6_rows(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The runs that are paper Table 6's rows (``selections.TABLE6_ROWS``, docs §6.7), in
    the paper's order (``order`` renumbered), and the paper's names of the rows no run
    fills (by corpus where the study names corpora). The selection is the one the workflow
    reads (``selections.select_models``)."""
    models = selections.models_of_runs(runs)
    chosen = selections.select_models(models, "table6")
    rank = {run: i for i, run in enumerate(chosen)}
    keys = list(zip(runs["model"], runs["seed"], strict=True))
    shown = runs[[k in rank for k in keys]].copy()
    shown["order"] = [rank[k] for k in zip(shown["model"], shown["seed"], strict=True)]
    named = any("corpus" in spec for spec in models.values())
    missing: dict[str, list[str]] = {}  # corpus ("" in a study without corpora) -> rows
    for geometry, corpus, name in selections.TABLE6_ROWS:
        if not any(
            spec["geometry"] == geometry and (not named or spec.get("corpus") == corpus)
            for spec in models.values()
        ):
            missing.setdefault(corpus if named else "", []).append(name)
    text = [f"corpus {c}: {', '.join(rows)}" if c else ", ".join(rows)
            for c, rows in missing.items()]  # fmt: skip
    return label_runs(shown.sort_values("order")), text


def table6(inputs: Inputs, every_run: bool = False) -> Table:
    """N_eff and E per task on the evaluation split (paper Table 6): the paper's 13 rows
    (:func:`table6_rows`: corpus R learned and write-common-axis with their seeds, then the
    corpus-S models), each a run the study has, the paper's rows it lacks in the footnote;
    ``every_run``: every run given, corpus R first, in config order (``table6_all_runs``).
    The top-head share is in the CSV."""
    runs = read_runs(need_kind(inputs, "runs", "table6"))
    frame = _split_rows(
        read_kind(need_kind(inputs, "summaries", "table6"), TABLE6_COLUMNS, "table6"),
        "evaluation",
        "table6",
    )
    with_runs(frame, runs, "table6")  # every summary has its training log
    missing: list[str] = []
    if not every_run:
        runs, missing = table6_rows(runs)
        shown = set(zip(runs["model"], runs["seed"], strict=True))
        frame = frame[[k in shown for k in zip(frame["model"], frame["seed"], strict=True)]]
    tidy = with_runs(frame[TABLE6_COLUMNS], runs, "table6")
    wide = _wide(tidy, ["N_eff", "E"])
    if every_run:
        corpus_rank = wide.index.get_level_values("corpus").map({"R": 0, "S": 1}).fillna(2)
        wide = wide.iloc[np.lexsort((wide.index.get_level_values("order"), corpus_rank))]
    keys = _row_keys(wide)
    cells = pd.DataFrame({"Model": keys["label"], "Corpus": keys["corpus"]})
    groups = [("", 2)]
    for stat in ("N_eff", "E"):
        tasks = _task_columns(wide, stat)
        for task in tasks:
            cells[f"{stat} {TASK_TITLES[task]}"] = [f"{v:.1f}" for v in wide[(stat, task)]]
        groups.append((stat, len(tasks)))
    # the group row carries the statistic; titles under it are the tasks
    cells.columns = ["Model", "Corpus"] + [c.split(" ", 1)[1] for c in cells.columns[2:]]
    caption = (
        "Table 6. Effective number of heads N_eff and sum of absolute single-head effects E "
        "(logit units) per task, evaluation split."
    )
    if missing:
        caption += f" The paper's rows not in this study: {'; '.join(missing)}."
    return Table("table6", _tidy_order(tidy), [Block(cells)], caption, groups)


# ----------------------------------------------------------------------------- Lanes
def lanes(inputs: Inputs) -> Table:
    """Lane score Λ with its permutation p, Bonferroni ×3 within each model (docs §10.5);
    runs beyond the paper's Λ runs (``selections.LAMBDA_PAPER_RUNS``, docs §13.1) are marked
    extra (``paper_lambda`` false)."""
    cols = results.LANES.columns(
        "model", "seed", "task", "split", "lambda_score", "chance", "p_value"
    )
    runs = read_runs(need_kind(inputs, "runs", "lanes"))
    frame = read_kind(
        need_kind(inputs, "lanes", "lanes"),
        [*cols, *results.LANES.columns("n_permutations")],
        "lanes",
    )
    frame = with_runs(frame, runs, "lanes").sort_values(["order"], kind="stable")
    n_tasks = frame.groupby(["model", "seed"])["task"].transform("nunique")
    frame["p_bonferroni"] = np.minimum(1.0, frame["p_value"] * n_tasks)
    paper = selections.lambda_paper_runs(selections.models_of_runs(runs))
    frame["paper_lambda"] = [
        (m, int(s)) in paper for m, s in zip(frame["model"], frame["seed"], strict=True)
    ]
    frame = frame[[*cols, "p_bonferroni", "n_permutations", "paper_lambda"]]
    fmt_p = _fmt("{:.4f}")
    cells = _cells(
        frame,
        {
            "model": ("Model", str),
            "seed": ("Seed", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "lambda_score": ("Λ", _fmt("{:.3f}", missing="undefined")),
            "chance": ("Chance", lambda v: f"{v:.3f}"),
            "p_value": ("p", fmt_p),
            "p_bonferroni": ("p (Bonferroni ×3)", fmt_p),
            "paper_lambda": ("Run", lambda v: "paper" if v else "extra"),
        },
    )
    split = ", ".join(sorted(set(frame["split"])))
    n_extra = frame.loc[~frame["paper_lambda"], ["model", "seed"]].drop_duplicates().shape[0]
    caption = (
        f"Lane score Λ ({split} split): fraction of cross-layer positive effect mass in "
        f"same-index pairs, with the within-layer permutation p (upper) and its Bonferroni "
        f"correction over each model's tasks. Run: paper = one of the paper's Λ runs (docs "
        f"§13.1); extra = computed beyond them ({n_extra} run{'' if n_extra == 1 else 's'})."
    )
    return Table("lanes", frame.reset_index(drop=True), [Block(cells)], caption)


# ----------------------------------------------------------------------------- Leakage
def leakage(inputs: Inputs) -> Table:
    """Leakage summaries per model, seed and read type, pooled over tasks (docs §11.3):
    median L (fraction of perturbation energy), median L/ρ and Spearman(L, ρ) across
    source–reader pairs."""
    cols = results.LEAKAGE.columns(
        "model", "seed", "read_type", "leakage", "rho", "leakage_over_rho"
    )
    frame = read_kind(need_kind(inputs, "leakage", "leakage"), cols, "leakage")
    frame = frame.dropna(subset=["leakage", "rho"])
    rows = []
    for (model, seed, read_type), group in frame.groupby(
        ["model", "seed", "read_type"], sort=False
    ):
        rows.append(
            {
                "model": model,
                "seed": seed,
                "read_type": read_type,
                "n_pairs": len(group),
                "median_leakage": group["leakage"].median(),
                "median_leakage_over_rho": group["leakage_over_rho"].median(),
                "spearman_leakage_rho": spearmanr(group["leakage"], group["rho"]).statistic,
            }
        )
    out = pd.DataFrame(rows)
    cells = _cells(
        out,
        {
            "model": ("Model", str),
            "seed": ("Seed", str),
            "read_type": ("X", str),
            "n_pairs": ("Pairs (all tasks)", str),
            "median_leakage": ("Median L", lambda v: f"{100 * v:.1f}%"),
            "median_leakage_over_rho": ("Median L/ρ", lambda v: f"{v:.2f}"),
            "spearman_leakage_rho": ("Spearman(L, ρ)", lambda v: f"{v:.2f}"),
        },
    )
    caption = (
        "Leakage L of real patch perturbations into later readers against the isotropic "
        "expectation ρ, pooled over tasks: medians and rank correlation across "
        "source–reader pairs."
    )
    return Table("leakage", out, [Block(cells)], caption)


BUILDERS: dict[str, Callable[[Inputs], Table]] = {
    "table2": table2,
    "table3": table3,
    "table5": table5,
    "table6": table6,
    "lanes": lanes,
    "leakage": leakage,
}


# ----------------------------------------------------------------------- clamps (docs §13.3, §15.3)
CLAMP_PAIR_COLUMNS = results.CLAMP_PAIRS.columns(
    "model", "seed", "task", "source_layer", "source_head", "later_layer", "later_head",
    "same_index", "e_unclamped", "reduction_head", "reduction_mlps",
)  # fmt: skip
CLAMP_PATH_COLUMNS = results.CLAMP_PATHS.columns(
    "model", "seed", "task", "rank", "layer", "head", "delta_none", "direct", "via_mlps_a",
    "via_attention_a", "via_attention_b", "via_mlps_b", "interaction",
)  # fmt: skip
CLAMP_LUMPED_COLUMNS = results.CLAMP_LUMPED.columns(
    "model", "seed", "task", "index_shift", "same_index", "sources", "reduction"
)


def _optional(inputs: Inputs, kind: str, columns: Sequence[str]) -> pd.DataFrame:
    """The Parquets of ``kind`` (an empty frame with ``columns`` when none is given)."""
    paths = list(inputs.get(kind, []))
    return read_kind(paths, columns, kind) if paths else pd.DataFrame(columns=list(columns))


def path_shares(paths: pd.DataFrame) -> dict[str, float]:
    """Shares of Δ(∅) over head–task cases (docs §15.3): Σ part / Σ Δ(∅), both orders, and
    the interaction statistics (|I| relative to each case's |Δ(∅)|)."""
    total = paths["delta_none"].sum()
    rel = (paths["interaction"].abs() / paths["delta_none"].abs()).replace(np.inf, np.nan)
    return {
        "n_cases": len(paths),
        "total": total,
        "direct_share": paths["direct"].sum() / total,
        "mlp_share_a": paths["via_mlps_a"].sum() / total,
        "attention_share_a": paths["via_attention_a"].sum() / total,
        "mlp_share_b": paths["via_mlps_b"].sum() / total,
        "attention_share_b": paths["via_attention_b"].sum() / total,
        "interaction_median_rel": float(rel.median()),
        "interaction_signed_share": paths["interaction"].sum() / total,
        "interaction_abs_share": paths["interaction"].abs().sum() / total,
        "interaction_over_20pct": int((rel > 0.2).sum()),
        "interaction_over_50pct": int((rel > 0.5).sum()),
        "interaction_max_rel": float(rel.max()),
    }


def _range(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    return f"{100 * values.min():.1f}% to {100 * values.max():.1f}%"


#: path_shares keys of the paper's per-model shares (docs §15.3): order A, order B, direct.
SHARE_KEYS = ("mlp_share_a", "mlp_share_b", "direct_share")


def _paper_shares(geometry: str, corpus: str) -> str:
    """'a / b; direct c': the paper's MLP shares (orders A, B) and direct share of a model."""
    a, b, direct = (references.text(f"paths.{geometry}.{corpus}.{key}") for key in SHARE_KEYS)
    return f"{a} / {b}; direct {direct}"


def _percent_range(key: str) -> str:
    """A paper range of percentages as the clamps table prints it: 'a–b%' as 'a% to b%'."""
    low, high = references.text(key).removesuffix("%").split("–")
    return f"{low}% to {high}%"


def clamps_table(inputs: Inputs) -> Table:
    """The §13.3 clamp tests and §15.3 decomposition summaries beside the paper's values."""
    runs = read_runs(need_kind(inputs, "runs", "clamps"))
    geometry = runs.set_index(["model", "seed"])["geometry"]
    rows = []

    def add(section, quantity, value, paper, models="all"):
        rows.append({"section": section, "quantity": quantity, "models": models,
                     "value": value, "paper": paper})  # fmt: skip

    pairs = _optional(inputs, "pairs", CLAMP_PAIR_COLUMNS)
    if len(pairs):
        keys = zip(pairs["model"], pairs["seed"], strict=True)
        learned = [geometry_registry().is_baseline(geometry[key]) for key in keys]
        pairs = pairs.assign(learned=learned)
        same = pairs[pairs["same_index"]]
        add(
            "§13.3 (d)",
            "same-index pairs: reduction",
            _range(same["reduction_head"]),
            references.text("clamps.same-index"),
            f"{len(same)} pairs",
        )
        diff = pairs[~pairs["same_index"]]
        add(
            "§13.3 (d)",
            "different-index pairs: reduction",
            _range(diff["reduction_head"]),
            references.text("clamps.different-index"),
            f"{len(diff)} pairs",
        )
        sources = pairs.drop_duplicates(["model", "seed", "task", "source_layer", "source_head"])
        add(
            "§13.3 (e)",
            "later-MLP clamp: reduction, frozen-write models",
            _range(sources.loc[~sources["learned"], "reduction_mlps"]),
            _percent_range("clamps.mlps-frozen"),
        )
        add(
            "§13.3 (e)",
            "later-MLP clamp: reduction, learned",
            _range(sources.loc[sources["learned"], "reduction_mlps"]),
            _percent_range("clamps.mlps-learned"),
        )
    lumped = _optional(inputs, "lumped", CLAMP_LUMPED_COLUMNS)
    paper = references.text
    paper_lumped = {
        "sva": f"{paper('lumped.sva.same')} (others {paper('lumped.sva.other')})",
        "quote": paper("lumped.quote.same"),
        "plural": paper("lumped.plural.same"),
    }
    for (model, seed, task), group in lumped.groupby(["model", "seed", "task"], sort=False):
        own = group.loc[group["same_index"], "reduction"].iloc[0]
        other = group.loc[~group["same_index"], "reduction"].mean()
        add(
            "§13.3 lumped",
            f"{TASK_TITLES.get(task, task)}: same index (other indices)",
            f"{100 * own:.1f}% ({100 * other:.1f}%)",
            paper_lumped.get(task, ""),
            f"{model} s{seed}",
        )
    paths = _optional(inputs, "paths", CLAMP_PATH_COLUMNS)
    learned_s = [paper(f"paths.learned.S.{key}") for key in SHARE_KEYS]
    paper_shares = {
        "learned": f"learned R {_paper_shares('learned', 'R')} "
        f"(S: {learned_s[0]} / {learned_s[1]}; {learned_s[2]})",
        "learned-r": _paper_shares("learned", "R"),
        "learned-s": _paper_shares("learned", "S"),
        "write-common-axis": _paper_shares("write-common-axis", "R"),
    }
    for model, group in paths.groupby("model", sort=False):
        s = path_shares(group)
        add(
            "§15.3 both orders",
            "MLP share order A / order B; direct share",
            f"{s['mlp_share_a']:.2f} / {s['mlp_share_b']:.2f}; direct {s['direct_share']:.2f}",
            paper_shares.get(model, ""),
            f"{model} ({s['n_cases']} cases)",
        )
    if len(paths):
        s = path_shares(paths)
        add(
            "§15.3 interaction",
            "median |I| / |Δ(∅)|",
            f"{100 * s['interaction_median_rel']:.1f}%",
            paper("interaction.median_rel"),
            f"{s['n_cases']} cases",
        )
        add(
            "§15.3 interaction",
            "Σ I / Σ Δ(∅), signed (absolute)",
            f"{100 * s['interaction_signed_share']:.1f}% ({100 * s['interaction_abs_share']:.1f}%)",
            f"{paper('interaction.signed_share')} ({paper('interaction.abs_share')})",
        )
        add(
            "§15.3 interaction",
            "cases with |I| > 20% / > 50% of Δ(∅); max",
            f"{s['interaction_over_20pct']} / {s['interaction_over_50pct']}; "
            f"{100 * s['interaction_max_rel']:.0f}%",
            f"{paper('interaction.over_20_50')}; {paper('interaction.max_rel')}",
        )
    frame = pd.DataFrame(rows, columns=["section", "quantity", "models", "value", "paper"])
    cells = frame.rename(columns=str.capitalize)
    caption = (
        "Clamp tests (docs §13.3) and the two-order path decomposition (§15.3) on the "
        "evaluation split: reductions r = (e − e_clamped)/e of top heads' effects, and shares "
        "of Σ Δ(∅) over head–task cases (order A releases the MLP clamp first)."
    )
    return Table("clamps", frame, [Block(cells)], caption)


def lane_heads(inputs: Inputs) -> Table:
    """Lanes in full (docs §13.1): per run and task, the top-3 heads by discovery effect,
    whether their evaluation effects are positive, and whether two share a head index
    (the SVA index-repetition test, paper: every write-common-axis variant yes, every
    learned model no)."""
    runs = read_runs(need_kind(inputs, "runs", "lane_heads"))
    cols = results.HEADS.columns("model", "seed", "task", "split", "layer", "head", "e")
    heads = read_kind(need_kind(inputs, "heads", "lane_heads"), cols, "lane_heads")
    rows = []
    for (model, seed, task), group in heads.groupby(["model", "seed", "task"], sort=False):
        disc = group[group["split"] == "discovery"]
        ev = group[group["split"] == "evaluation"]
        if disc.empty or ev.empty:
            raise ValueError(f"lane_heads: {model} s{seed} {task} needs discovery and evaluation")
        top = disc.sort_values(["e", "layer", "head"], ascending=[False, True, True]).head(3)
        e_eval = ev.set_index(["layer", "head"])["e"]
        top_heads = list(zip(top["layer"], top["head"], strict=True))
        confirmed = [e_eval[key] > 0 for key in top_heads]
        rows.append({
            "model": model, "seed": int(seed), "task": task,
            "top3_discovery": ", ".join(f"L{a}H{b}" for a, b in top_heads),
            "n_positive_on_evaluation": int(sum(confirmed)),
            "index_repeats": bool(top["head"].duplicated().any()),
        })  # fmt: skip
    frame = with_runs(pd.DataFrame(rows), runs, "lane_heads").sort_values(["order", "task"])
    frame["task"] = pd.Categorical(frame["task"], TASK_ORDER)
    frame = frame.sort_values(["order", "task"]).drop(columns=["order", "label_repository"])
    total, positive = 3 * len(frame), int(frame["n_positive_on_evaluation"].sum())
    cells = _cells(
        frame,
        {
            "label": ("Model", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "top3_discovery": ("Top-3 heads (discovery)", str),
            "n_positive_on_evaluation": ("Positive on evaluation", lambda n: f"{n}/3"),
            "index_repeats": ("Index repeats", lambda b: "yes" if b else "no"),
        },
    )
    caption = (
        f"Top-3 heads by discovery effect (docs §13.1): {positive} of {total} are positive on "
        "the evaluation split (paper: all 15); index repeats = two of them share a head index "
        "(paper, SVA: every write-common-axis variant yes, every learned model no)."
    )
    return Table("lane_heads", frame.reset_index(drop=True), [Block(cells)], caption)


BUILDERS.update({"clamps": clamps_table, "lane_heads": lane_heads})


# --------------------------------------------------------- dynamics (docs §13.2, §13.4, §14.2–14.5)
TIMELINE_COLUMNS = results.TIMELINE.columns(
    "model", "seed", "step", "is_final", "sva_accuracy", "lambda_score", "lambda_p", "chance",
    "own_best_fraction", "idempotence_median",
)  # fmt: skip
TAU_COLUMNS = results.TAU.columns(
    "model", "seed", "step", "is_final", "adjacent_cosine_mean", "adjacent_cosine_min",
    "adjacent_cosine_max", "same_index_cosine", "different_index_cosine",
    "same_index_internal_cosine", "different_index_internal_cosine", "lane_index", "lane_share",
    "lane_share_max_other", "lane_share_chance",
)  # fmt: skip
VALUE_GRADIENT_COLUMNS = results.VALUE_GRADIENTS.columns(
    "model", "seed", "step", "is_final", "layer", "head", "own_largest", "scalar_trace"
)
ABLATION_COLUMNS = results.SCALAR_ABLATION.columns(
    "model", "seed", "task", "split", "edit", "kind", "draw", "layers", "margin_unedited",
    "drop", "haar_seed",
)  # fmt: skip
#: The paper's values (docs §13.4, §14.4, §20.4–20.5) by the run's geometry, per quantity:
#: the ids of their records in references.yaml.
DYNAMICS_PAPER = {
    "tau_adjacent": {"write-common": "tau.adjacent", "write-rotated": "tau.adjacent"},
    "tau_same": {"write-common": "tau.same-index", "write-rotated": "tau.same-index.write-rotated"},
    "vgrad_init": {"write-common": "vgrad.step0", "write-rotated": "vgrad.step0"},
    "vgrad_early": {"write-common": "vgrad.first-step", "write-rotated": "vgrad.first-step"},
}


def _paper(quantity: str, geometry: str) -> str:
    key = DYNAMICS_PAPER.get(quantity, {}).get(geometry)
    if key is None:
        return "—"
    # the first traced step is the paper's step 256 (of 65,536)
    return references.text(key) + (" (step 256)" if quantity == "vgrad_early" else "")


def dynamics_table(inputs: Inputs) -> Table:
    """τ (docs §13.4) per checkpoint and the V-gradient own-term fractions (§14.4) per
    traced checkpoint with the per-layer sign of tr(V_hᵀO_h) at the final one, per
    timeline run, beside the paper's values."""
    runs = read_runs(need_kind(inputs, "runs", "dynamics"))
    tau = with_runs(read_kind(need_kind(inputs, "tau", "dynamics"), TAU_COLUMNS, "dynamics")
                    [TAU_COLUMNS], runs, "dynamics")  # fmt: skip
    vg = with_runs(read_kind(need_kind(inputs, "value_gradients", "dynamics"),
                             VALUE_GRADIENT_COLUMNS, "dynamics")[VALUE_GRADIENT_COLUMNS],
                   runs, "dynamics")  # fmt: skip
    geometry = runs.set_index(["model", "seed"])["geometry"]
    rows = []

    def add(run, step, section, quantity, value, text, paper="—"):
        rows.append({"label": run.label, "model": run.model, "seed": run.seed, "step": step,
                     "section": section, "quantity": quantity, "value": value, "text": text,
                     "paper": paper})  # fmt: skip

    for run in runs.itertuples():
        g = geometry[(run.model, run.seed)]
        run_tau = tau[(tau["model"] == run.model) & (tau["seed"] == run.seed)]
        final = int(run_tau["step"].max()) if len(run_tau) else 0  # the final checkpoint
        # the paper's τ steps only (1,024–65,536 of 65,536: from 1/64 of training on)
        in_range = [selections.in_tau_range(int(t), final) for t in run_tau["step"]]
        for r in run_tau[in_range].itertuples():
            step = f"{r.step}" + (" (final)" if r.is_final else "")
            add(run, step, "§13.4", "τ adjacent-layer cosine (mean [min, max])",
                r.adjacent_cosine_mean, f"{r.adjacent_cosine_mean:.2f} "
                f"[{r.adjacent_cosine_min:.2f}, {r.adjacent_cosine_max:.2f}]",
                _paper("tau_adjacent", g))  # fmt: skip
            add(run, step, "§13.4", "τ same-index projected cosine", r.same_index_cosine,
                fixed(r.same_index_cosine, 3), _paper("tau_same", g))  # fmt: skip
            add(run, step, "§13.4", "τ different-index projected cosine",
                r.different_index_cosine, fixed(r.different_index_cosine, 3))  # fmt: skip
            add(run, step, "§13.4", "τ internal-coordinate cosine, same / different index",
                r.same_index_internal_cosine, f"{fixed(r.same_index_internal_cosine, 3)} / "
                f"{fixed(r.different_index_internal_cosine, 3)}")  # fmt: skip
            add(run, step, "§13.4", f"gradient lane share, index {r.lane_index} (largest other)",
                r.lane_share, f"{r.lane_share:.3f} ({r.lane_share_max_other:.3f}; chance "
                f"{r.lane_share_chance:.3f})")  # fmt: skip
        heads = vg[(vg["model"] == run.model) & (vg["seed"] == run.seed)]
        steps = sorted(heads["step"].unique())
        for i, step in enumerate(steps):
            at = heads[heads["step"] == step]
            final = bool(at["is_final"].iloc[0])
            label = f"{step}" + (" (final)" if final else "")
            paper = "—" if final else _paper("vgrad_init" if i == 0 else "vgrad_early", g)
            for scope, sel in (("all heads", at), ("layers ≥ 1", at[at["layer"] >= 1])):
                share = float(sel["own_largest"].mean())
                add(run, label, "§14.4", f"own V-gradient term largest ({scope})", share,
                    f"{100 * share:.0f}% of {len(sel)} (chance {100 / at['head'].nunique():.0f}%)",
                    paper)  # fmt: skip
            if final:
                for layer, sel in at.groupby("layer"):
                    positive = int((sel["scalar_trace"] > 0).sum())
                    add(run, label, "§14.4", f"tr(V_hᵀO_h) > 0, layer {layer}",
                        float(sel["scalar_trace"].mean()),
                        f"{positive}/{len(sel)} heads (mean {sel['scalar_trace'].mean():+.3f})",
                        "negative shallow, positive deep")  # fmt: skip
    frame = pd.DataFrame(rows)
    cells = frame[["label", "step", "section", "quantity", "text", "paper"]].set_axis(
        ["Model", "Step", "§", "Quantity", "Value", "Paper"], axis=1
    )
    caption = (
        "Training dynamics (docs §13.4, §14.4): task gradients τ (SVA evaluation split) per "
        "checkpoint of the paper's τ range (from 1/64 of training on: its steps 1,024–65,536 "
        "of 65,536), V-gradient own-term fractions on validation tokens, and the sign of the "
        "scalar part tr(V_hᵀO_h) per layer at the final checkpoint."
    )
    return Table("dynamics", frame, [Block(cells)], caption)


def scalar_ablation_table(inputs: Inputs) -> Table:
    """Scalar-part ablation (docs §14.5): per (model, task) the drop in evaluation mean LD
    when s·I is removed from the own-lane value maps, against the equal-norm random control
    (mean and range over the Haar draws), and the count of cases where the scalar drop is
    larger (paper: 13 of 15)."""
    runs = read_runs(need_kind(inputs, "runs", "scalar_ablation"))
    frame = read_kind(need_kind(inputs, "scalar_ablation", "scalar_ablation"), ABLATION_COLUMNS,
                      "scalar_ablation")  # fmt: skip
    frame = with_runs(frame[ABLATION_COLUMNS], runs, "scalar_ablation")
    rows = []
    for (order, model, seed, task), grp in frame.groupby(["order", "model", "seed", "task"],
                                                         sort=True):  # fmt: skip
        scalar = grp[grp["kind"] == "scalar"]["drop"]
        random = grp[grp["kind"] == "random"]["drop"]
        rows.append({"order": order, "label": grp["label"].iloc[0], "model": model, "seed": seed,
                     "task": task, "layers": grp["layers"].iloc[0],
                     "margin_unedited": grp["margin_unedited"].iloc[0],
                     "drop_scalar": float(scalar.iloc[0]), "drop_random_mean": float(random.mean()),
                     "drop_random_min": float(random.min()), "drop_random_max": float(random.max()),
                     "n_draws": len(random), "haar_seed": int(grp["haar_seed"].iloc[0]),
                     "scalar_hurts_more": bool(scalar.iloc[0] > random.mean())})  # fmt: skip
    out = pd.DataFrame(rows)
    out = out.assign(_t=out["task"].map({t: i for i, t in enumerate(TASK_ORDER)}))
    out = out.sort_values(["order", "_t"]).drop(columns=["_t", "order"]).reset_index(drop=True)
    cells = _cells(out, {
        "label": ("Model", str),
        "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
        "layers": ("Layers", str),
        "margin_unedited": ("Mean LD", lambda v: fixed(v, 3)),
        "drop_scalar": ("Drop, −sI", lambda v: fixed(v, 4)),
        "drop_random_mean": ("Drop, −sR (mean)", lambda v: fixed(v, 4)),
        "drop_random_min": ("−sR min", lambda v: fixed(v, 4)),
        "drop_random_max": ("−sR max", lambda v: fixed(v, 4)),
        "scalar_hurts_more": ("Scalar larger", lambda v: "yes" if v else "no"),
    })  # fmt: skip
    n, k = len(out), int(out["scalar_hurts_more"].sum())
    caption = (
        f"Scalar-part ablation of own-lane value maps (docs §14.5, evaluation split): the "
        f"scalar part s·I hurts more than an equal-norm Haar-random part s·R in {k} of {n} "
        f"cases (paper: 13 of 15); {int(out['n_draws'].max()) if n else 0} draws, seed "
        f"{int(out['haar_seed'].iloc[0]) if n else '—'}."
    )
    return Table("scalar_ablation", out, [Block(cells)], caption)


BUILDERS.update({"dynamics": dynamics_table, "scalar_ablation": scalar_ablation_table})

# ============================================================================= ablation
# The block ablation atlas and the mode-comparison table (docs §10.6).
ATLAS_COLUMNS = results.ABLATION_ATLAS.columns(
    "model", "seed", "block", "layer", "head", "label", "ablation", "kl", "delta_top1",
    "retention_sva", "retention_quote", "retention_plural", "size", "constant_part",
)  # fmt: skip
_ATLAS_MEASURES = ("kl", "delta_top1", "retention_sva", "retention_quote", "retention_plural")
BLOCK_ORDER = {"attn": 0, "mlp": 1, "head": 2}


def atlas_wide(atlas: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, seed, block): size, constant part and every measure under zero
    and under mean ablation side by side (``kl_zero``, ``kl_mean``, …) plus the mean task
    retention of each ablation, blocks in (layer, attn, mlp, heads) order."""
    keys = ["model", "seed", "block", "layer", "head", "label"]
    atlas = atlas.assign(head=atlas["head"].astype("Int64"))
    desc = atlas.drop_duplicates(keys)[[*keys, "size", "constant_part"]]
    wide = atlas.pivot_table(
        index=keys, columns="ablation", values=list(_ATLAS_MEASURES), dropna=False
    )
    wide.columns = [f"{measure}_{ablation}" for measure, ablation in wide.columns]
    frame = desc.merge(wide.reset_index(), on=keys, validate="one_to_one")
    for ab in ("zero", "mean"):
        cols = [f"retention_{t}_{ab}" for t in TASK_ORDER]
        frame[f"retention_{ab}"] = frame[cols].mean(axis=1)
    frame["_b"] = frame["block"].map(BLOCK_ORDER)
    frame = frame.sort_values(["layer", "_b", "head"], kind="stable").drop(columns="_b")
    return frame.reset_index(drop=True)


def ablation_atlas_table(inputs: Inputs) -> Table:
    """Per model the blocks with the largest zero-ablation KL, with mean ablation beside
    them, size and constant part; the CSV holds every block (docs §10.6)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_atlas"))
    atlas = read_kind(need_kind(inputs, "atlas", "ablation_atlas"), ATLAS_COLUMNS,
                      "ablation_atlas")  # fmt: skip
    frames, blocks = [], []
    for (_, seed), group in atlas.groupby(["model", "seed"], sort=False):
        wide = atlas_wide(group).rename(columns={"label": "block_label"})
        wide = with_runs(wide, runs, "ablation_atlas")
        frames.append(wide)
        valid = wide[["kl_zero", "kl_mean"]].dropna()
        rho = spearmanr(valid["kl_zero"], valid["kl_mean"]).statistic if len(valid) > 2 else None
        top = wide.nlargest(5, "kl_zero")
        cells = _cells(
            top,
            {
                "block_label": ("Block", str),
                "size": ("Size", lambda v: fixed(v, 2)),
                "constant_part": ("Const. part", lambda v: fixed(v, 2)),
                "kl_zero": ("KL zero", lambda v: f"{v:.3g}"),
                "kl_mean": ("KL mean", lambda v: f"{v:.3g}"),
                "delta_top1_zero": ("Δtop-1 zero", lambda v: fixed(100 * v, 1)),
                "delta_top1_mean": ("Δtop-1 mean", lambda v: fixed(100 * v, 1)),
                "retention_zero": ("Retention zero", lambda v: fixed(100 * v, 0)),
                "retention_mean": ("Retention mean", lambda v: fixed(100 * v, 0)),
            },
        )
        rho_text = "—" if rho is None or pd.isna(rho) else fixed(rho, 2)
        title = f"{wide['label'].iloc[0]} s{seed}: ρ(KL zero, KL mean) over {len(valid)} blocks"
        blocks.append(Block(cells, f"{title} = {rho_text}"))
    frame = pd.concat(frames, ignore_index=True).drop(columns=["label_repository"])
    frame = frame.sort_values(["order"], kind="stable").drop(columns=["order"])
    caption = (
        "Block ablation atlas (docs §10.6): per model the five blocks with the largest "
        "zero-ablation KL(original ‖ edited) on held-out validation text (nats), beside mean "
        "ablation; Δtop-1 in points, task retention (%) averaged over SVA, Quote and Plural; "
        "size = RMS(write)/RMS(residual); constant part = ‖mean write‖²/mean‖write‖² "
        "(1 = a fixed bias). ρ: Spearman of zero vs mean KL over every block."
    )
    return Table("ablation_atlas", frame.reset_index(drop=True), blocks, caption)


MODES_COLUMNS = results.ABLATION_MODES.columns(
    "model", "seed", "task", "mode", "base_mode", "split", "E", "N_eff", "top_head_share",
    "N_index", "N_layer_given_index", "lambda_score", "lambda_p", "spearman_vs_base",
    "N_eff_ratio", "E_ratio",
)  # fmt: skip


def ablation_modes_table(inputs: Inputs) -> Table:
    """Concentration per head-patching mode (resample | mean | zero), per model and task:
    N_eff and its ratio to patching.mode, E, top-head share, N_index × N_layer|index, Λ and
    the Spearman ρ of per-head effects against patching.mode (docs §10.6)."""
    runs = read_runs(need_kind(inputs, "runs", "ablation_modes"))
    modes = read_kind(need_kind(inputs, "modes", "ablation_modes"), MODES_COLUMNS,
                      "ablation_modes")  # fmt: skip
    frame = with_runs(modes, runs, "ablation_modes")
    order = {m: i for i, m in enumerate(dict.fromkeys(frame["mode"]))}
    frame = (
        frame.assign(
            _t=frame["task"].map({t: i for i, t in enumerate(TASK_ORDER)}),
            _m=frame["mode"].map(order),
        )
        .sort_values(["order", "_t", "_m"])
        .drop(columns=["_t", "_m", "label_repository", "order"])
    )
    cells = _cells(
        frame.assign(
            _dec=list(
                zip(frame["N_eff"], frame["N_index"], frame["N_layer_given_index"], strict=True)
            )
        ),
        {
            "label": ("Model", str),
            "task": ("Task", lambda t: TASK_TITLES.get(t, t)),
            "mode": ("Mode", str),
            "N_eff": ("N_eff", lambda v: fixed(v, 2)),
            "N_eff_ratio": ("N_eff ratio", lambda v: fixed(v, 2)),
            "E": ("E", lambda v: fixed(v, 2)),
            "top_head_share": ("Top share", lambda v: fixed(v, 2)),
            "_dec": ("N_index × N_layer|index", lambda d: decomposition_cell(*d)),
            "lambda_score": ("Λ", lambda v: "—" if v is None or pd.isna(v) else fixed(v, 2)),
            "lambda_p": ("Λ p", format_p),
            "spearman_vs_base": ("ρ vs base", lambda v: "—" if pd.isna(v) else fixed(v, 2)),
        },
    )
    base = ", ".join(sorted(set(frame["base_mode"])))
    caption = (
        f"Concentration per head-patching ablation mode (docs §10.6) on the "
        f"{', '.join(sorted(set(frame['split'])))} split; ratios and ρ (Spearman of the "
        f"per-head effects e_l,h) against patching.mode = {base}. Λ on the lanes split. "
        "resample: the reference prompt's z; mean: the head's mean z over held-out validation "
        "positions; zero: z = 0."
    )
    return Table("ablation_modes", frame.reset_index(drop=True), [Block(cells)], caption)


BUILDERS.update({"ablation_atlas": ablation_atlas_table, "ablation_modes": ablation_modes_table})

# ---------------------------------------------------------------------- edges: Table 7 (docs §15.1)
#: docs §15.1 / §20.6: per row group the ids (references.yaml) of the paper's pooled value
#: and Q, K, V medians; None where the paper gives none.
TABLE7_PAPER = {
    "learned": ("pk-kl.learned", "pk-kl.learned.Q", "pk-kl.learned.K", "pk-kl.learned.V"),
    "read-common": (
        "pk-kl.read-common", "pk-kl.read-common.Q", "pk-kl.read-common.K", "pk-kl.read-common.V"
    ),
    "frozen writes, free readers": (
        "pk-kl.frozen-free", "pk-kl.frozen-free.Q", "pk-kl.frozen-free.K", "pk-kl.frozen-free.V"
    ),
    "all-common-axis (structural)": (
        "pk-kl.all-common-axis", "pk-kl.all-common-axis.Q", "pk-kl.all-common-axis.K",
        "pk-kl.all-common-axis.V",
    ),
    "all-rotated (separate)": ("pk-kl.all-rotated", None, None, None),
    "all-rotated-self (separate)": ("pk-kl.all-rotated-self", None, None, None),
}  # fmt: skip
#: The ACDC circuit's edges into attention inputs (docs §15.4): ids of the paper's counts,
#: all and by source kind.
ACDC_PAPER = {
    "all": "acdc.into-attention",
    "head": "acdc.from-heads",
    "mlp": "acdc.from-mlps",
    "embed": "acdc.from-embeds",
}
EDGE_SUMMARY_COLUMNS = results.EDGE_SUMMARY.columns(
    "model", "seed", "task", "split", "n_examples", "n_edges", "pooled_spearman",
    "median_within_Q", "median_within_K", "median_within_V", "pk_min", "pk_max",
    "zero_pk_share",
)  # fmt: skip
ACDC_COLUMNS = results.ACDC.columns(
    "model", "seed", "source_kind", "target_kind", "target_layer", "target_head"
)


def _span(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    lo, hi = values.min(), values.max()
    return f"{lo:.2f}" if np.isclose(lo, hi, atol=5e-3) else f"{lo:.2f}–{hi:.2f}"


def table7(inputs: Inputs) -> Table:
    """Spearman(edge PK, edge KL) (paper Table 7, docs §15.1): rows grouped as the paper
    (``selections.TABLE7_GROUPS``), each a range over its models, the paper's value beside;
    a second block summarises the ACDC circuits (docs §15.4) by source type."""
    from headgeom.paper import selections

    runs = read_runs(need_kind(inputs, "runs", "table7"))
    summaries = read_kind(need_kind(inputs, "summaries", "table7"), EDGE_SUMMARY_COLUMNS,
                          "table7")  # fmt: skip
    tidy = summaries.merge(runs[["model", "seed", "geometry"]], on=["model", "seed"])
    tidy["group"] = tidy["geometry"].map(selections.TABLE7_GROUPS)
    rows = []
    for group in selections.TABLE7_ORDER:
        part = tidy[tidy["group"] == group]
        if part.empty:
            continue
        paper = [references.text(key) if key else "" for key in TABLE7_PAPER[group]]
        titles = ("Pooled", "Q (median)", "K (median)", "V (median)")
        cols = ("pooled_spearman", "median_within_Q", "median_within_K", "median_within_V")
        row = {"Model group": f"{group} ({len(part)} run{'s' if len(part) > 1 else ''})"}
        for title, col, ref in zip(titles, cols, paper, strict=True):
            row[title] = f"{_span(part[col])} [{ref}]" if ref else _span(part[col])
        row["PK range"] = f"{part['pk_min'].min():.4g}–{part['pk_max'].max():.4g}"
        rows.append(row)
    blocks = [Block(pd.DataFrame(rows))]
    acdc = _optional(inputs, "acdc", ACDC_COLUMNS)
    if len(acdc):
        into = acdc[acdc["target_kind"].isin(["q", "k", "v"])]
        arow = []
        paper = {kind: references.text(key) for kind, key in ACDC_PAPER.items()}
        for (model, seed), g in into.groupby(["model", "seed"], sort=False):
            counts = g["source_kind"].value_counts()
            arow.append({
                "Circuit": f"ACDC {model} s{seed}",
                "Edges into attention inputs": f"{len(g)} [{paper['all']}]",
                "from heads": f"{counts.get('head', 0)} [{paper['head']}]",
                "from MLPs": f"{counts.get('mlp', 0)} [{paper['mlp']}]",
                "from embeddings": f"{counts.get('embed', 0)} [{paper['embed']}]",
                "Circuit edges": str(len(acdc[acdc["model"] == model])),
            })  # fmt: skip
        blocks.append(Block(pd.DataFrame(arow), "ACDC circuit (threshold 0.001, KL)", True))
    caption = (
        "Table 7. Spearman correlation of edge PK with the edge's KL effect (first "
        f"{int(summaries['n_examples'].iloc[0])} SVA validation examples, full-vocabulary "
        "KL(P_clean ‖ P_patched) at the final position): pooled over all edges and the median "
        "within reader groups (same reader head and input X); ranges over the runs of each "
        "row, the paper's value in brackets. all-common-axis is structural (cross-index PK = 0 "
        "by design); all-rotated and all-rotated-self (uniform PK by design) are separate."
    )
    return Table("table7", tidy, blocks, caption)


BUILDERS.update({"table7": table7})


# ------------------------------------------------------------------------- coordinates (docs §15.2)
def coordinates_paper() -> dict[tuple[str, str], str]:
    """The paper's top-10 shares (docs §15.2, §20.6) per (group, site), SVA: the comparison's
    ``coordinate_share`` records of references.yaml (one model group each)."""
    return {
        (entry.args["groups"][0], entry.args["site"]): entry.paper
        for entry in references.references()
        if entry.recipe == "coordinate_share" and entry.args.get("task", "sva") == "sva"
    }


COORDINATES_COLUMNS = results.COORDINATES.columns(
    "model", "seed", "task", "site", "best_layer", "best_head", "share_evaluation",
    "share_in_sample", "null_p95", "beats_every_random_set",
)  # fmt: skip
_SITE_TITLES = {"after_wo": "after W_O", "before_wo": "before W_O",
                "before_wo_rotated": "before W_O, Haar-rotated"}  # fmt: skip


def _pct_span(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    lo, hi = 100 * values.min(), 100 * values.max()
    return f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}%"


def coordinates_table(inputs: Inputs) -> Table:
    """Top-10 single-direction shares (docs §15.2, paper App. B.2): one row per model group
    and task, a column per site (range over the group's runs, evaluation split, directions
    selected on validation), the paper's SVA value in brackets; and how often the selected
    set beats every magnitude-matched random set."""
    from headgeom.paper import selections

    runs = read_runs(need_kind(inputs, "runs", "coordinates"))
    frame = read_kind(need_kind(inputs, "coordinates", "coordinates"), COORDINATES_COLUMNS,
                      "coordinates")  # fmt: skip
    tidy = frame.merge(runs[["model", "seed", "geometry"]], on=["model", "seed"])
    tidy["group"] = tidy["geometry"].map(selections.COORDINATE_GROUPS).fillna(tidy["geometry"])
    rows, paper = [], coordinates_paper()
    groups = list(dict.fromkeys([*selections.COORDINATE_GROUPS.values(), *tidy["group"]]))
    for task in [t for t in TASK_ORDER if t in set(tidy["task"])]:
        for group in groups:
            part = tidy[(tidy["group"] == group) & (tidy["task"] == task)]
            if part.empty:
                continue
            n = part[["model", "seed"]].drop_duplicates().shape[0]
            row = {"Task": task, "Model group": f"{group} ({n} run{'s' if n > 1 else ''})"}
            for site, title in _SITE_TITLES.items():
                cell = _pct_span(part.loc[part["site"] == site, "share_evaluation"])
                ref = paper.get((group, site)) if task == "sva" else None
                row[title] = f"{cell} [{ref}]" if ref else cell
            after = part[part["site"] == "after_wo"]
            row["after W_O beats every random set"] = (
                f"{int(after['beats_every_random_set'].sum())}/{len(after)}"
            )
            rows.append(row)
    caption = (
        "Coordinate concentration (paper App. B.2). Top-10 share of single-direction effects "
        "at the best head's layer and the final position: the evaluation-split drops of the 10 "
        "directions with the largest validation drop over the sum of all positive evaluation "
        "drops; after W_O one residual coordinate of the layer's attention output, before W_O "
        "one coordinate of a head's z, and after a Haar-random rotation of each head's basis. "
        "Ranges over the runs of each row, the paper's SVA value in brackets; the last column "
        "counts runs whose selected set beats every one of the magnitude-decile-matched random "
        "sets, drawn without the selected directions (p = 1/(1 + n_random_sets))."
    )
    return Table("coordinates", tidy, [Block(pd.DataFrame(rows))], caption)


BUILDERS.update({"coordinates": coordinates_table})
