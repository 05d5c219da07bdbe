"""Every SA-MoE paper table and figure of this study (SAMOE §18) and the comparison with the
paper's reference numbers (§22), from the study's Parquets.

    python -m headgeom.samoe.stages.paper --config-json '{...}' --counts counts.parquet \\
        --seed-means seed_means.parquet --contrasts contrasts.parquet --history h1 h2 ... \\
        --tables-dir samoe/tables --figures-dir samoe/figures --comparison comparison.parquet

Each table is written as <name>.md, .csv (the tidy unrounded frame) and .tex; each figure as
<name>.png and the .csv it is drawn from; the comparison also as comparison.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import yaml

from headgeom.hashing import content_hash
from headgeom.io import read_json, read_parquet_metadata, read_table, write_text
from headgeom.plotting import save_figure
from headgeom.samoe import paper, results

CHECKS = ("K6", "K7", "K8")


def run_checks(paths: list[Path], checks: tuple[str, ...] = CHECKS) -> pd.DataFrame:
    """Residuals and tolerances of ``checks`` from each Parquet's metadata (K6–K8 in the
    history files; K14's two parts, router input and logits, in the Li files)."""
    rows = []
    for path in paths:
        meta = read_parquet_metadata(path)
        run = json.loads(meta["run"])
        for key in sorted(meta):
            check = key.removeprefix("check_").removesuffix("_max_abs_residual")
            if not key.endswith("_max_abs_residual") or check.split(".")[0] not in checks:
                continue  # K8 is in Persistent files only
            rows.append(
                {
                    **run,
                    "check": check,
                    "residual": float(json.loads(meta[key])),
                    "tolerance": float(json.loads(meta[f"check_{check}_tolerance"])),
                }
            )
    return pd.DataFrame(rows, columns=["family", "variant", "seed", "check", "residual",
                                       "tolerance"])  # fmt: skip


def pool_records(history_pool: list[Path], quality: list[Path]) -> pd.DataFrame:
    """Per run, from the files' metadata: the clamped and write coordinates of the final pool
    (history_pool.parquet) and the run's perplexity beside its dense source's
    (quality.parquet; imported families only)."""
    runs: dict[tuple, dict] = {}
    for path in history_pool:
        meta = read_parquet_metadata(path)
        run = json.loads(meta["run"])
        runs.setdefault(tuple(run.values()), dict(run)).update(
            clamped_final=json.loads(meta["clamped_coordinates_final_pool"]),
            coordinates_final=json.loads(meta["write_coordinates_final_pool"]))  # fmt: skip
    for path in quality:
        meta = read_parquet_metadata(path)
        if "ppl_dense" not in meta:
            continue
        run = json.loads(meta["run"])
        ppl = read_table(path, results.QUALITY.names).to_pandas()
        value = float(ppl[(ppl.metric == "ppl") & (ppl.subset == "all")].value.iloc[0])
        dense = float(json.loads(meta["ppl_dense"])["all"])
        runs.setdefault(tuple(run.values()), dict(run)).update(
            ppl=value, ppl_dense=dense, ppl_rel_dense=value / dense - 1)  # fmt: skip
    return pd.DataFrame(list(runs.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-json", required=True)
    for name in ("counts", "seed-means", "contrasts", "tables-dir", "figures-dir", "comparison"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    parser.add_argument("--history", nargs="*", type=Path, default=[])
    parser.add_argument("--history-pool", nargs="*", type=Path, default=[])
    parser.add_argument("--quality", nargs="*", type=Path, default=[])
    parser.add_argument("--seeds", type=Path, help="samoe/seeds.json (the step-0 checks)")
    parser.add_argument("--probes", nargs="*", type=Path, default=[])
    parser.add_argument("--rankings", nargs="*", type=Path, default=[])
    parser.add_argument("--li", nargs="*", type=Path, default=[], help="Ordinary runs' li.parquet")
    parser.add_argument("--audit-cost", nargs="*", type=Path, default=[])
    parser.add_argument("--runtime", nargs="*", type=Path, default=[])
    args = parser.parse_args(argv)
    cfg = json.loads(args.config_json)
    x = paper.Inputs(
        config=cfg,
        counts=read_table(args.counts, results.COUNTS.names).to_pandas(),
        seed_means=read_table(args.seed_means, results.SEED_MEANS.names).to_pandas(),
        contrasts=read_table(args.contrasts, results.CONTRASTS.names).to_pandas(),
        history=results.read_runs(args.history, results.HISTORY),
        audit_cost=results.read_runs(args.audit_cost, results.AUDIT_COST),
        runtime=results.read_runs(args.runtime, results.RUNTIME),
        checks=pd.concat([run_checks(args.history), run_checks(args.li, ("K14",))],
                         ignore_index=True),
        probes=results.read_runs(args.probes, results.PROBES),
        rankings=results.read_runs(args.rankings, results.RANKINGS),
        history_pool=results.read_runs(args.history_pool, results.HISTORY_POOL),
        pool_records=pool_records(args.history_pool, args.quality),
        seed_checks=(pd.DataFrame(read_json(args.seeds)["checks"]) if args.seeds else None),
    )  # fmt: skip
    for name, build in paper.TABLES.items():
        table = build(x)
        write_text(args.tables_dir / f"{name}.md", table.markdown())
        write_text(args.tables_dir / f"{name}.csv", table.frame.to_csv(index=False))
        write_text(args.tables_dir / f"{name}.tex", table.latex())
    for name, draw in paper.FIGURES.items():
        fig, frame = draw(x)
        save_figure(fig, args.figures_dir / f"{name}.png", "png")
        plt.close(fig)
        write_text(args.figures_dir / f"{name}.csv", frame.to_csv(index=False))
    references = yaml.safe_load(resources.files("headgeom.samoe").joinpath(
        "references.yaml").read_text())  # fmt: skip
    comparison = paper.comparison(x, references)
    results.COMPARISON.write(args.comparison, comparison, {"config_hash": content_hash(cfg)})
    write_text(
        args.comparison.with_suffix(".md"),
        "SA-MoE: the paper's reference numbers (SAMOE §22) beside this study's; only the "
        "direction is compared.\n\n" + comparison.to_markdown(index=False) + "\n",
    )
    agree = comparison["agrees"].dropna()
    print(
        f"samoe paper: {len(paper.TABLES)} tables, {len(paper.FIGURES)} figures; direction "
        f"agrees on {int(agree.sum())} of {len(agree)} compared rows",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
