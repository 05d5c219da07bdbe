"""The numerical acceptance checks (docs §18: C1–C16, and the designed values of §9.4 and
§7.3): one format for a logged check, and the study's ``checks`` table collected from them.

A stage that runs a check records it in the metadata of the file it guards (a Parquet's
key-value metadata, or the top-level ``checks`` object of a JSON artifact) with
:func:`record`, or with :func:`enforce`, which also stops the job when the check fails:

=================================  ==========================================================
key                                value
=================================  ==========================================================
``check_<ID>_max_abs_residual``    largest absolute residual (``kind="abs"``), or
``check_<ID>_max_rel_residual``    largest relative residual (``kind="rel"``), or
``check_<ID>_mismatches``          number of items that differ (``kind="count"``, exact checks)
``check_<ID>_tolerance``           the check passes when residual ≤ tolerance
``check_<ID>_enforced``            false only where a failure is reported, not fatal (§9.4 and
                                   §7.3 below paper size)
``check_<ID>_note``                optional: what the residual covers
=================================  ==========================================================

``<ID>`` is a check of :data:`CATALOG` (``C8``, ``designed-pk``), optionally with a part after
a dot (``C3.rejection``). A residual of null means the check does not apply to that artifact
(C14 where the writes do not decompose R^D; C1 away from the paper's size). Rule ``checks``
gathers every logged check of the DAG with :func:`collect` and adds the two computed from
numbers alone (``headgeom.heads.paper.cross_run_checks``: C16 against the paper's numbers and
the §7.3 loss ordering).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from headgeom.hashing import load_manifest
from headgeom.io import read_parquet_metadata

KINDS = {"abs": "max_abs_residual", "rel": "max_rel_residual", "count": "mismatches"}


@dataclass(frozen=True)
class Check:
    """One check of docs §18 (or of §9.4 / §7.3): what it compares and where it is defined."""

    id: str
    title: str
    section: str


#: Every check the workflow logs, in docs §18 order.
CATALOG: dict[str, Check] = {
    c.id: c
    for c in (
        Check("C1", "parameter counts equal the exact integers of §6.1", "§4.4, §6.1"),
        Check("C2", "largest entry of abs(B_iᵀB_i − I) over the basis members (float64)",
              "§5.5 item 1"),
        Check("C3", "cross-member head-block PKs: closed form, 1% rule, paper range", "§5.5 3–4"),
        Check("C4", "every pairwise Kerdock difference is bent", "§5.4 step 4"),
        Check("C5", "member pairs sharing 3-dim subspaces match §5.5", "§5.5 item 5"),
        Check("C6", "frozen buffers unchanged after training", "§7.1"),
        Check("C7", "prompts: equal length, one differing token, single-token answers", "§8.1"),
        Check("C8", "patched − clean attention output = δ_i", "§11.2"),
        Check("C9", "head-patch effects recomputed from δ equal the stored ones", "§11.2"),
        Check("C10", "per-head means of the per-example effects reproduce e and N_eff", "§10.2"),
        Check("C11", "N_eff = N_index · N_layer_given_index", "§10.3"),
        Check("C12", "everything clamped, nothing patched → clean logits", "§13.3"),
        Check("C13", "both clamp conditions reproduce the direct values", "§13.3"),
        Check("C14", "Proposition 1: Σ_h PK(U^{l,h}, R) = dim R", "§9.4"),
        Check("C15", "step-0 checkpoint regenerated from the seed is byte-identical", "§7.3"),
        Check("C16", "Spearman(loss, N_eff) from the paper's Table 6 numbers", "§12.7"),
        Check("designed-pk", "frozen head-block PKs: d same index, 0 other, d²/D across members "
              "(paper: 64 / 0 / 5.332–5.336)", "§9.4"),
        Check("loss-order", "validation loss within a corpus: learned < write-* < read-common "
              "< all-*", "§7.3"),
    )
}  # fmt: skip

_KEY = re.compile(
    r"^check_(?P<id>[A-Za-z0-9-]+(?:\.[a-z0-9-]+)?)_"
    # legacy spellings (max_abs_logit_residual, max_abs_diff) read as their kind
    r"(?P<field>max_(?P<kind>abs|rel)(?:_[a-z]+)?_(?:residual|diff)|mismatches|tolerance|"
    r"enforced|note|applies)$"
)


class CheckFailed(ArithmeticError):
    """A check's residual exceeds its tolerance (the job stops; nothing is written)."""


def passes(residual: float | None, tolerance: float) -> bool | None:
    """residual ≤ tolerance; None where the check does not apply (residual None); a NaN
    residual fails."""
    if residual is None:
        return None
    return bool(residual <= tolerance)


def record(
    check: str,
    residual: float | None,
    tolerance: float,
    kind: str = "abs",
    *,
    enforced: bool = True,
    note: str | None = None,
) -> dict[str, Any]:
    """The metadata keys of one logged check (see the module text)."""
    if check.split(".")[0] not in CATALOG:
        raise ValueError(f"unknown check {check!r}; known: {list(CATALOG)}")
    if kind not in KINDS:
        raise ValueError(f"check {check}: kind {kind!r} is not one of {list(KINDS)}")
    value = None if residual is None else (int(residual) if kind == "count" else float(residual))
    out: dict[str, Any] = {
        f"check_{check}_{KINDS[kind]}": value,
        f"check_{check}_tolerance": float(tolerance),
    }
    if not enforced:
        out[f"check_{check}_enforced"] = False
    if note:
        out[f"check_{check}_note"] = note
    return out


def enforce(
    check: str,
    residual: float | None,
    tolerance: float,
    kind: str = "abs",
    *,
    where: str | os.PathLike = "",
    what: str = "",
    enforced: bool = True,
    note: str | None = None,
) -> dict[str, Any]:
    """:func:`record`, raising :class:`CheckFailed` (naming ``where`` and ``what``) when an
    enforced check fails."""
    if enforced and passes(residual, tolerance) is False:
        label = {"abs": "max |residual|", "rel": "max relative residual", "count": "mismatches"}
        place = f"{where}: " if str(where) else ""
        detail = f" ({what})" if what else ""
        raise CheckFailed(
            f"{place}check {check} failed{detail}: {label[kind]} {residual:.6g} > tolerance "
            f"{tolerance:.3g} (docs §18)"
        )
    return record(check, residual, tolerance, kind, enforced=enforced, note=note)


# ----------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Logged:
    """One logged check as read back from an artifact."""

    check: str
    kind: str | None
    residual: float | None
    tolerance: float | None
    enforced: bool
    note: str | None

    @property
    def passed(self) -> bool | None:
        return None if self.tolerance is None else passes(self.residual, self.tolerance)


def decoded(value: Any) -> Any:
    """A metadata value: Parquet metadata holds JSON text (io.write_parquet), JSON artifacts
    hold the value itself."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse(metadata: Mapping[str, Any], where: str | os.PathLike = "") -> dict[str, Logged]:
    """Every check of :data:`CATALOG` logged in ``metadata``, by id (with its part). A
    residual without a tolerance, a tolerance without a residual or a value that is not a
    number is an error naming ``where`` and the key."""
    fields: dict[str, dict[str, Any]] = {}
    for key, raw in metadata.items():
        match = _KEY.match(key)
        if match is None or match["id"].split(".")[0] not in CATALOG:
            continue  # not a §18 check (e.g. clamps' check_effects_*)
        field = match["field"]
        entry = fields.setdefault(match["id"], {})
        value = decoded(raw)
        if match["kind"] or field == "mismatches":
            kind = match["kind"] or "count"
            if "kind" in entry:
                raise ValueError(f"{where}: check {match['id']} has two residual keys")
            entry.update(kind=kind, residual=value, key=key)
        else:
            entry[field] = value
    out = {}
    for check, entry in fields.items():
        applies = entry.get("applies", True)
        if "tolerance" not in entry and applies is not False:
            raise KeyError(f"{where}: metadata has a residual of check {check} but no "
                           f"'check_{check}_tolerance'")  # fmt: skip
        if "kind" not in entry and applies is not False:
            raise KeyError(f"{where}: metadata has 'check_{check}_tolerance' but no residual "
                           f"key (check_{check}_max_abs_residual, _max_rel_residual or "
                           "_mismatches)")  # fmt: skip
        residual, tolerance = entry.get("residual"), entry.get("tolerance")
        for name, value in (("residual", residual), ("tolerance", tolerance)):
            if value is not None and not is_number(value):
                raise ValueError(f"{where}: check {check} {name} is {value!r}, not a number")
        out[check] = Logged(
            check=check,
            kind=entry.get("kind"),
            residual=None if residual is None or applies is False else float(residual),
            tolerance=None if tolerance is None else float(tolerance),
            enforced=bool(entry.get("enforced", True)),
            note=entry.get("note"),
        )
    return out


def artifact_checks(path: str | os.PathLike) -> list[tuple[str | None, dict[str, Logged]]]:
    """The logged checks of one artifact as (scope, checks) groups: a Parquet's metadata (one
    group), a JSON artifact's top-level ``checks`` (one group) or the ``checks`` of each of
    its ``families`` (the basis family record, one group per family)."""
    path = Path(path)
    if path.suffix == ".parquet":
        return [(None, parse(read_parquet_metadata(path), path))]

    obj = load_manifest(path)  # every JSON artifact a check reads is sealed
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object with 'checks' or 'families'")
    if "families" in obj:
        return [
            (family_scope(f), parse(f.get("checks", {}), f"{path} family {i}"))
            for i, f in enumerate(obj["families"])
        ]
    return [(None, parse(obj.get("checks", {}), path))]


def family_scope(family: Mapping[str, Any]) -> str:
    """How a checks row names one basis family of ``geometry/basis_family.json``."""
    record = family["record"]
    return (f"basis family D={record['d_model']} d={record['d_head']} "
            f"{record['n_members']} members ({family['basis_family_hash'][:12]})")  # fmt: skip


# ----------------------------------------------------------------------------- collecting
#: The checks each input kind of rule ``checks`` must carry (a missing one is an error).
EXPECTED: dict[str, tuple[str, ...]] = {
    "param_counts": ("C1",),
    "basis_family": ("C2", "C3", "C3.rejection", "C3.range", "C4", "C5"),
    "manifest": ("C6",),
    "task": ("C7",),
    "leakage": ("C8", "C9"),
    "summary": ("C10", "C11"),
    "clamps": ("C12", "C13"),
    "geometry_summary": ("C14", "designed-pk"),
    "train_log": ("C15",),
    "run_log": (),  # an imported model's run log: its validation loss only
}
#: The rule that writes each input kind.
RULES = {
    "param_counts": "param_counts",
    "basis_family": "basis_family",
    "manifest": "hash_checkpoint",
    "task": "make_tasks",
    "leakage": "leakage",
    "summary": "concentration",
    "clamps": "clamps",
    "geometry_summary": "geometry_stats",
    "train_log": "train",
    "run_log": "import_model",
}
COLUMNS = ["check", "part", "title", "section", "rule", "path", "scope", "model", "seed",
           "task", "kind", "residual", "tolerance", "passed", "enforced", "note"]  # fmt: skip


def row(logged: Logged, **where: Any) -> dict[str, Any]:
    base, _, part = logged.check.partition(".")
    spec = CATALOG[base]
    return {
        "check": base,
        "part": part or None,
        "title": spec.title,
        "section": spec.section,
        **where,
        "kind": logged.kind,
        "residual": logged.residual,
        "tolerance": logged.tolerance,
        "passed": logged.passed,
        "enforced": logged.enforced,
        "note": logged.note if logged.residual is not None else (logged.note or "does not apply"),
    }


def collect(files: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of every check logged in ``files`` (each ``{kind, path, model?, seed?, task?}``):
    one per (file, scope, check), refusing a file that lacks a check its kind carries."""
    rows = []
    for f in files:
        kind, path = f["kind"], str(f["path"])
        if kind not in EXPECTED:
            raise ValueError(f"{path}: unknown checks input kind {kind!r}; known {list(EXPECTED)}")
        for scope, found in artifact_checks(path):
            missing = [c for c in EXPECTED[kind] if c not in found]
            if missing:
                raise KeyError(
                    f"{path}: no logged check {', '.join(missing)} (expected keys "
                    f"check_<ID>_tolerance and a residual; rerun rule {RULES[kind]})"
                )
            where = {
                "rule": RULES[kind],
                "path": path,
                "scope": scope,
                "model": f.get("model"),
                "seed": f.get("seed"),
                "task": f.get("task"),
            }
            rows += [row(found[c], **where) for c in sorted(found, key=_order)]
    return rows


#: The order of a check's parts in the table (others after these, alphabetically).
PARTS = {"C3": ("", "rejection", "range"), "C16": ("", "twelve-head")}


def _order(check: str) -> tuple[int, int, str]:
    base, _, part = check.partition(".")
    known = PARTS.get(base, ("",))
    rank = known.index(part) if part in known else len(known)
    return list(CATALOG).index(base), rank, part


def table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """``results.CHECKS`` frame of ``rows`` in docs §18 order (stable within a check)."""
    frame = pd.DataFrame(list(rows), columns=COLUMNS)
    frame["_order"] = frame["check"].map(list(CATALOG).index)
    frame = frame.sort_values("_order", kind="stable").drop(columns="_order")
    frame["seed"] = frame["seed"].astype("Int64")
    frame["passed"] = frame["passed"].astype("boolean")
    return frame.reset_index(drop=True)


def failures(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of enforced checks that failed (these stop rule ``checks``)."""
    return frame[frame["enforced"] & frame["passed"].eq(False).fillna(False)]


def describe(row: Mapping[str, Any]) -> str:
    """One line of a checks row: id, where, residual against tolerance, note."""
    part = row["part"] if isinstance(row["part"], str) else None
    name = f"{row['check']}.{part}" if part else row["check"]
    where = row["path"] if isinstance(row["path"], str) else row["scope"]
    residual = "n/a" if pd.isna(row["residual"]) else f"{row['residual']:.6g}"
    return f"{name} {where}: residual {residual} > {row['tolerance']:.3g} ({row['note']})"


def summary_line(frame: pd.DataFrame) -> str:
    """How many checks passed, failed (reported only) and did not apply."""
    passed = int(frame["passed"].eq(True).sum())
    failed = int(frame["passed"].eq(False).sum())
    return (f"{len(frame)} checks: {passed} passed, {failed} failed (reported only), "
            f"{int(frame['passed'].isna().sum())} not applicable")  # fmt: skip
