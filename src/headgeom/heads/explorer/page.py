"""The explorer as one self-contained HTML file (docs §19): Vega, Vega-Lite and vega-embed
inlined (the bundle ``vl-convert`` ships), the charts' specifications, the page's script,
and the data as JSON blocks: one per run, parsed only when the run is shown (the embedding and
the script shared with the other pages: :mod:`headgeom.webpage`).

Nothing on the page is fetched: no server, no network, no CDN (a test checks that no
``src=`` or ``href=`` leaves the file).
"""

from __future__ import annotations

import html
import os
from string import Template

import vl_convert

from headgeom.heads.explorer import views
from headgeom.heads.explorer.data import TOP_EDGES, TOP_PAIRS, ExplorerData, run_key
from headgeom.io import write_text
from headgeom.webpage import asset, columns, script_json, shared_script, value

#: [CHOICE] The split the grid opens on (the paper's analysis split), when the study has it.
DEFAULT_SPLIT = "evaluation"


def default_run(data: ExplorerData) -> int:
    """The run the page opens on: the first with the most views (the leakage, clamp, edge
    and atlas runs before a run with the grid only)."""
    return max(range(len(data.runs)), key=lambda i: (len(data.runs[i].tables), -i), default=0)


def meta(data: ExplorerData) -> dict:
    """Everything but the runs' tables: runs, tasks, splits, sources, the timeline, specs."""
    timeline_runs = (
        data.timeline[["model", "seed"]].drop_duplicates().to_dict("records")
        if len(data.timeline)
        else []
    )
    split = DEFAULT_SPLIT if DEFAULT_SPLIT in data.splits else (data.splits or [None])[0]
    return {
        "runs": [{"model": r.model, "seed": r.seed, "key": r.key} for r in data.runs],
        "tasks": data.tasks,
        "splits": data.splits,
        "default_split": split,
        "sources": [
            {
                "view": s.view,
                "path": s.path,
                "sha256": s.sha256,
                "run": None if s.model is None else run_key(s.model, s.seed),
                "task": s.task,
            }
            for s in data.sources
        ],
        "timeline_runs": [
            {"model": r["model"], "seed": int(r["seed"]), "key": run_key(r["model"], r["seed"])}
            for r in timeline_runs
        ],
        "timeline": [
            {k: value(v) for k, v in row.items()} for row in data.timeline.to_dict("records")
        ],
        "clamp_parts": [list(p) for p in views.CLAMP_PARTS],
        "top_edges": TOP_EDGES,
        "top_pairs": TOP_PAIRS,
        "default_run": default_run(data),
        "specs": views.specs(),
    }


def render(data: ExplorerData, title: str, lede: str) -> str:
    """The page's HTML text."""
    runs = "\n".join(
        f'<script type="application/json" id="run-{i}">'
        f"{script_json({k: columns(v) for k, v in run.tables.items()})}</script>"
        for i, run in enumerate(data.runs)
    )
    return Template(asset("headgeom.heads.explorer", "page.html")).substitute(
        title=html.escape(title),
        lede=html.escape(lede),
        vega=vl_convert.javascript_bundle(),
        meta=script_json(meta(data)),
        runs=runs,
        shared=shared_script(),
        app=asset("headgeom.heads.explorer", "explorer.js"),
    )


def write(path: str | os.PathLike, data: ExplorerData, title: str, lede: str) -> int:
    """Write the page atomically; its size in bytes."""
    html = render(data, title, lede)
    write_text(path, html)
    return len(html.encode("utf-8"))
