"""`snakemake --report` on the micro study, opened in headless Chromium: every
figure of the report decodes in a real browser, the categories are the paper's sections,
and a screenshot of the report (and one of its figures) is saved for a person to look at
(HEADGEOM_SCREENSHOTS=<folder> keeps them; default: the test's temporary folder)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import copy_of, snakemake

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs headless Chromium (Debian package `chromium`)"
)

#: Runs in the report page after its own scripts: decodes every image result of the report
#: (the `results` object Snakemake embeds) and writes what loaded into <pre id=...>.
CHECK = """
<script>
window.addEventListener("load", async () => {
  const out = {};
  for (const [path, entry] of Object.entries(results)) {
    if (!entry.mime_type.startsWith("image/")) continue;
    out[path] = await new Promise((resolve) => {
      const img = new Image();
      img.onload = () => resolve([img.naturalWidth, img.naturalHeight]);
      img.onerror = () => resolve(null);
      img.src = entry.data_uri;
      document.getElementById("headgeom-figures").appendChild(img);
    });
  }
  const pre = document.createElement("pre");
  pre.id = "headgeom-check";
  pre.textContent = JSON.stringify({images: out, categories: Object.keys(categories)});
  document.body.appendChild(pre);
});
</script>
<div id="headgeom-figures" style="position:absolute;top:0;left:0;width:100%;z-index:99;
  background:white;display:none"></div>
"""


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=20000", *args]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory, finished_micro):
    work = copy_of(finished_micro, tmp_path_factory.mktemp("report") / "w")
    snakemake(work, "--report", "report.html")
    return work


def test_every_figure_loads_in_chromium_and_a_screenshot_is_saved(report):
    html = (report / "report.html").read_text()
    checked = report / "check.html"
    checked.write_text(html.replace("</body>", CHECK + "</body>"))
    dom = chromium("--dump-dom", checked.as_uri(), cwd=report).stdout
    found = re.search(r'<pre id="headgeom-check">(.*?)</pre>', dom, re.S)
    assert found, "the check script did not run in the browser"
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    images = result["images"]
    figures = sorted(Path(p).name for p in images)
    expected = sorted(p.name for p in (report / "results" / "micro" / "figures").glob("*.png"))
    assert figures == expected and len(figures) >= 7
    broken = [p for p, size in images.items() if not size or min(size) < 100]
    assert not broken, f"figures that did not load in Chromium: {broken}"
    # categories are the paper's sections
    assert {"§4 Setup", "§5.2 Concentration", "§5.3 Lanes", "Summary"} <= set(result["categories"])
    keep = Path(os.environ.get("HEADGEOM_SCREENSHOTS", report))
    keep.mkdir(parents=True, exist_ok=True)
    chromium(f"--screenshot={keep / 'report.png'}", "--window-size=1400,1000",
             (report / "report.html").as_uri(), cwd=report)  # fmt: skip
    figure = report / "figure.html"
    figure.write_text(html.replace("</body>", CHECK.replace("display:none", "") + "</body>"))
    chromium(f"--screenshot={keep / 'report-figures.png'}", "--window-size=1400,3000",
             figure.as_uri(), cwd=report)  # fmt: skip
    for name in ("report.png", "report-figures.png"):
        assert (keep / name).stat().st_size > 10_000, name  # a rendered page, not blank
