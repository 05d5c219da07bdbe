"""The atlas's tables in Markdown: the edits that move predictions most, and "size is not
importance" — the blocks whose Zero and Average KL differ most, beside their write size and
constant part (a block whose write is nearly one fixed vector loses little when averaged and
much when zeroed)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of string cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _fmt(value: float, digits: int = 3) -> str:
    return "–" if pd.isna(value) else f"{value:.{digits}g}"


def size_is_not_importance(summary: pd.DataFrame, profile: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ``n`` blocks whose Zero and Average KL (averaged over corpora) differ most: block,
    both KLs, their difference, write size and constant part."""
    single = summary[(summary["layer"] >= 0) & summary["kind"].isin(["zero", "average"])]
    wide = single.pivot_table(index=["layer", "target"], columns="kind", values="kl")
    if not {"zero", "average"} <= set(wide.columns):
        return pd.DataFrame()
    wide = wide.dropna(subset=["zero", "average"]).reset_index()
    wide["difference"] = wide["zero"] - wide["average"]
    top = wide.reindex(wide["difference"].abs().sort_values(ascending=False).index).head(n)
    prof = profile.set_index(["layer", "block"])
    return pd.DataFrame({
        "block": [f"L{r.layer}.{r.target}" for r in top.itertuples()],
        "KL zero": top["zero"].to_numpy(), "KL average": top["average"].to_numpy(),
        "difference": top["difference"].to_numpy(),
        "write size": [prof.loc[(r.layer, r.target), "write_size"] for r in top.itertuples()],
        "constant part": [prof.loc[(r.layer, r.target), "constant_part"]
                          for r in top.itertuples()],
    })  # fmt: skip


def markdown(summary: pd.DataFrame, effects: pd.DataFrame, profile: pd.DataFrame, n: int) -> str:
    """The report: the ``n`` edits of largest mean KL (per corpus beside the mean), then the
    size-is-not-importance table."""
    top = summary.sort_values("kl", ascending=False).head(n)
    per_corpus = effects.pivot_table(index="edit", columns="corpus", values="kl")
    corpora = list(per_corpus.columns)
    rows = [[r.edit, _fmt(r.kl), *(_fmt(per_corpus.loc[r.edit, c]) for c in corpora),
             _fmt(r.delta_top1, 2), _fmt(r.mean_retention)] for r in top.itertuples()]  # fmt: skip
    head = ["edit", "KL (mean)", *(f"KL {c}" for c in corpora), "Δ top-1 (pt)", "retention"]
    out = [f"## The {n} edits that move predictions most\n", md_table(head, rows), ""]
    size = size_is_not_importance(summary, profile, 5)
    if not size.empty:
        out += ["## Size is not importance: Zero against Average\n",
                md_table(list(size.columns),
                         [[v if isinstance(v, str) else _fmt(v) for v in r]
                          for r in size.itertuples(index=False)]), ""]  # fmt: skip
    return "\n".join(out)
