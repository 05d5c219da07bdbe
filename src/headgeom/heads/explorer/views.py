"""The explorer's charts as Vega-Lite specifications (built with altair, which validates
them against the Vega-Lite schema). Each chart reads one named dataset that the page's
script fills with the rows of the current selection, so one chart serves every run.

Selections come from the page (``sel_layer``/``sel_head``, ``sel_block``, ``vmax``,
``step``): the script sets these parameters when a cell is clicked or a control changes.
"""

from __future__ import annotations

import altair as alt

from headgeom.heads.explorer.data import TOP_PAIRS
from headgeom.heads.paper.lanes import ASINH_WIDTH

#: Figure 8's parts of a head's patching effect, in the order the bars are drawn
#: (docs §16: order A, then the other order's parts).
CLAMP_PARTS = (
    ("e_stored", "Δ(∅) = e"),
    ("direct", "direct"),
    ("via_attention_a", "via later heads (A)"),
    ("via_mlps_a", "via MLPs (A)"),
    ("via_attention_b", "via later heads (B)"),
    ("via_mlps_b", "via MLPs (B)"),
    ("interaction", "interaction I"),
)
#: Figure 6 (a)–(c): the timeline's panels, (column, title) each.
TIMELINE_PANELS = (
    (("sva_accuracy",), "(a) SVA accuracy (evaluation split)"),
    (("lambda_score",), "(b) lane score Λ, SVA (discovery split)"),
    (("idempotence_median", "own_best_fraction"), "(c) median P(T_h) and own-best fraction"),
)


def _param(name: str, value) -> alt.Parameter:
    return alt.param(name=name, value=value)


def _selected(layer: str = "layer", head: str = "head") -> str:
    return f"datum.{layer} === sel_layer && datum.{head} === sel_head"


def head_grid() -> dict:
    """Head-effect grid (paper Figure 5): layer × head, colour asinh-like about 0 (the
    paper's RdBu_r with asinh(e/0.2); Vega-Lite's symlog with the same constant), the
    selected head outlined."""
    scale = alt.Scale(
        type="symlog",
        constant=ASINH_WIDTH,
        scheme="redblue",
        reverse=True,
        domain=alt.ExprRef("[-vmax, vmax]"),
    )
    chart = (
        alt.Chart(alt.Data(name="heads"), width=alt.Step(28), height=alt.Step(28))
        .mark_rect(cursor="pointer")
        .encode(
            x=alt.X("head:O", title="head"),
            y=alt.Y("layer:O", title="layer", sort="descending"),
            color=alt.Color("e:Q", scale=scale, title="e (logit)"),
            stroke=alt.condition(_selected(), alt.value("black"), alt.value(None)),
            strokeWidth=alt.condition(_selected(), alt.value(2.5), alt.value(0)),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("head:O"),
                alt.Tooltip("e:Q", format=".4g"),
                alt.Tooltip("p:Q", format=".4g"),
                alt.Tooltip("ci_low:Q", format=".4g", title="95% CI low"),
                alt.Tooltip("ci_high:Q", format=".4g", title="95% CI high"),
                alt.Tooltip("n:Q", title="examples"),
            ],
        )
        .add_params(_param("sel_layer", -1), _param("sel_head", -1), _param("vmax", 1.0))
    )
    return chart.to_dict()


def leakage_scatter() -> dict:
    """§5.1 leakage of the selected source head into each later reader: L against the
    isotropic expectation ρ (the dashed line L = ρ), the strongest pairs labelled."""
    base = alt.Chart(alt.Data(name="leakage"))
    points = base.mark_point(filled=True, opacity=0.75).encode(
        x=alt.X("rho:Q", title="ρ (isotropic expectation)"),
        y=alt.Y("leakage:Q", title="leakage L"),
        color=alt.Color("read_type:N", title="read type"),
        size=alt.condition("datum.top_pair", alt.value(140), alt.value(30)),
        stroke=alt.condition("datum.top_pair", alt.value("black"), alt.value(None)),
        tooltip=[
            alt.Tooltip("reader_layer:O", title="reader layer"),
            alt.Tooltip("reader_head:O", title="reader head"),
            alt.Tooltip("read_type:N"),
            alt.Tooltip("leakage:Q", format=".4g", title="L"),
            alt.Tooltip("rho:Q", format=".4g", title="ρ"),
            alt.Tooltip("leakage_over_rho:Q", format=".4g", title="L/ρ"),
        ],
    )
    # the strongest pairs' labels, stacked so nearby points stay readable (label_rank:
    # 0 for the largest L, set by the page)
    labels = [
        base.transform_filter(f"datum.top_pair && datum.label_rank === {i}")
        .transform_calculate(
            pair="'L' + datum.reader_layer + '.H' + datum.reader_head + ' ' + datum.read_type"
        )
        .mark_text(align="left", dx=9, dy=12 * i - 12, fontSize=10)
        .encode(x="rho:Q", y="leakage:Q", text="pair:N")
        for i in range(TOP_PAIRS)
    ]
    diagonal = (
        alt.Chart(alt.Data(values=[{"v": 0.0}, {"v": 1.0}]))
        .mark_line(strokeDash=[4, 3], color="#888")
        .encode(x="v:Q", y="v:Q")
    )
    return alt.layer(diagonal, points, *labels, width=300, height=240).to_dict()


def clamp_parts() -> dict:
    """Figure 8's decomposition of the selected head's effect (clamp runs: top-5 heads)."""
    chart = (
        alt.Chart(alt.Data(name="clamps"), width=260, height=alt.Step(18))
        .mark_bar()
        .encode(
            y=alt.Y("part:N", sort=None, title=None),
            x=alt.X("value:Q", title="drop (logit units)"),
            color=alt.condition("datum.value >= 0", alt.value("#b2182b"), alt.value("#2166ac")),
            tooltip=[alt.Tooltip("part:N"), alt.Tooltip("value:Q", format=".4g")],
        )
    )
    return chart.to_dict()


def edge_bars(name: str, title: str) -> dict:
    """A head's strongest Table 7 edges (``name``: edges_in or edges_out), by KL."""
    chart = (
        alt.Chart(alt.Data(name=name), width=220, height=alt.Step(16), title=title)
        .mark_bar(color="#4c72b0")
        .encode(
            y=alt.Y("edge:N", sort="-x", title=None),
            x=alt.X("kl:Q", title="KL (nats)"),
            tooltip=[
                alt.Tooltip("edge:N"),
                alt.Tooltip("kl:Q", format=".4g", title="KL"),
                alt.Tooltip("pk:Q", format=".4g", title="PK"),
            ],
        )
    )
    return chart.to_dict()


def atlas() -> dict:
    """Block ablation atlas: one circle per written block, its area the write's size and
    its colour the KL of deleting it, so a big but harmless write reads as a big pale
    circle ("size is not importance")."""
    selected = "datum.label === sel_block"
    chart = (
        alt.Chart(alt.Data(name="atlas"), width=alt.Step(34), height=alt.Step(18))
        .mark_circle(cursor="pointer", opacity=0.9)
        .encode(
            x=alt.X("layer:O", title="layer"),
            y=alt.Y("row:N", title=None, sort=alt.EncodingSortField("row_order")),
            size=alt.Size("size:Q", title="size (RMS ratio)", scale=alt.Scale(range=[15, 420])),
            # one scale for both ablations of the run (kl_max: set by the page), so the
            # switch changes colours only where the KL changes
            color=alt.Color(
                "kl:Q",
                title="KL (nats)",
                scale=alt.Scale(type="sqrt", scheme="viridis", domain=alt.ExprRef("[0, kl_max]")),
            ),
            stroke=alt.condition(selected, alt.value("red"), alt.value(None)),
            strokeWidth=alt.condition(selected, alt.value(2.5), alt.value(0)),
            tooltip=[
                alt.Tooltip("label:N", title="block"),
                alt.Tooltip("kl:Q", format=".4g", title="KL"),
                alt.Tooltip("delta_top1:Q", format=".4g", title="Δ top-1"),
                alt.Tooltip("retention_sva:Q", format=".3f", title="retention SVA"),
                alt.Tooltip("retention_quote:Q", format=".3f", title="retention Quote"),
                alt.Tooltip("retention_plural:Q", format=".3f", title="retention Plural"),
                alt.Tooltip("size:Q", format=".4g"),
                alt.Tooltip("constant_part:Q", format=".4g", title="constant part"),
            ],
        )
        .add_params(_param("sel_block", ""), _param("kl_max", 1.0))
    )
    return chart.to_dict()


def timeline() -> dict:
    """Figure 6 (a)–(c) over training steps (log scale), the slider's step as a rule."""
    panels = []
    for columns, title in TIMELINE_PANELS:
        base = alt.Chart(alt.Data(name="timeline"), width=230, height=170, title=title)
        lines = (
            base.transform_fold(list(columns), as_=["quantity", "value"])
            .mark_line(point=True)
            .encode(
                x=alt.X(
                    "step:Q",
                    scale=alt.Scale(type="log"),
                    axis=alt.Axis(labelOverlap="greedy", format="~s"),
                    title="training step (log)",
                ),
                y=alt.Y("value:Q", title=None),
                color=alt.Color("quantity:N", legend=alt.Legend(orient="bottom", title=None)),
                tooltip=[
                    alt.Tooltip("step:Q"),
                    alt.Tooltip("quantity:N"),
                    alt.Tooltip("value:Q", format=".4g"),
                ],
            )
        )
        rule = (
            alt.Chart(alt.Data(name="timeline_step"))
            .mark_rule(color="black", strokeDash=[3, 2])
            .encode(x="step:Q")
        )
        panels.append(alt.layer(lines, rule))
    return alt.hconcat(*panels).resolve_scale(color="independent").to_dict()


def specs() -> dict[str, dict]:
    """Every chart of the page, by the id of the element it is drawn into."""
    return {
        "grid": head_grid(),
        "leakage": leakage_scatter(),
        "clamps": clamp_parts(),
        "edges-in": edge_bars("edges_in", "into the head (it reads)"),
        "edges-out": edge_bars("edges_out", "out of the head (it writes)"),
        "atlas": atlas(),
        "timeline": timeline(),
    }
