"""The two acceptance checks computed from numbers alone by rule ``checks`` (docs §18): C16,
Spearman(validation loss, geometric-mean N_eff) over the paper's own Figure 4 numbers, and
the §7.3 ordering of this study's validation losses within a corpus. Both are rows of the
``checks`` table (:mod:`headgeom.checks`) like every logged check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from headgeom.checks import Logged, decoded, is_number, row
from headgeom.heads import selections
from headgeom.heads.analysis.stats import geometric_mean, spearman
from headgeom.heads.paper import references
from headgeom.io import read_parquet_metadata, read_table
from headgeom.model import zoo
from headgeom.model.zoo import PAPER_TRAINING_SEQUENCES


def paper_figure4_n_eff() -> dict[str, tuple[float, float, float]]:
    """C16 (docs §12.7): geometry -> evaluation N_eff for SVA, Quote, Plural (paper Table 6)
    of the 9 corpus-S models of paper Figure 4 (``selections.PAPER_SELECTIONS["figure4"]``),
    from headgeom/heads/paper/references.yaml (records ``neff.<geometry>.S.<task>``); their
    validation losses (§6.1) and head counts come from the model zoo
    (``zoo.CONFIGURATIONS``, ``zoo.paper_model_config``)."""
    geometries = [slot[0] for slot in selections.PAPER_SELECTIONS["figure4"]]
    tasks = ("sva", "quote", "plural")
    return {g: tuple(references.value(f"neff.{g}.S.{t}") for t in tasks) for g in geometries}


#: The paper's values to its printed three decimals: half a unit of the last digit.
C16_EXPECTED = {"all": -0.767, "twelve-head": -0.943}
C16_TOLERANCE = 5e-4


def paper_figure4() -> dict[str, tuple[float, tuple[float, float, float], int]]:
    """geometry -> (validation loss, N_eff per task, heads per layer) of the Figure 4 models."""
    out = {}
    for geometry, n_eff in paper_figure4_n_eff().items():
        config = next(c for c in zoo.CONFIGURATIONS if c.geometry == geometry and c.corpus == "S")
        n_head = zoo.paper_model_config(geometry)["n_head"]
        out[geometry] = (config.val_loss[config.seeds[0]], n_eff, n_head)
    return out


def c16() -> list[dict[str, Any]]:
    """C16 recomputed with the project's own statistics (``stats.spearman``,
    ``stats.geometric_mean``) from the paper's numbers (:func:`paper_figure4`)."""
    models = paper_figure4()
    loss = np.array([v[0] for v in models.values()])
    n_eff = geometric_mean(np.array([v[1] for v in models.values()]))
    twelve = np.array([v[2] == 12 for v in models.values()])
    rows = []
    for part, mask in (("all", np.ones_like(twelve)), ("twelve-head", twelve)):
        rho, _ = spearman(loss[mask], n_eff[mask])
        check = "C16" if part == "all" else f"C16.{part}"
        logged = Logged(
            check, "abs", abs(rho - C16_EXPECTED[part]), C16_TOLERANCE, True,
            f"Spearman {rho:.4f} over {int(mask.sum())} models; paper {C16_EXPECTED[part]}",
        )  # fmt: skip
        rows.append(row(logged, **_computed("paper Table 6 N_eff and §6.1 losses")))
    return rows


def _computed(source: str) -> dict[str, Any]:
    return {"rule": "checks", "path": None, "scope": source, "model": None, "seed": None,
            "task": None}  # fmt: skip


#: docs §7.3 [CHECK]: the ordering of validation losses within a corpus, by geometry class.
LOSS_CLASSES: dict[str, int] = {
    "learned": 0,
    "write-common-axis": 1,
    "write-common": 1,
    "write-rotated": 1,
    "read-common": 2,
    "all-common-axis": 3,
    "all-rotated": 3,
    "all-rotated-self": 3,
}
LOSS_CLASS_NAMES = ("learned", "write-*", "read-common", "all-*")


def loss_order(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The §7.3 ordering: per corpus, every run of a lower class (``LOSS_CLASSES``) has a
    strictly lower validation loss than every run of a higher class. ``runs``: ``{model,
    seed, geometry, corpus, val_loss, paper_size}``; one row per corpus with runs of at least
    two classes; residual = the number of out-of-order run pairs (tolerance 0); enforced
    only when every run compared has the paper's size and its training budget (a rehearsal's
    4-step paper-size models are reported, not held to the trained models' order)."""
    by_corpus: dict[Any, list[Mapping[str, Any]]] = {}
    for run in runs:
        if run["geometry"] in LOSS_CLASSES and run.get("val_loss") is not None:
            by_corpus.setdefault(run.get("corpus"), []).append(run)
    rows = []
    for corpus, members in by_corpus.items():
        if len({LOSS_CLASSES[r["geometry"]] for r in members}) < 2:
            continue
        bad, worst = [], None
        for a in members:
            for b in members:
                if LOSS_CLASSES[a["geometry"]] < LOSS_CLASSES[b["geometry"]]:
                    if not a["val_loss"] < b["val_loss"]:
                        bad.append((a, b))
                        gap = a["val_loss"] - b["val_loss"]
                        worst = gap if worst is None else max(worst, gap)
        shown = "; ".join(f"{a['model']} s{a['seed']} {a['val_loss']:.4f} ≥ {b['model']} "
                          f"s{b['seed']} {b['val_loss']:.4f}" for a, b in bad[:3])  # fmt: skip
        note = f"{len(members)} runs; " + (f"out of order: {shown}" if bad else "in order")
        enforced = all(r.get("paper_size") and r.get("paper_training") for r in members)
        label = "" if corpus is None else f"corpus {corpus}"
        logged = Logged("loss-order", "count", len(bad), 0.0, enforced, note)
        rows.append(row(logged, **{**_computed("validation losses of the runs"),
                                    "scope": label or "every run"}))  # fmt: skip
    return rows


def loss_runs(
    files: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``runs`` (``{model, seed, geometry, corpus}``) with the validation loss their run log
    records (``val_loss_nats``, None without one), whether they have the paper's size
    (``expected_n_params`` of the parameter counts is set) and its training budget (the run
    config's steps × batch_size against the zoo's ``PAPER_TRAINING_SEQUENCES``), for
    :func:`loss_order`."""

    logs = {(f["model"], int(f["seed"])): f["path"] for f in files
            if f["kind"] in ("train_log", "run_log")}  # fmt: skip
    paper: dict[tuple[str, int], bool] = {}
    for f in files:
        if f["kind"] == "param_counts":
            counts = read_table(f["path"], columns=["model", "seed", "expected_n_params"])
            for row in counts.to_pylist():
                paper[(row["model"], int(row["seed"]))] = row["expected_n_params"] is not None
    out = []
    for run in runs:
        key = (run["model"], int(run["seed"]))
        meta = read_parquet_metadata(logs[key]) if key in logs else {}
        loss = decoded(meta.get("val_loss_nats"))
        config = decoded(meta.get("config"))
        training = (config.get("training") if isinstance(config, dict) else None) or {}
        sequences = training.get("steps", 0) * training.get("batch_size", 0)
        out.append({**run, "val_loss": loss if is_number(loss) else None,
                    "paper_size": paper.get(key, False),
                    "paper_training": sequences >= PAPER_TRAINING_SEQUENCES})  # fmt: skip
    return out


def cross_run_checks(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checks computed from numbers alone: C16 and the §7.3 loss ordering."""
    return c16() + loss_order(runs)
