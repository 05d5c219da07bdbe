"""Appendix B.1 and B.4: edge patching against weight-space PK (Table 7, docs §15.1) and
the ACDC circuit's incoming edges by source type (docs §15.4).
"""

from __future__ import annotations

import pandas as pd

from headgeom import results
from headgeom.heads import selections
from headgeom.heads.paper import references
from headgeom.heads.paper.inputs import Inputs, need_kind, optional_kind, read_kind, read_runs
from headgeom.render import Block, Table, value_range

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


def table7(inputs: Inputs) -> Table:
    """Spearman(edge PK, edge KL) (paper Table 7, docs §15.1): rows grouped as the paper
    (``selections.TABLE7_GROUPS``), each a range over its models, the paper's value beside;
    a second block summarises the ACDC circuits (docs §15.4) by source type."""
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
            span = value_range(part[col])
            row[title] = f"{span} [{ref}]" if ref else span
        row["PK range"] = f"{part['pk_min'].min():.4g}–{part['pk_max'].max():.4g}"
        rows.append(row)
    blocks = [Block(pd.DataFrame(rows))]
    acdc = optional_kind(inputs, "acdc", ACDC_COLUMNS)
    if acdc is not None and len(acdc):
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
