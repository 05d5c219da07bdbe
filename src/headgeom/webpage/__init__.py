"""What every offline HTML page of the workspace shares (the head-geometry explorer, the
edit atlas page): tables embedded as JSON blocks, column-wise, and the script that turns them
back into rows, fills detail tables and draws the Vega-Lite charts (``webpage.js``).

A page is one self-contained file: Vega, Vega-Lite and vega-embed inlined (the bundle
``vl-convert`` ships), no server, no network, no CDN.
"""

from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np
import pandas as pd

#: A text column with at most this many distinct values is sent as levels and codes.
MAX_LEVELS = 256


def value(x):
    """A JSON value: NaN and None become null, numpy scalars Python ones."""
    if x is None or x is pd.NA:
        return None
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def is_text(values: pd.Series) -> bool:
    return values.dtype == object or pd.api.types.is_string_dtype(values.dtype)


def _column(values: pd.Series) -> list | dict:
    if is_text(values) and values.nunique(dropna=False) <= MAX_LEVELS:
        codes, levels = pd.factorize(values, use_na_sentinel=False)
        if all(isinstance(v, str) for v in levels):
            # task, split, block, corpus: a few values repeated on every row
            return {"levels": list(levels), "codes": codes.tolist()}
    return [value(v) for v in values.tolist()]


def columns(frame: pd.DataFrame) -> dict[str, list | dict]:
    """A table as {column: [values]} (text columns as {"levels", "codes"}): less than half
    the size of one JSON object per row. ``toRows`` in ``webpage.js`` reads it back."""
    return {c: _column(frame[c]) for c in frame.columns}


def script_json(obj) -> str:
    """``obj`` as JSON that can sit inside a ``<script>`` block."""
    # "</" would end the <script> block the JSON sits in
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace(
        "</", "<\\/"
    )


def asset(package: str, name: str) -> str:
    """A text file shipped inside ``package`` (a page's layout or script)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def shared_script() -> str:
    """``webpage.js``: rows from columns, number formatting, detail tables, chart drawing."""
    return asset(__name__, "webpage.js")
