"""The results catalog: one row per artifact of a study's results folder (path,
the rule that writes it, its wildcards, SHA-256, and the checkpoint manifest of the run it
came from), so a user finds and verifies any result without reading the workflow.

An artifact is a file under ``results/<study>/`` that matches an output template of a rule
(logs and benchmarks are records of jobs, not artifacts); a file inside a directory output
(intermediate checkpoints) belongs to that directory's template.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from headgeom.hashing import load_manifest, sha256_file
from headgeom.io import verify_parquet

#: The manifest of a run, relative to the results folder (workflow PATHS["manifest"]).
MANIFEST = "models/{model}/s{seed}/manifest.json"
#: Folders of job records, not artifacts.
SKIPPED = ("logs", "benchmarks")


def template_regex(
    template: str, constraints: Mapping[str, str] | None = None, prefix: bool = False
) -> re.Pattern:
    """A regex for a path template: ``{name}`` matches one path component without dots
    (or ``constraints[name]``); with ``prefix``, the template may be a parent folder."""
    constraints = constraints or {}
    out, pos = [], 0
    for m in re.finditer(r"\{(\w+)\}", template):
        out.append(re.escape(template[pos : m.start()]))
        name = m.group(1)
        out.append(f"(?P<{name}>{constraints.get(name, r'[^/.]+')})")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + ("(/.+)?$" if prefix else "$"))


def catalog(
    results: str | os.PathLike,
    templates: Mapping[str, str],
    models: Sequence[str],
    skip: Sequence[str] = (),
) -> pd.DataFrame:
    """Every artifact under ``results`` (a study's results folder) as one row: ``templates``
    maps each output template (paths starting with ``results``) to its rule; files that
    match no template are left out (a stale file of another config), as are ``skip``."""
    results = Path(results)
    constraints = {
        "model": "|".join(re.escape(m) for m in sorted(models, key=len, reverse=True)),
        "seed": r"\d+",
    }
    # longest literal text first: the most specific template wins (a.heads.parquet vs a.parquet)
    ordered = sorted(templates.items(), key=lambda kv: -len(re.sub(r"\{\w+\}", "", kv[0])))
    compiled = [
        (template, rule, template_regex(template, constraints, prefix=True))
        for template, rule in ordered
    ]
    skipped = {str(Path(s)) for s in skip}
    rows = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results)
        if rel.parts[0] in SKIPPED or path.name.startswith(".") or str(path) in skipped:
            continue
        text = path.as_posix()
        found = next(((t, r, m) for t, r, x in compiled if (m := x.match(text))), None)
        if found is None:
            continue
        template, rule, m = found
        if path.suffix == ".parquet":
            verify_parquet(path)  # the catalog's SHA-256 vouches for a file as its rule wrote it
        wildcards = {k: v for k, v in m.groupdict().items()}
        manifest = None
        if "model" in wildcards and "seed" in wildcards:
            manifest = results / MANIFEST.format(**wildcards)
            if manifest.is_file():
                load_manifest(manifest)  # refuses a manifest changed after it was sealed
        rows.append(
            {
                "path": text,
                "rule": rule,
                "template": template,
                "wildcards": json.dumps(wildcards, sort_keys=True, separators=(",", ":")),
                "model": wildcards.get("model"),
                "seed": int(wildcards["seed"]) if "seed" in wildcards else None,
                "task": wildcards.get("task"),
                "size_bytes": path.stat().st_size,
                "sha256": sha256_file(path),
                "manifest": manifest.as_posix() if manifest is not None else None,
                "manifest_sha256": sha256_file(manifest)
                if manifest is not None and manifest.is_file()
                else None,
            }
        )
    frame = pd.DataFrame(rows)
    frame["seed"] = frame["seed"].astype("Int64")
    return frame
