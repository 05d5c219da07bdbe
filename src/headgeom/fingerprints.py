"""A run's fingerprints: the SHA-256 of every trained checkpoint and of the data of every
paper table and figure (their CSV), in ``sha256sum`` format, headed by the machine record
of the run they were taken from (docs/methods.md §2.7).

The default study's published list is ``docs/reproducibility/demo.sha256``. Comparing a run
against it tells a user whether the run reproduced the published bytes and, where it did
not, what differs between the two machines' kernels (CPU, vector capability, BLAS, oneDNN,
threads, kernel-selecting variables)::

    python -m headgeom.fingerprints check results/demo
    python -m headgeom.fingerprints write results/demo > docs/reproducibility/demo.sha256
    cd results/demo && sha256sum -c ../../docs/reproducibility/demo.sha256   # coreutils only

Checkpoints are compared as files: a safetensors file holds only tensors and a header
derived from them. Tables and figures are compared by their CSV, the numbers a reader
sees, not by their Parquet, whose metadata names manifests that record the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from headgeom.hashing import load_manifest, sha256_file

#: What a fingerprint list covers, relative to a study's results folder, by kind.
KINDS = {
    "checkpoint": "models/*/s*/model.safetensors",
    "table": "tables/*.csv",
    "figure": "figures/*.csv",
}
#: The machine record's fields that choose kernels (headgeom.runtime.machine), in the
#: order a comparison prints them.
MACHINE_FIELDS = (
    "cpu",
    "cpu_capability",
    "blas",
    "mkl",
    "onednn",
    "intra_op_threads",
    "gpu",
    "kernel_variables",
)
#: The published list of the default study.
PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "reproducibility" / "demo.sha256"
MACHINE_PREFIX = "# machine: "


class FingerprintError(ValueError):
    """A results folder or a fingerprint list that cannot be compared."""


@dataclass(frozen=True)
class Fingerprints:
    """SHA-256 by path (relative to the results folder) and the machine they came from."""

    sha256: dict[str, str]
    machine: dict

    def text(self, study: str) -> str:
        """The list as ``sha256sum -c`` reads it; ``#`` lines are comments to it."""
        lines = [
            f"# headgeom fingerprints of study {study}: python -m headgeom.fingerprints check",
            MACHINE_PREFIX + json.dumps(self.machine, sort_keys=True, ensure_ascii=False),
        ]
        lines += [f"{sha}  {path}" for path, sha in sorted(self.sha256.items())]
        return "\n".join(lines) + "\n"


def kind_of(path: str) -> str:
    return next(k for k, pattern in KINDS.items() if Path(path).match(pattern))


def run_machine(results: Path) -> dict:
    """The machine record of the run's first trained checkpoint (the training job's: the
    train log's environment, copied into the manifest)."""
    for checkpoint in sorted(results.glob(KINDS["checkpoint"])):
        manifest = checkpoint.with_name("manifest.json")
        if manifest.is_file():
            environment = load_manifest(manifest).get("environment", {})
            return environment.get("machine", {}) | {"torch": environment.get("torch")}
    raise FingerprintError(f"{results}: no trained checkpoint with a manifest")


def collect(results: str | Path) -> Fingerprints:
    """The fingerprints of a results folder (every file :data:`KINDS` names)."""
    results = Path(results)
    if not results.is_dir():
        raise FingerprintError(f"{results}: not a results folder")
    files = sorted({p for pattern in KINDS.values() for p in results.glob(pattern)})
    if not any(p.match(KINDS["checkpoint"]) for p in files):
        raise FingerprintError(f"{results}: no trained checkpoints ({KINDS['checkpoint']})")
    sha = {p.relative_to(results).as_posix(): sha256_file(p) for p in files}
    return Fingerprints(sha, run_machine(results))


def parse(text: str, source: str) -> Fingerprints:
    """A list written by :meth:`Fingerprints.text` (or by ``sha256sum``, without machine)."""
    sha, machine = {}, {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(MACHINE_PREFIX):
            machine = json.loads(line[len(MACHINE_PREFIX) :])
        elif line.strip() and not line.startswith("#"):
            digest, sep, path = line.partition("  ")
            if not sep or len(digest) != 64 or not path:
                raise FingerprintError(
                    f"{source}:{number}: expected '<sha256>  <path>', got {line!r}"
                )
            sha[path] = digest
    if not sha:
        raise FingerprintError(f"{source}: no fingerprints")
    return Fingerprints(sha, machine)


@dataclass(frozen=True)
class Comparison:
    equal: list[str]
    different: list[str]
    missing: list[str]  # published, absent from the run
    extra: list[str]  # in the run, not published
    machine: list[tuple[str, object, object]]  # (field, published, this run) that differ

    @property
    def reproduced(self) -> bool:
        return not (self.different or self.missing)


def compare(published: Fingerprints, run: Fingerprints) -> Comparison:
    paths = sorted(published.sha256)
    return Comparison(
        equal=[p for p in paths if run.sha256.get(p) == published.sha256[p]],
        different=[p for p in paths if p in run.sha256 and run.sha256[p] != published.sha256[p]],
        missing=[p for p in paths if p not in run.sha256],
        extra=sorted(set(run.sha256) - set(published.sha256)),
        machine=[
            (field, published.machine.get(field), run.machine.get(field))
            for field in (*MACHINE_FIELDS, "torch")
            if published.machine.get(field) != run.machine.get(field)
        ],
    )


def report(result: Comparison) -> str:
    lines = []
    for kind in KINDS:
        published = [p for p in (*result.equal, *result.different, *result.missing)
                     if kind_of(p) == kind]  # fmt: skip
        equal = [p for p in result.equal if kind_of(p) == kind]
        lines.append(f"{kind + 's':<12} {len(equal):>3} of {len(published):>3} equal")
    lines += [f"  differs: {p}" for p in result.different]
    lines += [f"  missing: {p}" for p in result.missing]
    lines += [f"  not published: {p}" for p in result.extra]
    if result.machine:
        lines.append("machine (published → this run):")
        lines += [f"  {f}: {a!r} → {b!r}" for f, a, b in result.machine]
        if not result.reproduced:
            lines.append(
                "  different kernels give different bytes (docs/methods.md §2.7); compare the "
                "seed statistics, not the bytes"
            )
    elif not result.reproduced:
        lines.append(
            "machine: the same kernels as the published run; a difference is not a kernel "
            "difference (a changed input, config or code)"
        )
    lines.append("reproduced" if result.reproduced else "NOT reproduced")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "write"))
    parser.add_argument("results", type=Path, help="a study's results folder, e.g. results/demo")
    parser.add_argument("--published", type=Path, default=PUBLISHED,
                        help="the list to check against (default: the demo's)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        run = collect(args.results)
        if args.action == "write":
            sys.stdout.write(run.text(args.results.name))
            return 0
        published = parse(args.published.read_text(encoding="utf-8"), str(args.published))
    except (FingerprintError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = compare(published, run)
    print(report(result))
    return 0 if result.reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
