"""The files written from the paper's records (:mod:`headgeom.heads.paper.outputs`): the report's
caption files and docs/map.md's table of outputs. Each caption, builder and input exists
once, in its output's record; these files show them where Snakemake and readers look.

    python -m headgeom.heads.paper.record_files            # rewrite them
    python -m headgeom.heads.paper.record_files --check    # exit 1, naming them, when any is stale

Snakemake takes a caption as a file: ``tables.rst`` and ``figures.rst`` (one template each
for the make_table and make_figure jobs, choosing by wildcard) and ``document/<table>.rst``
(one per table of the make_document job, whose outputs have no wildcard). In docs/map.md
the table is the block between ``<!-- outputs -->`` and ``<!-- /outputs -->``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from headgeom.heads.paper.outputs import DOCUMENT_TABLES, FIGURES, RECORDS, TABLE_JOBS, TABLES
from headgeom.io import write_text
from headgeom.paths import TEMPLATES

ROOT = Path(__file__).resolve().parents[4]
HEADER = (
    "{# Written by python -m headgeom.heads.paper.record_files from "
    "headgeom/heads/paper/outputs.py #}\n"
)
MAP = re.compile(r"(<!-- outputs -->\n).*?(<!-- /outputs -->)", re.S)
TABLE_FOOTER = (
    "Generated only from result Parquets (Markdown, LaTeX and CSV from the same cells); the\n"
    "sidecar ``.sources.json`` lists the SHA-256 of every Parquet it consumed.\n"
)
FIGURE_FOOTER = (
    "Drawn only from result Parquets; the ``.csv`` holds the plotted data and the sidecar\n"
    "``.sources.json`` the SHA-256 of every Parquet it consumed.\n"
)


def _template(kind: str, captions: dict[str, str], footer: str) -> str:
    """A Jinja template choosing the caption by the job's ``kind`` wildcard."""
    about = json.dumps(captions, ensure_ascii=False, indent=4)
    wildcard = f"snakemake.wildcards.{kind}"
    return (
        f"{HEADER}{{% set about = {about} %}}\n"
        f'{{{{ about.get({wildcard}, "Paper {kind} " ~ {wildcard} ~ ".") }}}}\n{footer}'
    )


def caption_files() -> dict[str, str]:
    """Path under workflow/report -> its text, for every caption file the workflow names."""
    files = {
        "tables.rst": _template("table", {n: TABLES[n].caption for n in TABLE_JOBS}, TABLE_FOOTER),
        "figures.rst": _template("figure", {n: o.caption for n, o in FIGURES.items()},
                                 FIGURE_FOOTER),
    }  # fmt: skip
    for name in DOCUMENT_TABLES:
        files[f"document/{name}.rst"] = f"{HEADER}{TABLES[name].caption}\n{TABLE_FOOTER}"
    return files


def _reads(record, paths: dict[str, str]) -> str:
    return "; ".join(
        f"{kind} → `{paths.get(result, result)}`"
        + (f" ({runs})" if runs not in (None, "runs") else "")
        for kind, (result, runs) in record.inputs.items()
    )


def output_map(paths: dict[str, str]) -> str:
    """docs/map.md's table: every output, its section, job, functions and inputs."""
    lines = [
        "| Output | Section | Job | Built by | Reads: kind → Parquet (runs, if not every run) |",
        "|---|---|---|---|---|",
    ]
    for r in RECORDS:
        job = "make_figure" if r.kind == "figure" else ("make_document" if r.document
                                                        else "make_table")  # fmt: skip
        built = f"`paper.{r.build.replace(':', '.')}`"
        if r.draw:
            built += f", `paper.{r.draw.replace(':', '.')}`"
        lines.append(
            f"| {r.name} ({r.kind}) | {r.section} | `{job}` | {built} | {_reads(r, paths)} |"
        )
    return "\n".join(lines) + "\n"


def written_files(root: Path = ROOT) -> dict[Path, str]:
    """Every file written from the records -> its text."""
    report = root / "workflow" / "report"
    files = {report / path: text for path, text in caption_files().items()}
    doc = root / "docs" / "map.md"
    text = doc.read_text()
    if not MAP.search(text):
        raise ValueError(f"{doc}: no <!-- outputs --> ... <!-- /outputs --> block")
    table = output_map(TEMPLATES)
    files[doc] = MAP.sub(lambda m: m[1] + table + m[2], text)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository")
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    wanted = written_files(args.root)
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    documents = args.root / "workflow" / "report" / "document"
    extra = sorted(set(documents.glob("*.rst")) - set(wanted))
    if args.check:
        if stale or extra:
            names = [str(p.relative_to(args.root)) for p in stale]
            print(f"stale: {names}; files of no output: {[str(p) for p in extra]}; "
                  "run python -m headgeom.heads.paper.record_files", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    for path in stale:
        write_text(path, wanted[path])
    for path in extra:
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
