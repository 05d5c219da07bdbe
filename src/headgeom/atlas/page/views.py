"""The atlas page's charts as Vega-Lite specifications (built with altair, which validates
them against the Vega-Lite schema). Each chart reads named datasets that the page's script
fills with the rows of the current selection; the selection itself comes in as parameters
(``sel_layer``, ``kl_max``) the script sets.
"""

from __future__ import annotations

import altair as alt

#: The blocks in the order the charts list them, and their colours (one per block kind on
#: every chart: attention blue, MLP orange, PLE green): the profile's blocks, then the other
#: edit targets (headgeom.atlas.edits.EDIT_TARGETS: a layer, its keys, the token embedding).
BLOCKS = ("attn", "mlp", "ple", "layer", "keys", "embed")
BLOCK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b2", "#da8bc3", "#937860")
#: Shown when the layer is selected / not selected (profile columns).
SELECTED_FILL = "#ffe8a3"


def _param(name: str, value) -> alt.Parameter:
    return alt.param(name=name, value=value)


def _block_colour(blocks: list[str]) -> alt.Color:
    """Each block kind's colour, the legend listing only the kinds the model has."""
    colours = dict(zip(BLOCKS, BLOCK_COLOURS, strict=True))
    return alt.Color(
        "block:N",
        title="block",
        scale=alt.Scale(domain=blocks, range=[colours.get(b, "#999999") for b in blocks]),
        legend=alt.Legend(orient="top"),
    )


_SELECTED = "datum.layer === sel_layer"
_LAYER_AXIS = alt.Axis(labelAngle=0)


def _columns_behind() -> alt.Chart:
    """One full-height rect per layer behind a panel's bars: what a click on a column hits
    (not only its bars), shaded for the selected layer."""
    return (
        alt.Chart(alt.Data(name="layers"))
        .mark_rect(cursor="pointer")
        .encode(
            x=alt.X("layer:O", title="layer", axis=_LAYER_AXIS),
            color=alt.condition(_SELECTED, alt.value(SELECTED_FILL), alt.value("#ffffff")),
            tooltip=[alt.Tooltip("layer:O")],
        )
    )


def _panel(
    data: str, field: str, name: str, title: str, by_block: bool, blocks: list[str], step: int
) -> alt.LayerChart:
    encoding = {
        "x": alt.X("layer:O", title="layer", axis=_LAYER_AXIS),
        "y": alt.Y(f"{field}:Q", title=None),
        "opacity": alt.condition(_SELECTED, alt.value(1.0), alt.value(0.6)),
        "tooltip": [
            alt.Tooltip("layer:O"),
            *([alt.Tooltip("block:N")] if by_block else []),
            alt.Tooltip(f"{field}:Q", format=".4g", title=name),
        ],
    }
    if by_block:
        encoding |= {"xOffset": alt.XOffset("block:N", sort=blocks), "color": _block_colour(blocks)}
        mark = {}
    else:
        encoding["color"] = alt.value("#777777")
        mark = {"width": alt.RelativeBandSize(0.6)}
    bars = alt.Chart(alt.Data(name=data)).mark_bar(cursor="pointer", **mark).encode(**encoding)
    # the step of a layer's column (its bars share it), not of one bar
    width = alt.Step(step, **{"for": "position"})
    return alt.layer(
        _columns_behind(),
        bars,
        height=70,
        width=width,
        title=alt.TitleParams(title, anchor="start", fontSize=12),
    )


#: The profile's rows: (dataset, column, name, title, one bar per block).
PROFILE_ROWS = (
    ("profile", "write_size", "write size", "write size: RMS(write) / RMS(incoming stream)", True),
    ("profile", "constant_part", "constant part", "constant part: ‖mean write‖² / mean ‖write‖²",
     True),
    ("profile", "knob_rms", "volume knob", "volume knob: RMS of the post-norm gain", True),
    ("old_state", "old_state_carried", "old state carried",
     "old state carried: RMS(in) / RMS(in + the layer's writes)", False),
    ("profile_kl", "kl", "KL", "KL of the selected edit (nats, mean over corpora)", True),
)  # fmt: skip


def layer_step(n_layers: int) -> int:
    """Pixels per layer column: about 900 px for the whole profile, within [18, 64]."""
    return max(18, min(64, 900 // max(n_layers, 1)))


def profile(blocks: list[str], n_layers: int, volume_knob: bool) -> dict:
    """The per-layer profile: one panel per quantity over the layers, one bar per block, the
    last the KL of the edit the switch selects (size is not importance: compare the first
    panel with the last). ``blocks``: the block kinds drawn, in order; ``volume_knob``: the
    model has post-norm weights."""
    step = layer_step(n_layers)
    panels = [
        _panel(data, field, name, title, by_block, blocks, step)
        for data, field, name, title, by_block in PROFILE_ROWS
        if volume_knob or field != "knob_rms"
    ]
    chart = alt.vconcat(*panels, spacing=14).add_params(_param("sel_layer", -1))
    return chart.to_dict()


def heat_map() -> dict:
    """KL of the selected edit per block (rows: layers, one panel per block kind) and per
    corpus (columns, the mean over the corpora first); one colour scale for every edit of
    the model (``kl_max``), so the switch changes colours only where the KL changes."""
    cell = (
        alt.Chart(alt.Data(name="heat"), width=alt.Step(26), height=alt.Step(13))
        .mark_rect(cursor="pointer")
        .encode(
            x=alt.X(
                "corpus:N",
                sort=alt.EncodingSortField("corpus_order"),
                title=None,
                axis=alt.Axis(orient="top", labelAngle=-45),
            ),
            y=alt.Y(
                "layer:O",
                title="layer",
                axis=alt.Axis(labelExpr="datum.value < 0 ? 'table' : datum.label"),
            ),
            color=alt.Color(
                "kl:Q",
                title="KL (nats)",
                scale=alt.Scale(type="sqrt", scheme="orangered", domain=alt.ExprRef("[0, kl_max]")),
                legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=160),
            ),
            stroke=alt.condition(_SELECTED, alt.value("black"), alt.value(None)),
            strokeWidth=alt.condition(_SELECTED, alt.value(1.5), alt.value(0)),
            tooltip=[
                alt.Tooltip("block:N"),
                alt.Tooltip("layer:O"),
                alt.Tooltip("corpus:N"),
                alt.Tooltip("kl:Q", format=".4f", title="KL"),
                alt.Tooltip("delta_top1:Q", format=".3f", title="Δ top-1 (points)"),
            ],
        )
    )
    chart = cell.facet(
        column=alt.Column(
            "block:N", sort=list(BLOCKS), title=None, header=alt.Header(labelFontWeight="bold")
        ),
    ).add_params(_param("sel_layer", -1), _param("kl_max", 1.0))
    return chart.to_dict()


def compression() -> dict:
    """Size against damage: one point per compressed variant (log size, KL on a scale linear
    near 0, so the lossless original sits on the axis)."""
    chart = (
        alt.Chart(alt.Data(name="compression"), width=380, height=240)
        .mark_point(filled=True, size=70, opacity=0.85)
        .encode(
            x=alt.X(
                "bytes:Q",
                title="size (bytes, log)",
                scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~s"),
            ),
            y=alt.Y("kl:Q", title="KL (nats)", scale=alt.Scale(type="symlog", constant=1e-3)),
            color=alt.Color("method:N", title="method"),
            shape=alt.Shape("group:N", title="group"),
            tooltip=[
                alt.Tooltip("method:N"),
                alt.Tooltip("group:N"),
                alt.Tooltip("setting:N"),
                alt.Tooltip("bytes:Q", format=",d"),
                alt.Tooltip("kl:Q", format=".4g", title="KL"),
                alt.Tooltip("delta_top1:Q", format=".3f", title="Δ top-1"),
                alt.Tooltip("retention:Q", format=".4f"),
            ],
        )
    )
    return chart.to_dict()


def blend() -> dict:
    """The instruction-strength dial: KL to each end and retention over α, the dial's α as a
    rule, A (α = 0) and B (α = 1) marked."""
    marks = alt.Chart(alt.Data(values=[{"alpha": 0.0, "end": "A"}, {"alpha": 1.0, "end": "B"}]))
    ends = alt.layer(
        marks.mark_rule(color="#aaa", strokeDash=[2, 2]).encode(x="alpha:Q"),
        marks.mark_text(dy=-6, color="#555", fontWeight="bold").encode(
            x="alpha:Q", y=alt.value(0), text="end:N"
        ),
    )
    at = (
        alt.Chart(alt.Data(name="blend_at"))
        .mark_rule(color="black", strokeWidth=2)
        .encode(x="alpha:Q")
    )
    x = alt.X("alpha:Q", title="α  (W = (1 − α)·A + α·B)", scale=alt.Scale(nice=False, padding=8))
    kl = (
        alt.Chart(alt.Data(name="blend"))
        .transform_fold(["kl_to_a", "kl_to_b"], as_=["to", "kl"])
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("kl:Q", title="KL (nats)"),
            color=alt.Color(
                "to:N",
                title=None,
                scale=alt.Scale(domain=["kl_to_a", "kl_to_b"], range=["#4c72b0", "#c44e52"]),
                legend=alt.Legend(
                    orient="top", labelExpr="datum.value === 'kl_to_a' ? 'KL to A' : 'KL to B'"
                ),
            ),
            tooltip=[
                alt.Tooltip("alpha:Q"),
                alt.Tooltip("to:N"),
                alt.Tooltip("kl:Q", format=".4g"),
            ],
        )
    )
    retention = (
        alt.Chart(alt.Data(name="blend"))
        .mark_line(point=True, color="#55a868")
        .encode(
            x=x,
            y=alt.Y("retention:Q", title="retention (mean over skills)"),
            tooltip=[alt.Tooltip("alpha:Q"), alt.Tooltip("retention:Q", format=".4f")],
        )
    )
    return alt.hconcat(
        alt.layer(ends, kl, at, width=300, height=200),
        alt.layer(ends, retention, at, width=300, height=200),
    ).to_dict()


def _group_colour(groups: list[str], legend: bool) -> alt.Color:
    """One colour per tensor group, the same in both drift charts."""
    return alt.Color(
        "group:N",
        title="group",
        scale=alt.Scale(domain=groups, scheme="tableau10"),
        legend=alt.Legend(orient="top") if legend else None,
    )


def drift_layers(n_layers: int, groups: list[str]) -> dict:
    """‖W_B − W_A‖ / ‖W_A‖ of each per-layer tensor: one group of bars per layer."""
    width = alt.Step(layer_step(n_layers), **{"for": "position"})
    chart = (
        alt.Chart(alt.Data(name="drift_layers"), width=width, height=160)
        .mark_bar()
        .encode(
            x=alt.X("layer:O", title="layer", axis=_LAYER_AXIS),
            xOffset=alt.XOffset("kind:N"),
            y=alt.Y("drift:Q", title="drift ‖W_B − W_A‖ / ‖W_A‖"),
            color=_group_colour(groups, legend=True),
            tooltip=[
                alt.Tooltip("tensor:N"),
                alt.Tooltip("group:N"),
                alt.Tooltip("drift:Q", format=".4g"),
            ],
        )
    )
    return chart.to_dict()


def drift_other(groups: list[str]) -> dict:
    """Drift of the tensors that belong to no layer (tables, final norm)."""
    chart = (
        alt.Chart(alt.Data(name="drift_other"), width=240, height=alt.Step(16))
        .mark_bar()
        .encode(
            y=alt.Y("tensor:N", title=None, sort="-x"),
            x=alt.X("drift:Q", title="drift"),
            color=_group_colour(groups, legend=False),
            tooltip=[
                alt.Tooltip("tensor:N"),
                alt.Tooltip("group:N"),
                alt.Tooltip("drift:Q", format=".4g"),
            ],
        )
    )
    return chart.to_dict()


def specs(
    blocks: list[str],
    n_layers: int,
    volume_knob: bool,
    n_drift_layers: int = 0,
    drift_groups: list[str] = (),
) -> dict[str, dict]:
    """Every chart of the page, by the id of the element it is drawn into (the profile's
    ``blocks``, ``n_layers`` and ``volume_knob`` as :func:`profile` takes them;
    ``n_drift_layers``: the most layers in a pair's drift table; ``drift_groups``: the tensor
    groups of the pairs' drift tables)."""
    return {
        "profile": profile(blocks, n_layers, volume_knob),
        "heat": heat_map(),
        "compression-chart": compression(),
        "blend-chart": blend(),
        "drift-layers": drift_layers(n_drift_layers, list(drift_groups)),
        "drift-other": drift_other(list(drift_groups)),
    }
