"""The explorer at the paper's scale: page size and load time for the paper study's shape
(21 runs of 12 layers × 12 heads, 3 tasks × 4 splits; leakage on 5 runs, clamps on 12, edges
on 15, 2 timelines: config/paper.yaml's run sets), from synthetic Parquets of the real schemas
(tests/helpers/explorer.py), beside the demo's shape (9 runs of 4 × 4).

    python benchmarks/explorer_scale.py [--examples 100]

Prints, per shape: the time to read the Parquets and write the page, the page's size (and
the part that is the inlined Vega libraries), and in headless Chromium (offline) the time
until the page is drawn and the time to switch to the run with the most views. Side by side
in the same browser: parsing every run's JSON block at load (what an eager page would do)
against parsing the one run shown (what the page does), and the size of one JSON object
per row against the columnar blocks the page embeds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headgeom.heads.explorer import page  # noqa: E402
from headgeom.heads.explorer.data import gather  # noqa: E402
from tests.helpers.explorer import Shape, write_study  # noqa: E402

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
PAPER_RUNS = tuple((f"model{i:02d}", 42) for i in range(21))


def shapes(examples: int) -> dict[str, Shape]:
    return {
        "demo (9 runs, 4×4)": Shape(
            runs=PAPER_RUNS[:9], n_layer=4, n_head=4, tasks=("sva", "quote", "plural"),
            splits=("discovery", "validation", "evaluation", "holdout"), examples=examples,
            leakage=2, clamps=3, edges=4, atlas=9, timeline=2,
        ),
        "paper (21 runs, 12×12)": Shape(
            runs=PAPER_RUNS, n_layer=12, n_head=12, tasks=("sva", "quote", "plural"),
            splits=("discovery", "validation", "evaluation", "holdout"), examples=examples,
            leakage=5, clamps=12, edges=15, atlas=0, timeline=2,
        ),
    }  # fmt: skip


def in_browser(path: Path, chromium: str) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
        tab = browser.new_context(offline=True).new_page()
        start = time.perf_counter()
        tab.goto(path.as_uri())
        tab.wait_for_selector("body[data-ready]", timeout=120_000)
        ready = time.perf_counter() - start
        parse = tab.evaluate(
            """() => {
            const blocks = [...document.querySelectorAll('script[id^="run-"]')];
            let t = performance.now();
            for (const b of blocks) JSON.parse(b.textContent);
            const all = performance.now() - t;
            t = performance.now();
            JSON.parse(blocks[META.default_run].textContent);
            return [all, performance.now() - t];
        }"""
        )
        last = 1  # another run with leakage, clamps and edges (the page opens on run 0)
        start = time.perf_counter()
        tab.select_option("#run", str(last))
        tab.wait_for_function(
            "([k]) => document.querySelector(\"#head-details td[data-key='run']\")"
            ".textContent === k",
            arg=[tab.evaluate(f"META.runs[{last}].key")],
        )
        switch = time.perf_counter() - start
        browser.close()
    return {
        "ready_s": ready,
        "switch_s": switch,
        "parse_all_ms": parse[0],
        "parse_one_ms": parse[1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="effects per split")
    args = parser.parse_args()
    chromium = next((c for c in map(shutil.which, ("chromium", "chromium-browser")) if c), None)
    header = ("shape", "gather", "write", "page MB", "vega MB", "rows MB", "ready", "switch",
              "parse all", "parse one")  # fmt: skip
    print(f"{header[0]:<24} " + " ".join(f"{h:>9}" for h in header[1:]))
    for name, shape in shapes(args.examples).items():
        with tempfile.TemporaryDirectory() as tmp:
            inputs, catalog = write_study(Path(tmp), shape=shape)
            t = time.perf_counter()
            data = gather(inputs, catalog)
            t_gather = time.perf_counter() - t
            out = Path(tmp) / "explorer.html"
            t = time.perf_counter()
            size = page.write(out, data, "explorer", "benchmark")
            t_write = time.perf_counter() - t
            html = out.read_text()
            vega = len(page.vl_convert.javascript_bundle().encode())
            # the peer encoding: one JSON object per row, every run
            records = sum(
                len(
                    json.dumps(
                        {k: v.to_dict("records") for k, v in r.tables.items()}, default=str
                    ).encode()
                )  # fmt: skip
                for r in data.runs
            )
            blocks = sum(len(b.encode()) for b in re.findall(r'id="run-\d+">(.*?)</script>', html))
            b = in_browser(out, chromium) if chromium else {}
            nan = float("nan")
            cells = (f"{t_gather:.1f} s", f"{t_write:.1f} s", f"{size / 1e6:.1f}",
                     f"{vega / 1e6:.2f}", f"{blocks / 1e6:.1f}", f"{b.get('ready_s', nan):.2f} s",
                     f"{b.get('switch_s', nan):.2f} s", f"{b.get('parse_all_ms', nan):.0f} ms",
                     f"{b.get('parse_one_ms', nan):.0f} ms")  # fmt: skip
            print(f"{name:<24} " + " ".join(f"{c:>9}" for c in cells))
            print(f"{'':<24} one object per row: {records / 1e6:.1f} MB = {records / blocks:.2f}× "
                  f"the columnar blocks; parsing every run at load = "
                  f"{b.get('parse_all_ms', 0) / max(b.get('parse_one_ms', 1), 1e-9):.1f}× "
                  "parsing the one shown")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
