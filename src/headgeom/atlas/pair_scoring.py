"""What the pair stages that score variants (``headgeom.atlas.stages.pair_blend``,
``pair_grafts``, ``pair_lowrank``) share: their command line (the pair's config, windows,
probes, threads) and the opening of a pair with its scorer
(:class:`headgeom.atlas.pair_views.PairScorer`), stopped with the stage's name on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from headgeom import results
from headgeom.atlas import artifacts
from headgeom.atlas import pair_views as views
from headgeom.runtime import pick_device, set_threads


def parser(doc: str, outputs: tuple[str, ...] = ("--out",)) -> argparse.ArgumentParser:
    """The command line of a scoring stage; ``outputs`` its output options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--config-json", required=True, help="AtlasStudy.pair_config(pair)")
    p.add_argument("--windows", required=True, help="the pair's atlas_windows Parquet")
    p.add_argument("--probes", required=True, help="the pair's atlas_probes Parquet")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    for option in outputs:
        p.add_argument(option, required=True)
    return p


@dataclass
class OpenPair:
    """A pair opened for scoring: its config, both ends' weights, the scorer and provenance."""

    cfg: dict[str, Any]
    a: dict
    b: dict
    sources: dict
    scorer: views.PairScorer
    skills: Any
    windows_meta: dict

    def metadata(self, table: str, threads: int, **extra) -> dict[str, Any]:
        """The Parquet metadata every scoring stage writes, plus ``extra``."""
        return {**results.file_metadata(table), "pair": self.cfg["name"],
                "sources": self.sources, "windows_corpora": self.windows_meta.get("corpora"),
                **extra, "threads": threads}  # fmt: skip


def open_pair(args: argparse.Namespace, stage: str) -> OpenPair:
    """Load the pair of ``args.config_json`` and its windows and probes; a bad pair or table
    stops the process with ``stage: <why>``."""
    cfg = json.loads(args.config_json)
    run = cfg["sweep"]
    set_threads(args.threads)
    try:
        model, a, b, sources = views.load_pair(cfg, pick_device(run["device"]))
        _, scored, windows_meta = artifacts.read_windows(args.windows)
        skills = artifacts.read_skills(args.probes)
        scorer = views.PairScorer(model, a, b, scored, skills, run["batch_size"], run["kl_chunk"],
                                  run["probe_rows"])  # fmt: skip
    except (views.PairError, ValueError) as err:
        sys.exit(f"{stage}: {err}")
    return OpenPair(cfg, a, b, sources, scorer, skills, windows_meta)
