"""The atlas page in a real browser: Playwright drives the system's headless Chromium (never a
downloaded browser) on the page, opened from disk with the network cut off. Clicking a
profile column must show that layer's edits, the edit switch must redraw the heat map with
that edit's KL, the α slider must show the blend and the probe answers at that α, views of
absent tables must be hidden, and the page must log no JavaScript error. Skips, saying why,
without Playwright or Chromium."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from headgeom.atlas.page import page
from tests.helpers import atlas_tables as synthetic
from tests.helpers.webpage import CHROMIUM, FLAGS

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: chromium)")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The full page (with a pair) and a page without the optional tables."""
    root = tmp_path_factory.mktemp("atlas-browser")
    full, bare = root / "full", root / "bare"
    written = synthetic.write_atlas(full)
    page.write_page(
        synthetic.model_paths(full), root / "full.html", synthetic.MODEL, synthetic.pairs(full)
    )
    synthetic.write_atlas(bare, ple=False, pair=False, skip=("compression",))
    page.write_page(synthetic.model_paths(bare), root / "bare.html", synthetic.MODEL)
    return {"full": root / "full.html", "bare": root / "bare.html"}, written


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def _open(browser, path):
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    problems = []
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:"))
           else problems.append(f"request to {r.url}"))  # fmt: skip
    tab.goto(path.as_uri())
    tab.wait_for_selector("body[data-ready]", state="attached")
    assert tab.get_attribute("body", "data-ready") == "true", problems
    return context, tab, problems


@pytest.fixture
def opened(browser, pages):
    paths, written = pages
    context, tab, problems = _open(browser, paths["full"])
    yield tab, written, problems
    context.close()


def value_of(tab, selector: str) -> str:
    cell = tab.locator(selector)
    assert cell.count() == 1, selector
    return cell.get_attribute("data-value")


def wait_text(tab, selector: str, text: str) -> None:
    """Wait until the element ``selector`` shows ``text`` (the page redraws asynchronously)."""
    tab.wait_for_function(
        "([s, t]) => document.querySelector(s).textContent === t", arg=[selector, text]
    )


def one_layer(frame):
    """An edit's rows of one layer or of the embedding's table, not every layer at once."""
    return frame[~frame.apply(lambda r: synthetic.everywhere(r.layer, r.target), axis=1)]


def test_clicking_a_profile_column_selects_that_layer(opened):
    tab, written, problems = opened
    effects, summary = written[("effects", None)], written[("summary", None)]
    layer = 1
    assert tab.text_content("#selected-layer") != str(layer)  # opens on another layer
    # the column behind the bars, beside the old state's bar (4th panel; it is narrower)
    column = tab.locator('#profile path[aria-roledescription="rect mark"][aria-label="layer: 1"]')
    assert column.count() == 5  # one per panel
    column.nth(3).click(position={"x": 2, "y": 4})
    wait_text(tab, "#selected-layer", str(layer))
    wait_text(tab, "#layer-title", str(layer))
    rows = effects[effects.layer == layer]
    # Zero and Average of attn, mlp, ple; rows→mean of ple; skip: 8 edits × 3 corpora
    assert len(rows) == (3 + 3 + 1 + 1) * 3
    # and each edit's mean over the corpora: its summary row
    means = summary[summary.layer == layer].assign(corpus="mean")
    for r in [*rows.itertuples(), *means.itertuples()]:
        cell = (
            f"#layer-edits td[data-target='{r.target}'][data-kind='{r.kind}']"
            f"[data-corpus='{r.corpus}']"
        )
        assert float(value_of(tab, f"{cell}[data-quantity='kl']")) == r.kl
        assert float(value_of(tab, f"{cell}[data-quantity='delta_top1']")) == r.delta_top1
    retention = written[("retention", None)]
    kept = retention[(retention.layer == layer) & (retention.target == "mlp")
                     & (retention.kind == "average") & (retention.skill == "quote")]  # fmt: skip
    cell = "#layer-edits td[data-target='mlp'][data-kind='average']"
    got = value_of(tab, f"{cell}[data-skill='quote'][data-quantity='retention']")
    assert float(got) == kept["retention"].iloc[0]
    mean = summary[(summary.edit == f"average L{layer}.mlp")]["mean_retention"].iloc[0]
    got = value_of(tab, f"{cell}[data-skill='mean'][data-quantity='retention']")
    assert float(got) == mean
    profile = written[("profile", None)]
    ple = profile[(profile.layer == layer) & (profile.block == "ple")].iloc[0]
    got = value_of(tab, "#layer-profile td[data-block='ple'][data-quantity='write_size']")
    assert float(got) == ple["write_size"]
    got = value_of(tab, "#layer-profile td[data-block='ple'][data-quantity='knob_rms']")
    assert float(got) == ple["knob_rms"]
    # clicking a bar (not the column behind it) selects its layer too
    bar = tab.locator('#profile path[aria-roledescription="bar"][aria-label^="layer: 2;"]')
    bar.first.click()
    wait_text(tab, "#selected-layer", "2")
    assert problems == []


HEAT_CELL = re.compile(r"corpus: (?P<corpus>[^;]+); layer: (?P<layer>-?\d+);.*block: "
                       r"(?P<block>\w+); KL: (?P<kl>[0-9.]+);")  # fmt: skip


def heat_cells(tab) -> dict[tuple[str, int, str], str]:
    """(block, layer, corpus) -> KL as the heat map's cell shows it (four decimals)."""
    cells = tab.locator('#heat path[aria-roledescription="rect mark"]')
    out = {}
    for label in cells.evaluate_all("els => els.map(e => e.getAttribute('aria-label'))"):
        m = HEAT_CELL.search(label)
        assert m, label
        out[(m["block"], int(m["layer"]), m["corpus"])] = m["kl"]
    return out


def expected_cells(written, kind: str) -> dict[tuple[str, int, str], str]:
    """The heat map's cells of edits ``kind``: each corpus's KL (effects) and the mean over
    the corpora (summary), of one layer or the embedding's table."""
    effects = one_layer(written[("effects", None)])
    summary = one_layer(written[("summary", None)]).assign(corpus="mean")
    rows = pd.concat([effects, summary])
    rows = rows[rows.kind == kind]
    # the helper's KLs have four decimals, so the cell's ".4f" is the number itself
    return {(r.target, r.layer, r.corpus): f"{r.kl:.4f}" for r in rows.itertuples()}


def test_the_edit_switch_redraws_the_heat_map(opened):
    tab, written, problems = opened
    zero = expected_cells(written, "zero")
    assert heat_cells(tab) == zero  # opens on Zero: every (block, layer, corpus) with a "mean"
    assert {c for _, _, c in zero} == {*synthetic.CORPORA, "mean"}
    tab.get_by_label("Average").check()
    average = expected_cells(written, "average")
    tab.wait_for_function(
        "n => document.querySelectorAll('#heat path[aria-roledescription=\"rect mark\"]').length"
        " === n",
        arg=len(average),
    )
    tab.wait_for_function(
        "kl => [...document.querySelectorAll('#heat path[aria-roledescription=\"rect mark\"]')]"
        ".some(e => e.getAttribute('aria-label').includes('KL: ' + kl + ';'))",
        arg=next(iter(set(average.values()) - set(zero.values()))),
    )
    assert heat_cells(tab) == average
    assert average != zero
    # rows→mean: the PLE slices and the token embedding's table (layer -1)
    tab.get_by_label("rows→mean").check()
    rows_mean = expected_cells(written, "rows_mean")
    assert {(b, la) for b, la, _ in rows_mean} >= {("embed", -1), ("ple", 0)}
    tab.wait_for_function(
        "n => document.querySelectorAll('#heat path[aria-roledescription=\"rect mark\"]').length"
        " === n",
        arg=len(rows_mean),
    )
    assert heat_cells(tab) == rows_mean
    # the selected layer's table marks the rows of the edit shown
    current = tab.locator("#layer-edits tr.current")
    assert {current.nth(i).get_attribute("data-kind") for i in range(current.count())} == {
        "rows_mean"
    }
    # a cell of the heat map selects its layer too
    tab.locator(
        '#heat path[aria-roledescription="rect mark"][aria-label*="layer: 2;"]'
    ).first.click()
    wait_text(tab, "#selected-layer", "2")
    assert problems == []


def set_alpha(tab, alpha: float) -> None:
    index = synthetic.ALPHAS.index(alpha)
    tab.eval_on_selector(
        "#alpha",
        "(el, i) => { el.value = String(i); el.dispatchEvent(new Event('input')); }",
        index,
    )
    wait_text(tab, "#alpha-label", f"α = {alpha:g}")


def test_the_alpha_slider_shows_the_blend_and_the_probe_answers_there(opened):
    tab, written, problems = opened
    blend = written[("blend", synthetic.PAIR)]
    probes = written[("probes", synthetic.PAIR)]
    wait_text(tab, "#alpha-label", "α = 0")  # the dial opens on A
    for alpha in (0.25, 0.4, 0.75, 1.5):
        set_alpha(tab, alpha)
        want = blend[(blend.alpha == alpha) & (blend.corpus == "mean")].iloc[0]
        for q in ("kl_to_a", "kl_to_b", "retention"):
            assert float(value_of(tab, f"#blend-details td[data-key='{q}']")) == want[q]
        for probe, (expected, at, before) in synthetic.SWITCH_AT.items():
            row = f"#probes tr[data-probe='{probe}']"
            answer = value_of(tab, f"{row} td[data-quantity='answer']")
            assert answer == (expected if alpha >= at else before)
            correct = value_of(tab, f"{row} td[data-quantity='correct']")
            assert correct == str(alpha >= at).lower()
            lead = probes[(probes.probe == probe) & (probes.alpha == alpha)]["lead"].iloc[0]
            assert float(value_of(tab, f"{row} td[data-quantity='lead']")) == lead
            # highlighted where the answer changed from the α before: exactly at the switch
            switched = tab.get_attribute(row, "class") == "switched"
            assert switched == (alpha == at), (probe, alpha)
            assert tab.text_content(f"{row} td[data-quantity='switches']") == f"{at:g}"
    # the other corpus' blend
    tab.select_option("#pair-corpus", "code")
    wait_text(tab, "#blend-details td[data-key='corpus']", "code")
    want = blend[(blend.alpha == 1.5) & (blend.corpus == "code")].iloc[0]
    assert float(value_of(tab, "#blend-details td[data-key='kl_to_a']")) == want["kl_to_a"]
    assert problems == []


def test_the_compression_table_is_sorted_by_size(opened):
    tab, written, problems = opened
    comp = written[("compression", None)]
    mean = comp[comp.corpus == "mean"]
    sizes = tab.locator("#compression-table td[data-quantity='bytes']")
    shown = [int(v) for v in sizes.evaluate_all("els => els.map(e => e.dataset.value)")]
    assert shown == sorted(mean["bytes"].tolist())
    kls = tab.locator("#compression-table td[data-quantity='kl']")
    shown_kl = [float(v) for v in kls.evaluate_all("els => els.map(e => e.dataset.value)")]
    want = mean.sort_values(["bytes", "method", "group", "setting"])["kl"].tolist()
    assert shown_kl == want
    # one point per variant in the scatter
    assert tab.locator('#compression-chart path[aria-roledescription="point"]').count() == len(mean)
    assert problems == []


def test_the_drift_and_grafts_show_every_row(opened):
    tab, written, problems = opened
    drift = written[("drift", synthetic.PAIR)]
    assert (
        tab.locator('#drift-layers path[aria-roledescription="bar"]').count()
        == (drift.layer >= 0).sum()
    )
    assert (
        tab.locator('#drift-other path[aria-roledescription="bar"]').count()
        == (drift.layer < 0).sum()
    )
    grafts = written[("grafts", synthetic.PAIR)]
    assert tab.locator("#grafts tbody tr").count() == (grafts.corpus == "mean").sum()
    assert problems == []


def test_views_of_absent_tables_are_hidden(browser, pages):
    paths, _ = pages
    context, tab, problems = _open(browser, paths["bare"])
    try:
        assert tab.locator("#pairs-section").is_hidden()
        assert tab.locator("#compression-section").is_hidden()
        assert tab.locator("#profile-section").is_visible()
        assert tab.locator("#heat-section").is_visible()
        # no PLE: the switch still offers rows→mean, on the token embedding
        labels = tab.locator("#edit-switch label").all_inner_texts()
        assert [s.strip() for s in labels] == ["Zero", "Average", "rows→mean", "layer skip"]
        assert problems == []
    finally:
        context.close()


def test_every_view_names_its_parquet_and_sha256(opened):
    tab, _, problems = opened
    cited = tab.locator(".sources code.source")
    assert cited.count() == len(synthetic.MODEL_TABLES) + len(synthetic.PAIR_TABLES)
    for i in range(cited.count()):
        sha = cited.nth(i).get_attribute("data-sha256")
        assert len(sha) == 64 and sha in cited.nth(i).inner_text()
    assert problems == []
