"""What a study config may be: the schema check (each kind's ``workflow/schemas/*.schema.yaml``,
:mod:`headgeom.studies`, with defaults filled as Snakemake's ``validate`` fills them) and its
messages, one short line per problem (key path, bad value, what is allowed, the nearest
allowed name), never the schema.
"""

from __future__ import annotations

import copy
import difflib
import reprlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators


class StudyConfigError(ValueError):
    """A config the workflow cannot run; ``str()`` is the concise message, one line per
    problem (``problems`` holds them)."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(dict.fromkeys(problems))  # one line per distinct problem
        super().__init__("\n".join(self.problems))


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 60, 60, 6, 4
_TYPES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping of keys to values",
}
_BOUNDS = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}


def _key_path(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _where(path: Iterable[Any]) -> str:
    key = _key_path(path)
    return f"config {key}" if key else "config"


def did_you_mean(word: Any, choices: Iterable[Any]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def listing(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _describe(error) -> list[str]:
    """One concise line per problem of a jsonschema ValidationError."""
    kind, allowed, value, schema = (
        error.validator,
        error.validator_value,
        error.instance,
        error.schema,
    )
    where = _where(error.absolute_path)
    if "propertyNames" in error.relative_schema_path:  # a key (model, corpus, rule) badly named
        return [f"{where}: key {value!r} is not allowed; keys must match {allowed}"]
    if kind == "additionalProperties" and allowed is False:
        known = list(schema.get("properties", {}))
        return [
            f"{where}: unknown key {extra!r}{did_you_mean(extra, known)}; allowed: {listing(known)}"
            for extra in value
            if extra not in known
        ]
    if kind == "required":
        missing = [k for k in allowed if k not in value]
        return [f"{where}: missing required key(s) {listing(missing)}"]
    if kind == "enum":
        return [
            f"{where}: {_SHORT.repr(value)} is not allowed{did_you_mean(value, allowed)}; "
            f"allowed: {listing(allowed)}"
        ]
    if kind == "type":
        wanted = " or ".join(
            _TYPES.get(t, t) for t in ([allowed] if isinstance(allowed, str) else allowed)
        )
        return [f"{where}: {_SHORT.repr(value)} is not allowed; it must be {wanted}"]
    if kind in _BOUNDS:
        return [
            f"{where}: {_SHORT.repr(value)} is not allowed; it must be {_BOUNDS[kind]} {allowed}"
        ]
    if kind == "multipleOf":
        return [f"{where}: {value!r} is not allowed; it must be a multiple of {allowed}"]
    if kind == "pattern":
        return [f"{where}: {_SHORT.repr(value)} is not allowed; it must match {allowed}"]
    rules = {
        "minItems": f"at least {allowed} item(s)",
        "maxItems": f"at most {allowed} item(s)",
        "uniqueItems": "no item twice",
        "minProperties": f"at least {allowed} key(s)",
        "minLength": f"at least {allowed} character(s)",
    }
    rule = rules.get(kind, f"{kind}: {_SHORT.repr(allowed)}")
    return [f"{where}: {_SHORT.repr(value)} is not allowed; it must have {rule}"]


def _validator(schema: Mapping):
    """Draft 2020-12 validator that fills ``default`` values as it validates (as Snakemake's
    ``validate``; a copy of each default, so one schema serves many configs)."""
    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for name, spec in properties.items():
                if "default" in spec:
                    instance.setdefault(name, copy.deepcopy(spec["default"]))
        yield from check_properties(validator, properties, instance, subschema)

    extended = validators.extend(Draft202012Validator, {"properties": properties_with_defaults})
    return extended(schema)


def validate(config: dict, schema: Mapping) -> list[str]:
    """Fill the schema's defaults into ``config`` (in place) and return one line per problem."""
    errors = _validator(schema).iter_errors(config)
    return [line for error in errors for line in _describe(error)]


def run_checks(checks: Iterable) -> None:
    """Run every cross-key check (a callable raising ValueError with one line) and raise
    :class:`StudyConfigError` listing every problem, not only the first."""
    problems = []
    for check in checks:
        try:
            check()
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise StudyConfigError(problems)


def load_schema(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def checked_config(config: Mapping, schema: str | Path | Mapping) -> dict:
    """A copy of ``config`` valid under ``schema`` (a file, or the schema itself), its
    defaults filled; :class:`StudyConfigError` listing every problem otherwise. A study's
    ``from_config`` then runs its cross-key checks (:func:`run_checks`) on the copy."""
    config = copy.deepcopy(dict(config))
    problems = validate(config, schema if isinstance(schema, Mapping) else load_schema(schema))
    if problems:
        raise StudyConfigError(problems)
    return config


#: The keys naming an import's files: format hub names a Hub model, every other format a path.
_IMPORT_KEYS = {"hub": ("repo_id", "revision")}


def import_problems(config: Mapping) -> list[str]:
    """Every model has a training recipe (geometry) or an import block, and an import block
    names its files by the keys of its format (``path``; format hub: repo_id, revision)."""
    problems = []
    for m, spec in config.get("models", {}).items():
        if not isinstance(spec, dict):
            continue
        if "geometry" not in spec and "import" not in spec:
            problems.append(
                f"config models.{m}: give geometry (a model to train) or import (a checkpoint "
                "to import)"
            )
        block = spec.get("import")
        if not isinstance(block, dict) or "format" not in block:
            continue
        keys = _IMPORT_KEYS.get(block["format"], ("path",))
        missing = [k for k in keys if k not in block]
        stray = [k for k in ("path", "repo_id", "revision") if k in block and k not in keys]
        if missing or stray:
            problems.append(
                f"config models.{m}.import: format {block['format']} takes "
                f"{' and '.join(keys)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; not {', '.join(stray)}" if stray else "")
            )
    return problems
