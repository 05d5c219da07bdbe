"""The YAML data files shipped in the package (the model zoo, the paper's reference numbers),
each checked against its JSON schema on load.

A data file ``<name>.yaml`` lies beside its schema ``<name>.schema.yaml`` in a package
(``pyproject.toml`` ships both as package data). :func:`load` reads and validates it; a
problem raises :class:`DataFileError` with one short line per problem that names the file,
the entry (``references[12] (§20.1 validation loss (nats), learned (R, seed #1))``) and the
key. :func:`problem` words a check the schema cannot express (an unknown recipe, a repeated
name) the same way.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import yaml
from jsonschema import Draft202012Validator

#: Names an entry of the file for a message: (list name, index, the entry) -> label.
EntryName = Callable[[str, int, Any], str]

#: libyaml's safe loader where PyYAML has it (five times faster on references.yaml).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother = 60, 60


class DataFileError(ValueError):
    """A shipped data file that does not match its schema or its consumers' checks."""


def path_of(package: str, name: str) -> str:
    """The file ``name`` of ``package`` as the messages name it (package-relative)."""
    return f"{package.replace('.', '/')}/{name}"


def read(package: str, name: str) -> Any:
    """The parsed YAML file ``name`` of ``package`` (installed or editable alike)."""
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return yaml.load(text, Loader=_LOADER)


def load(package: str, name: str, entry_name: EntryName | None = None) -> Any:
    """Read ``<name>.yaml`` of ``package`` and validate it against ``<name>.schema.yaml``."""
    data = read(package, f"{name}.yaml")
    schema = read(package, f"{name}.schema.yaml")
    errors = sorted(Draft202012Validator(schema).iter_errors(data), key=_position)
    lines = [_describe(data, error, entry_name) for error in errors]
    if lines:
        where = path_of(package, f"{name}.yaml")
        raise DataFileError(f"{where}: {len(lines)} problem(s)\n  " + "\n  ".join(lines))
    return data


def _position(error) -> list[tuple[int, int | str]]:
    """Sort key: errors in file order (list indices as numbers)."""
    return [(0, p) if isinstance(p, int) else (1, str(p)) for p in error.absolute_path]


def problem(package: str, name: str, where: str, text: str) -> DataFileError:
    """A :class:`DataFileError` for one problem at ``where`` (an entry and key)."""
    return DataFileError(f"{path_of(package, f'{name}.yaml')}: {where}: {text}")


def entry_where(
    data: Any, path: Sequence[Any], entry_name: EntryName | None = None, key: str = ""
) -> str:
    """``references[12] (label), key args.geometry`` for a path into the file."""
    path = list(path)
    if len(path) >= 2 and isinstance(path[1], int):
        head = f"{path[0]}[{path[1]}]"
        if entry_name is not None:
            try:
                head += f" ({entry_name(path[0], path[1], data[path[0]][path[1]])})"
            except (KeyError, IndexError, TypeError):
                pass
        rest = path[2:]
    else:
        head, rest = "top level", path
    keys = ".".join(str(p) for p in rest)
    keys = f"{keys}.{key}" if keys and key else keys or key
    return f"{head}, key {keys}" if keys else head


def _describe(data: Any, error, entry_name: EntryName | None) -> str:
    where = entry_where(data, error.absolute_path, entry_name)
    kind, allowed, value = error.validator, error.validator_value, error.instance
    if kind == "additionalProperties" and allowed is False:
        known = list(error.schema.get("properties", {}))
        extra = [k for k in value if k not in known]
        return f"{where}: unknown key(s) {', '.join(map(repr, extra))}; allowed: {', '.join(known)}"
    if kind == "required":
        missing = [k for k in allowed if k not in value]
        return f"{where}: missing key(s) {', '.join(missing)}"
    if kind in ("oneOf", "anyOf", "not") and "description" in error.schema:
        return f"{where}: {error.schema['description']}"
    if kind == "enum":
        return f"{where}: {_SHORT.repr(value)} is not one of {', '.join(map(str, allowed))}"
    return f"{where}: {error.message if len(error.message) < 160 else error.message[:157] + '...'}"
