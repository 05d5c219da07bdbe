"""A run's fingerprints: the SHA-256 of every trained checkpoint and of the data of every
paper table and figure (their CSV), in ``sha256sum`` format, headed by the machine records of
the runs that produced those bytes (docs/methods.md §2.7).

A study's published list is ``docs/reproducibility/<study>.sha256`` (``demo``: the default
study; ``samoe-demo``: the SA-MoE demo). Comparing a run against it tells a user whether the
run reproduced the published bytes and, where it did not, what differs between the two
machines: the kernels each library chose (torch's capability, MKL, oneDNN, numpy's SIMD
targets, numpy's and scipy's OpenBLAS cores, threads, kernel-selecting variables), or only
the hardware, or nothing the records capture::

    python -m headgeom.fingerprints check results/demo
    python -m headgeom.fingerprints write results/demo > docs/reproducibility/demo.sha256
    python -m headgeom.fingerprints record results/demo   # reproduced: add this machine
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
from headgeom.io import write_text

#: What a fingerprint list covers, relative to a study's results folder, by kind: the
#: head-geometry layout and the SA-MoE one (a folder holds one of them).
KINDS = {
    "checkpoint": (
        "models/*/s*/model.safetensors",
        "samoe/*/dense/model.safetensors",
        "samoe/*/*/s*/model.safetensors",
    ),
    "table": ("tables/*.csv", "samoe/tables/*.csv"),
    "figure": ("figures/*.csv", "samoe/figures/*.csv"),
}
#: Outputs that hold wall-clock measurements, never the same bytes twice: left out (SA-MoE's
#: Table 13, the audit cost, and Table 5, the runtime).
TIMED = frozenset({"samoe/tables/table13.csv", "samoe/tables/table5.csv"})
#: The machine record's fields (headgeom.runtime.machine) that say which kernels ran, in the
#: order a comparison prints them, then those that only describe the hardware.
KERNEL_FIELDS = (
    "cpu_capability",
    "blas",
    "mkl",
    "onednn",
    "numpy_simd",
    "blas_libraries",
    "intra_op_threads",
    "gpu",
    "kernel_variables",
    "torch",
)
HARDWARE_FIELDS = ("cpu", "cpu_vendor", "cpu_vector_width")
MACHINE_FIELDS = (*HARDWARE_FIELDS, *KERNEL_FIELDS)
#: The published lists, one per study (``<study>.sha256``).
PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "docs" / "reproducibility"
PUBLISHED = PUBLISHED_DIR / "demo.sha256"
MACHINE_PREFIX = "# machine: "


class FingerprintError(ValueError):
    """A results folder or a fingerprint list that cannot be compared."""


@dataclass(frozen=True)
class Fingerprints:
    """SHA-256 by path (relative to the results folder) and the machines that produced them
    (one for a run; every machine that reproduced a published list)."""

    sha256: dict[str, str]
    machines: list[dict]

    def text(self, study: str) -> str:
        """The list as ``sha256sum -c`` reads it; ``#`` lines are comments to it."""
        lines = [f"# headgeom fingerprints of study {study}: python -m headgeom.fingerprints check"]
        lines += [MACHINE_PREFIX + json.dumps(m, sort_keys=True, ensure_ascii=False)
                  for m in self.machines]  # fmt: skip
        lines += [f"{sha}  {path}" for path, sha in sorted(self.sha256.items())]
        return "\n".join(lines) + "\n"


def kind_of(path: str) -> str:
    return next(k for k, patterns in KINDS.items() if any(Path(path).match(p) for p in patterns))


def machine_of(environment: dict) -> dict:
    """A manifest's ``environment`` record as a fingerprint list's machine record: the
    machine and the torch build."""
    return environment.get("machine", {}) | {"torch": environment.get("torch")}


def run_machine(results: Path) -> dict:
    """The machine record of the run's first trained checkpoint (the training job's: the
    train log's environment, copied into the manifest)."""
    for checkpoint in sorted(p for pattern in KINDS["checkpoint"] for p in results.glob(pattern)):
        manifest = checkpoint.with_name("manifest.json")
        if manifest.is_file():
            return machine_of(load_manifest(manifest).get("environment", {}))
    raise FingerprintError(f"{results}: no trained checkpoint with a manifest")


def collect(results: str | Path) -> Fingerprints:
    """The fingerprints of a results folder (every file :data:`KINDS` names but the
    :data:`TIMED` ones)."""
    results = Path(results)
    if not results.is_dir():
        raise FingerprintError(f"{results}: not a results folder")
    files = sorted({p for patterns in KINDS.values() for pattern in patterns
                    for p in results.glob(pattern)
                    if p.relative_to(results).as_posix() not in TIMED})  # fmt: skip
    if not any(kind_of(p.relative_to(results).as_posix()) == "checkpoint" for p in files):
        raise FingerprintError(
            f"{results}: no trained checkpoints ({', '.join(KINDS['checkpoint'])})"
        )
    sha = {p.relative_to(results).as_posix(): sha256_file(p) for p in files}
    return Fingerprints(sha, [run_machine(results)])


def parse(text: str, source: str) -> Fingerprints:
    """A list written by :meth:`Fingerprints.text` (or by ``sha256sum``, without machines)."""
    sha, machines = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(MACHINE_PREFIX):
            try:
                machines.append(json.loads(line[len(MACHINE_PREFIX) :]))
            except json.JSONDecodeError as err:
                raise FingerprintError(f"{source}:{number}: a machine record that is not "
                                       f"JSON ({err.msg})") from err  # fmt: skip
        elif line.strip() and not line.startswith("#"):
            digest, sep, path = line.partition("  ")
            if not sep or len(digest) != 64 or not path:
                raise FingerprintError(
                    f"{source}:{number}: expected '<sha256>  <path>', got {line!r}"
                )
            sha[path] = digest
    if not sha:
        raise FingerprintError(f"{source}: no fingerprints")
    return Fingerprints(sha, machines)


@dataclass(frozen=True)
class MachineDifference:
    """How the run's machine record differs from one published record."""

    kernels: list[tuple[str, object, object]]  # (field, published, this run) recorded in both
    hardware: list[tuple[str, object, object]]
    unrecorded: list[str]  # kernel fields one of the two records does not hold

    @property
    def size(self) -> tuple[int, int, int]:
        return (len(self.unrecorded), len(self.kernels), len(self.hardware))


def machine_difference(published: dict, run: dict) -> MachineDifference:
    def differing(fields):
        return [(f, published.get(f), run.get(f)) for f in fields
                if f in published and published.get(f) != run.get(f)]  # fmt: skip

    return MachineDifference(
        kernels=differing(KERNEL_FIELDS),
        hardware=differing(HARDWARE_FIELDS),
        unrecorded=[f for f in KERNEL_FIELDS if f not in published or f not in run],
    )


@dataclass(frozen=True)
class Comparison:
    equal: list[str]
    different: list[str]
    missing: list[str]  # published, absent from the run
    extra: list[str]  # in the run, not published
    machine: MachineDifference  # against the closest published machine record
    published_machines: int

    @property
    def reproduced(self) -> bool:
        return not (self.different or self.missing)


def compare(published: Fingerprints, run: Fingerprints) -> Comparison:
    paths = sorted(published.sha256)
    mine = run.machines[0]
    candidates = [machine_difference(m, mine) for m in published.machines]
    return Comparison(
        equal=[p for p in paths if run.sha256.get(p) == published.sha256[p]],
        different=[p for p in paths if p in run.sha256 and run.sha256[p] != published.sha256[p]],
        missing=[p for p in paths if p not in run.sha256],
        extra=sorted(set(run.sha256) - set(published.sha256)),
        machine=min(candidates, key=lambda d: d.size, default=machine_difference({}, mine)),
        published_machines=len(published.machines),
    )


def diagnosis(result: Comparison) -> str:
    """What the machine records can and cannot say about a difference in bytes: never that
    the kernels were the same, only that the records agree."""
    diff = result.machine
    if result.missing and not result.different:
        return ("every file the run has is equal, but it lacks published files: finish the "
                "workflow (or name the target that makes them), then check again")  # fmt: skip
    if result.published_machines == 0:
        return ("the published list records no machine: whether the kernels differ cannot be "
                "told")  # fmt: skip
    if diff.kernels:
        return ("the kernels differ (above): different kernels give different bytes "
                "(docs/methods.md §2.7); compare the seed statistics, not the bytes")  # fmt: skip
    if diff.unrecorded:
        return (
            f"the records do not both say {', '.join(diff.unrecorded)}: whether those "
            "kernels differ cannot be told from them (docs/methods.md §2.7)"
        )
    if diff.hardware:
        return ("every recorded kernel choice agrees, but the CPUs differ (above): a library "
                "path the record does not capture may still differ between them "
                "(docs/methods.md §2.7), or an input, config or code changed")  # fmt: skip
    return ("every recorded kernel choice and the CPU agree with the published run's: look "
            "first for a changed input, config or code; a kernel path the record does not "
            "capture remains possible (docs/methods.md §2.7)")  # fmt: skip


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
    diff = result.machine
    if diff.kernels or diff.hardware:
        closest = " (the closest of them)" if result.published_machines > 1 else ""
        lines.append(f"machine (published{closest} → this run):")
        lines += [f"  {f}: {a!r} → {b!r}" for f, a, b in (*diff.hardware, *diff.kernels)]
    if diff.unrecorded:
        lines.append(f"  not in both records: {', '.join(diff.unrecorded)}")
    if not result.reproduced:
        lines.append("  " + diagnosis(result))
    lines.append("reproduced" if result.reproduced else "NOT reproduced")
    return "\n".join(lines)


def published_for(results: Path) -> Path:
    """The published list of the study whose results folder is ``results``."""
    return PUBLISHED_DIR / f"{results.resolve().name}.sha256"


def with_machine(published: Fingerprints, machine: dict) -> Fingerprints:
    """The published list with ``machine`` added to the machines that reproduced it."""
    if machine in published.machines:
        return published
    return Fingerprints(published.sha256, [*published.machines, machine])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "write", "record"),
                        help="check: compare with the published list; write: print this run's "
                             "list; record: add this machine to the published list, if it "
                             "reproduced every published file")  # fmt: skip
    parser.add_argument("results", type=Path, help="a study's results folder, e.g. results/demo")
    parser.add_argument("--published", type=Path, default=None,
                        help="the list to check against (default: "
                             "docs/reproducibility/<results folder name>.sha256)")  # fmt: skip
    args = parser.parse_args(argv)
    listing = args.published or published_for(args.results)
    try:
        run = collect(args.results)
        if args.action == "write":
            sys.stdout.write(run.text(args.results.resolve().name))
            return 0
        published = parse(listing.read_text(encoding="utf-8"), str(listing))
    except (FingerprintError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = compare(published, run)
    print(report(result))
    if args.action == "record" and result.reproduced:
        study = listing.name.removesuffix(".sha256")
        added = with_machine(published, run.machines[0])
        write_text(listing, added.text(study))
        print(f"{listing}: {len(added.machines)} machine records")
    return 0 if result.reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
