"""The atlas page as one self-contained HTML file per model: Vega, Vega-Lite and vega-embed
inlined, the charts' specifications, the page's script, and every table as JSON (column-wise,
:func:`headgeom.webpage.columns`). Nothing on the page is fetched: no server, no network, no
CDN.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from string import Template

import vl_convert

from headgeom.atlas.page import views
from headgeom.atlas.page.data import AtlasData, gather
from headgeom.io import write_text
from headgeom.webpage import asset, columns, script_json, shared_script

#: The edits in the order the switch lists them, and their names on the page (the article's).
EDITS = {
    "zero": "Zero",
    "average": "Average",
    "rows_mean": "rows→mean",
    "skip": "layer skip",
    "flatten_keys": "flatten keys",
}


def payload(data: AtlasData) -> dict:
    """Everything the page's script reads: the tables, where they came from, the charts."""
    profile, effects = data.tables["profile"], data.tables["effects"]
    # the block kinds the profile draws: its own and the targets of one layer's edits
    per_layer = effects[effects["layer"] >= 0]
    present = set(profile["block"]) | set(per_layer["target"])
    blocks = [b for b in views.BLOCKS if b in present] + sorted(present - set(views.BLOCKS))
    layers = set(profile["layer"]) | set(per_layer["layer"])
    drift = [p.tables["drift"] for p in data.pairs if "drift" in p.tables]
    drift_layers = max((d.loc[d["layer"] >= 0, "layer"].nunique() for d in drift), default=0)
    drift_groups = list(dict.fromkeys(g for d in drift for g in d["group"]))
    volume_knob = bool(profile["knob_rms"].notna().any())
    return {
        "model": data.model,
        "tables": {name: columns(frame) for name, frame in data.tables.items()},
        "pairs": [
            {"name": p.name, "tables": {n: columns(f) for n, f in p.tables.items()}}
            for p in data.pairs
        ],
        "sources": [
            {"table": s.table, "path": s.path, "sha256": s.sha256, "pair": s.pair}
            for s in data.sources
        ],
        "edit_names": EDITS,
        "specs": views.specs(blocks, len(layers), volume_knob, drift_layers, drift_groups),
    }


def render(data: AtlasData, title: str | None = None, lede: str | None = None) -> str:
    """The page's HTML text."""
    title = title or f"Edit atlas: {data.model}"
    pairs = ", ".join(p.name for p in data.pairs)
    lede = lede or (
        f"What each block of {data.model} does, read from what is lost when it is removed, "
        "averaged or compressed"
        + (f"; and what changed between checkpoints ({pairs})." if pairs else ".")
    )
    return Template(asset(__package__, "atlas.html")).substitute(
        title=html.escape(title),
        lede=html.escape(lede),
        vega=vl_convert.javascript_bundle(),
        data=script_json(payload(data)),
        shared=shared_script(),
        app=asset(__package__, "atlas.js"),
    )


def write_page(
    paths: Mapping[str, str | os.PathLike],
    out_html: str | os.PathLike,
    model: str,
    pairs: Mapping[str, str | os.PathLike] | None = None,
    title: str | None = None,
) -> int:
    """Write ``model``'s atlas page from its tables (``paths``: table -> Parquet, as
    :func:`headgeom.atlas.page.data.gather` takes them; with the two-checkpoint views of
    ``pairs``: name -> folder), atomically; its size in bytes."""
    text = render(gather(paths, model, pairs), title)
    write_text(out_html, text)
    return len(text.encode("utf-8"))
