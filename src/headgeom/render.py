"""How a paper table is rendered (docs §17.1): a :class:`Table` holds the tidy, unrounded
frame (written as the CSV) and the rendered blocks, written as Markdown and as booktabs
LaTeX from the same cells, so the two always print the same numbers. Derived values are
computed from unrounded numbers; rounding happens only here, to the paper's precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd


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


def formatter(spec: str, missing: str = "—") -> Callable:
    """Formatter for a possibly missing (None/NaN) value."""
    return lambda v: missing if v is None or pd.isna(v) else spec.format(v)


def fixed(value: float, decimals: int) -> str:
    """``value`` to ``decimals`` places, without a sign on a value that rounds to zero."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def format_p(p: float) -> str:
    """A permutation p to two significant digits (0.0002, 0.03, 0.17), as the paper prints."""
    return "—" if p is None or pd.isna(p) else f"{p:.2g}"


def value_range(
    values: pd.Series,
    spec: str = "{:.2f}",
    sep: str = "–",
    scale: float = 1.0,
    unit: str = "",
    collapse: bool = True,
) -> str:
    """The range of the non-missing ``values`` (times ``scale``) as ``spec`` prints them:
    ``'lo–hi'`` (``unit`` once at the end), one value when both ends print the same (unless
    ``collapse`` is off), "—" when there is none. The one range format of every table."""
    values = pd.Series(values, dtype=float).dropna() * scale
    if values.empty:
        return "—"
    lo, hi = spec.format(values.min()), spec.format(values.max())
    return f"{lo}{unit}" if collapse and lo == hi else f"{lo}{sep}{hi}{unit}"


def cell_frame(frame: pd.DataFrame, columns: dict[str, tuple[str, Callable]]) -> pd.DataFrame:
    return pd.DataFrame(
        {title: frame[col].map(fmt).to_numpy() for col, (title, fmt) in columns.items()}
    )
