"""The explorer in a real browser (docs §19): Playwright drives the system's headless
Chromium (never a downloaded browser) on the page, opened from disk with the network cut
off. Clicking a head cell must show that head's values from the Parquets, the Zero/Average
switch must show the mean-ablation KL of the selected block, and the page must log no
JavaScript error. Skips, saying why, without Playwright or Chromium."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from headgeom.heads.explorer import page
from headgeom.heads.explorer.data import gather
from headgeom.io import read_table
from tests.helpers import explorer as synthetic
from tests.helpers.webpage import CHROMIUM, FLAGS

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: chromium)")


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    root = tmp_path_factory.mktemp("explorer-browser")
    inputs, catalog = synthetic.write_study(root)
    out = root / "explorer.html"
    page.write(out, gather(inputs, catalog), "headgeom explorer: test", "synthetic")
    frames = {k: pd.concat([read_table(p).to_pandas() for p in v]) for k, v in inputs.items()}
    return out, frames


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def opened(browser, explorer):
    path, frames = explorer
    context = browser.new_context(offline=True)
    tab = context.new_page()
    problems = []
    tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: problems.append(str(e)))
    tab.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:"))
           else problems.append(f"request to {r.url}"))  # fmt: skip
    tab.goto(path.as_uri())
    tab.wait_for_selector("body[data-ready]")
    assert tab.get_attribute("body", "data-ready") == "true"
    yield tab, frames, problems
    context.close()


def shown(tab, table: str, key: str) -> float | None:
    text = tab.get_attribute(f"#{table} td[data-key='{key}']", "data-value")
    return None if text == "" else float(text) if key not in ("own_best",) else text == "true"


def wait_text(tab, selector: str, text: str) -> None:
    """Wait until the element ``selector`` shows ``text`` (the page redraws asynchronously)."""
    tab.wait_for_function(
        "([s, t]) => document.querySelector(s).textContent === t", arg=[selector, text]
    )


def close(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


def test_clicking_a_head_cell_shows_that_heads_values(opened):
    tab, frames, problems = opened
    # the page opens on the run with the most views: learned s42, SVA, evaluation split
    assert tab.input_value("#run") == "0" and tab.input_value("#split") == "evaluation"
    layer, head = 1, 2
    cell = tab.locator(
        f'#grid path[aria-roledescription="rect mark"][aria-label*="layer: {layer};"]'
        f'[aria-label*="head: {head};"]'
    )
    assert cell.count() == 1
    cell.click()
    wait_text(tab, "#selected-head", f"L{layer}.H{head}")
    heads = frames["heads"]
    want = heads[(heads.model == "learned") & (heads.task == "sva") & (heads.split == "evaluation")
                 & (heads.layer == layer) & (heads["head"] == head)].iloc[0]  # fmt: skip
    assert close(float(want["e"]), shown(tab, "head-details", "e"))
    assert close(float(want["p"]), shown(tab, "head-details", "p"))
    geo = frames["geometry"]
    g = geo[(geo.model == "learned") & (geo.layer == layer) & (geo["head"] == head)].iloc[0]
    assert close(float(g["rho_self"]), shown(tab, "head-details", "rho_self"))
    assert close(float(g["idempotence"]), shown(tab, "head-details", "idempotence"))
    # its leakage view: one point per later (reader, read type) of this source head
    leak = frames["leakage"]
    rows = leak[(leak.model == "learned") & (leak.task == "sva") & (leak.source_layer == layer)
                & (leak.source_head == head)]  # fmt: skip
    assert len(rows) == (synthetic.N_LAYER - 1 - layer) * synthetic.N_HEAD * 3
    drawn = rows["leakage"].notna() & rows["rho"].notna()  # a null L or ρ has no position
    assert tab.locator('#leakage path[aria-roledescription="point"]').count() == drawn.sum()
    assert problems == []


def test_the_zero_average_switch_shows_the_mean_ablation_kl(opened):
    tab, frames, problems = opened
    atlas = frames["atlas"]
    label = "L2.mlp"
    circle = tab.locator(
        f'#atlas path[aria-roledescription="circle"][aria-label*="block: {label};"]'
    )
    assert circle.count() == 1
    circle.click()
    wait_text(tab, "#block-details td[data-key='label']", label)
    zero = atlas[(atlas.label == label) & (atlas.ablation == "zero")].iloc[0]
    mean = atlas[(atlas.label == label) & (atlas.ablation == "mean")].iloc[0]
    assert close(float(zero["kl"]), shown(tab, "block-details", "kl"))
    tab.get_by_label("Average").check()
    wait_text(tab, "#block-details td[data-key='ablation']", "mean")
    assert close(float(mean["kl"]), shown(tab, "block-details", "kl"))
    assert zero["kl"] != mean["kl"]
    assert problems == []


def test_every_view_names_its_parquet_and_sha256(opened):
    tab, frames, problems = opened
    cited = tab.locator(".sources code.source")
    assert cited.count() > 0
    for i in range(cited.count()):
        sha = cited.nth(i).get_attribute("data-sha256")
        assert len(sha) == 64 and sha in cited.nth(i).inner_text()
    assert problems == []
