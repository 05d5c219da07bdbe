"""The report's captions, written from the records' (:mod:`headgeom.paper.outputs`): each
caption exists once, in its output's record, and ``snakemake --report`` shows it.

    python -m headgeom.paper.captions            # rewrite workflow/report's caption files
    python -m headgeom.paper.captions --check    # exit 1, naming them, when any is stale

Snakemake takes a caption as a file: ``tables.rst`` and ``figures.rst`` (one template each
for the make_table and make_figure jobs, choosing by wildcard) and ``document/<table>.rst``
(one per table of the make_document job, whose outputs have no wildcard).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from headgeom.io import write_text
from headgeom.paper.outputs import DOCUMENT_TABLES, FIGURES, TABLE_JOBS, TABLES

REPORT = Path(__file__).resolve().parents[3] / "workflow" / "report"
HEADER = "{# Written by python -m headgeom.paper.captions from headgeom/paper/outputs.py #}\n"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, default=REPORT, help="workflow/report folder")
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    wanted = caption_files()
    on_disk = {p: (args.report / p).read_text() for p in wanted if (args.report / p).is_file()}
    stale = [p for p, text in wanted.items() if on_disk.get(p) != text]
    written = {p.relative_to(args.report).as_posix() for p in args.report.glob("document/*.rst")}
    extra = sorted(written - set(wanted))
    if args.check:
        if stale or extra:
            print(f"{args.report}: stale caption files {stale}, files of no output {extra}; "
                  "run python -m headgeom.paper.captions", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    for path in stale:
        write_text(args.report / path, wanted[path])
    for path in extra:
        (args.report / path).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
