"""Nothing read unverified: on the finished micro study, every rule refuses one changed byte
in every kind of input it reads.

The matrix of (rule, input kind) pairs is not written down here: it is read from the DAG
itself (``snakemake --detailed-summary``: each job's inputs), each input classified by the
path table (``headgeom.paths``), so a new rule or input is covered without editing this file.
Each pair is tried on one job: a copy of the finished study gets one flipped byte in one of
that job's inputs (its mtime kept, so Snakemake rebuilds nothing upstream), the job is forced
(``--force`` on its output), and its log must name the file, the check that failed with its
two values, and the rule that writes the file. Jobs are grouped into rounds in which each
forced job reads exactly one changed file, so the whole matrix costs a few Snakemake runs.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import re
from pathlib import Path

import pytest

from headgeom.hashing import MANIFEST_SEAL, content_hash, sha256_file
from headgeom.paths import producing_rules, template_key
from tests.e2e.conftest import copy_of, snakemake

#: What the catalog reads only to hash it for the first time: tables, figures and their
#: sources (no earlier record of their bytes exists; the catalog's SHA-256 is that record).
FIRST_HASHED = (".csv", ".md", ".tex", ".png", ".svg", ".json")
HEX64 = re.compile(r'"([0-9a-f]{64})"')


def kind(path: str) -> str:
    """The path-table key of an input file (its kind), e.g. checkpoint, effects, manifest."""
    key = template_key(path)
    assert key is not None, f"{path}: no path-table template matches this input"
    return key


def jobs_of(work: Path) -> list[dict]:
    """Every job of the finished study: rule, outputs, inputs, log (from the DAG's summary)."""
    proc = snakemake(work, "--detailed-summary")
    rows = csv.DictReader(
        io.StringIO(proc.stdout[proc.stdout.index("output_file") :]), delimiter="\t"
    )
    jobs: dict[tuple[str, str], dict] = {}
    for row in rows:
        job = jobs.setdefault(
            (row["rule"], row["log-file(s)"]),
            {"rule": row["rule"], "log": row["log-file(s)"], "outputs": [], "inputs": set()},
        )
        job["outputs"].append(row["output_file"])
        job["inputs"] |= set(filter(None, row["input-file(s)"].split(",")))
    return list(jobs.values())


def consumed(job: dict) -> set[str]:
    """The inputs a job reads as data (not the catalog's first hash of a table or figure)."""
    if job["rule"] != "catalog":
        return set(job["inputs"])
    return {f for f in job["inputs"] if not f.endswith(FIRST_HASHED) or kind(f) == "manifest"}


def rounds(jobs: list[dict]) -> list[dict[str, list[dict]]]:
    """Rounds of {changed file: forced jobs} covering every (rule, input kind) pair, in each
    of which every forced job reads exactly one changed file."""
    pairs = {(j["rule"], kind(f)) for j in jobs for f in consumed(j)}
    readers = collections.defaultdict(list)
    for j in jobs:
        for f in consumed(j):
            readers[f].append(j)
    made_by = {o: j["log"] for j in jobs for o in j["outputs"]}
    parents = {j["log"]: {made_by[f] for f in j["inputs"] if f in made_by} for j in jobs}

    def ancestors(log: str, seen: set[str]) -> set[str]:
        for p in parents[log] - seen:
            seen.add(p)
            ancestors(p, seen)
        return seen

    above = {log: ancestors(log, set()) for log in parents}
    out = []
    while pairs:
        changed: dict[str, list[dict]] = {}
        forced: set[str] = set()
        # the rules with most kinds left first: a job that reads many kinds takes a round each
        left = collections.Counter(rule for rule, _ in pairs)
        for rule, key in sorted(pairs, key=lambda p: (-left[p[0]], p)):
            # a forced job downstream of another never runs when that one fails: keep apart
            free = [
                j for j in jobs if j["rule"] == rule and j["log"] not in forced
                and not any(f in above[j["log"]] or j["log"] in above[f] for f in forced)
            ]  # fmt: skip
            for j in free:
                hit = [f for f in consumed(j) if f in changed]
                options = [f for f in sorted(consumed(j)) if kind(f) == key]
                for f in options:
                    clash = any(r["log"] in forced for r in readers[f]) and f not in changed
                    if hit in ([], [f]) and not clash:
                        changed.setdefault(f, []).append(j)
                        forced.add(j["log"])
                        break
                else:
                    continue
                break
        covered = {(j["rule"], kind(f)) for f, js in changed.items() for j in js}
        assert covered & pairs, f"no progress on {sorted(pairs)}"
        pairs -= covered
        out.append(changed)
    return out


def change_one_byte(path: Path) -> tuple[str, str]:
    """Change one byte of ``path`` in place, mtime kept; return (SHA-256 before, after).
    A manifest gets one changed hex digit inside a recorded hash (still valid JSON); any
    other file one flipped bit in its middle byte."""
    before, stat = sha256_file(path), path.stat()
    data = bytearray(path.read_bytes())
    if path.suffix == ".json":
        m = next(
            m
            for m in HEX64.finditer(data.decode())
            if f'"{MANIFEST_SEAL}"' not in data.decode()[m.start() - 20 : m.start()]
        )
        i = m.start(1)
        data[i] = ord("0") if data[i] != ord("0") else ord("1")
    else:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return before, sha256_file(path)


#: A digest a file carries about itself, named with both values (a Parquet's pages, schema,
#: footer or metadata digest; a means artifact's tensors); the recorded one may be the byte
#: that was changed, so any 64 characters.
SELF_DIGEST = re.compile(r"SHA-256 is [0-9a-f]{64} but its writer recorded \S{64}")
#: A changed byte in a header that no longer parses, or in a digest's key: no recorded
#: digest is left to be named.
UNREADABLE = ("not a readable Parquet footer", "not a readable safetensors file", "footer lacks")


def expected_values(path: Path, log: str) -> bool:
    """The check that failed is named with its values: the seal and the record's actual
    content hash (a manifest), a digest the file carries and its recomputed value, or the
    header that no longer parses (the file's two SHA-256s are checked by the caller)."""
    if path.suffix == ".json":
        record = json.loads(path.read_text())
        seal = record.pop(MANIFEST_SEAL)
        return seal in log and content_hash(record) in log
    return SELF_DIGEST.search(log) is not None or any(u in log for u in UNREADABLE)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, finished_micro):
    return copy_of(finished_micro, tmp_path_factory.mktemp("refusals") / "w")


def test_every_rule_refuses_a_changed_byte_in_every_kind_of_input(finished, tmp_path):
    jobs = jobs_of(finished)
    plan = rounds(jobs)
    matrix: dict[str, set[str]] = collections.defaultdict(set)
    failures = []
    for n, changed in enumerate(plan):
        work = tmp_path / f"round{n}"
        copy_of(finished, work)
        hashes = {f: change_one_byte(work / f) for f in changed}
        forced = [j for js in changed.values() for j in js]
        for j in forced:
            (work / j["log"]).unlink()
        proc = snakemake(
            work, "--cores", "2", "--keep-going", "--rerun-triggers", "mtime", "--force",
            *[j["outputs"][0] for j in forced], check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            failures.append(
                f"round {n}: every forced job should fail, none did ({sorted(changed)})"
            )
        for f, js in changed.items():
            before, after = hashes[f]
            rules = producing_rules(f)
            assert rules, f
            for j in js:
                log = (work / j["log"]).read_text() if (work / j["log"]).exists() else ""
                ok = (
                    f in log
                    and any(f"rule {r}" in log for r in rules)
                    and ((before in log and after in log) or expected_values(work / f, log))
                )
                left = [o for o in j["outputs"] if (work / o).exists()]
                if not ok or left:
                    failures.append(
                        f"{j['rule']} reading {kind(f)} ({f}): left {left}\n{log[-1500:]}"
                    )
                else:
                    matrix[j["rule"]].add(kind(f))
    table = "\n".join(
        f"{rule:<24} {', '.join(sorted(kinds))}" for rule, kinds in sorted(matrix.items())
    )
    print(f"\n{len(plan)} rounds; refusals (rule: input kinds)\n{table}")
    assert not failures, "\n\n".join(failures)
    expected = {(j["rule"], kind(f)) for j in jobs for f in consumed(j)}
    assert {(r, k) for r, ks in matrix.items() for k in ks} == expected
    assert set(matrix) >= {"train", "patch_heads", "patch_modes", "concentration", "catalog"}
