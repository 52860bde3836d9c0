"""Structural checks: each manifest document against the JSON Schema of its kind.

The schemas are generated from :mod:`interlock.core.model` (:func:`json_schema`);
``jsonschema`` reports every error with its path, and each is mapped back to a file
position. A document with errors is pruned of what is malformed so the rules of the state
machine can still be checked on the rest.
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.core import model
from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path

if TYPE_CHECKING:
    import jsonschema


def _forbid_unknown(schema: Any) -> None:
    """Forbid unknown keys in every Struct's object schema, except ``x-`` annotations."""
    if isinstance(schema, dict):
        if "title" in schema and "properties" in schema:
            schema["additionalProperties"] = False
            schema["patternProperties"] = {"^x-": {}}
        for value in schema.values():
            _forbid_unknown(value)
    elif isinstance(schema, list):
        for value in schema:
            _forbid_unknown(value)


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (2020-12) of one manifest kind, generated from the Structs."""
    schema: dict[str, Any] = msgspec.json.schema(model.KINDS[kind])
    _forbid_unknown(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://interlock.io/schemas/{kind.lower()}.json"
    return schema


@cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    import jsonschema  # on first use: most commands never validate a manifest

    schema = json_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def check_structure(doc: Document, diags: list[Diagnostic]) -> str | None:
    """Schema-check one document; returns its kind when it is structurally valid."""
    data = doc.data
    if not isinstance(data, dict):
        diags.append(doc.diag((), "wrong-type", "a manifest must be a mapping"))
        return None
    kind = data.get("kind")
    if kind not in model.KINDS:
        if "kind" not in data:
            diags.append(doc.diag((), "missing-field", "missing required field 'kind'"))
        else:
            known = ", ".join(model.KINDS)
            diags.append(
                doc.diag(("kind",), "unknown-kind", f"unknown kind {kind!r} (known: {known})")
            )
        return None
    prune: list[Path] = []
    failed = False
    for error in _validator(kind).iter_errors(data):
        diags.extend(_schema_diagnostics(doc, error))
        prune.extend(_offending_paths(error))
        failed = True
    if failed:
        # Keep going past structural errors so the rules of the state machine are checked
        # too: drop what is malformed and carry on when what is left still decodes.
        _prune(doc, prune)
        try:
            msgspec.convert(doc.data, model.KINDS[kind])
        except msgspec.ValidationError:
            # What is left misses a required field (or had one dropped): the objects that
            # do are dropped too, so the expressions of the rest are still compiled.
            if not _drop_broken_objects(doc, str(kind)):
                return None
            doc.partial = True
    return str(kind)


MAX_DROPS = 16
"""Rounds of dropping broken objects before a document is given up."""


def _drop_broken_objects(doc: Document, kind: str) -> bool:
    """Drop from ``doc.data`` each object the schema still refuses (one missing a required
    field: a limit without its ``limit``, a transition without its ``event``), in rounds,
    until it decodes; False when it does not, or when what is broken is the document's
    ``metadata`` or ``spec`` itself (nothing to check without them)."""
    for _ in range(MAX_DROPS):
        paths: list[Path] = []
        for error in _validator(kind).iter_errors(doc.data):
            found = list(_offending_paths(error)) or [tuple(error.absolute_path)]
            if any(len(path) < 2 for path in found) and not _stand_in(doc.data, error):
                return False
            paths.extend(path for path in found if len(path) >= 2)
        if not paths:
            break
        _prune(doc, paths)
    try:
        msgspec.convert(doc.data, model.KINDS[kind])
    except msgspec.ValidationError:
        return False
    return True


def _branch_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For ``X | None`` (``anyOf`` with a null branch) given a non-null value: the errors
    of the X branch, which say what is really wrong (``map`` without ``as``, say)."""
    if error.validator != "anyOf" or error.instance is None:
        return []
    options = error.validator_value if isinstance(error.validator_value, list) else []
    others = [i for i, o in enumerate(options) if o != {"type": "null"}]
    if len(others) != 1 or len(others) == len(options) or _is_type_union(error):
        return []
    return [e for e in error.context or () if e.relative_schema_path[0] == others[0]]


def _offending_paths(error: jsonschema.ValidationError) -> list[Path]:
    branch = _branch_errors(error)
    if branch:
        return [p for e in branch for p in _offending_paths(e)]
    path: Path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(_schema_of(error).get("properties", {}))
        return [(*path, k) for k in error.instance if k not in allowed]
    if error.validator == "required":
        return []  # nothing to drop: decoding fails and the rules wait for a fix
    return [path] if path else []


def _prune(doc: Document, paths: list[Path]) -> None:
    """Drop ``paths`` from the document's value; the positions of the list items after a
    dropped one move up with them, so what is said of the rest points where it stands."""
    doc.data, popped = _pruned(doc.data, paths)
    for path in popped:  # (from the back, as they were popped)
        doc.values = _moved_up(doc.values, path)
        doc.keys = _moved_up(doc.keys, path)


def _stand_in(data: Any, error: jsonschema.ValidationError) -> bool:
    """For a workflow's missing ``initial_state`` or a missing ``metadata.name``, a value
    that stands in for it (its first state, a placeholder) so the rest can be checked;
    False for any other error of the document's ``metadata`` or ``spec`` themselves."""
    where, instance = tuple(error.absolute_path), error.instance
    if error.validator != "required" or not isinstance(instance, dict):
        return False
    required = error.validator_value if isinstance(error.validator_value, list) else []
    missing = [k for k in required if k not in instance]
    states = instance.get("states")
    if where == ("spec",) and missing == ["initial_state"] and isinstance(states, dict):
        if not states:
            return False
        data["spec"]["initial_state"] = next(iter(states))
        return True
    if where == ("metadata",) and missing == ["name"]:
        data["metadata"]["name"] = "unnamed"
        return True
    return False


def _moved_up(table: dict[Path, Any], gone: Path) -> dict[Path, Any]:
    """``table`` (positions by path) once the list item ``gone`` is dropped."""
    container, index, depth = gone[:-1], gone[-1], len(gone) - 1
    assert isinstance(index, int)
    out: dict[Path, Any] = {}
    for path, span in table.items():
        at = path[depth] if len(path) > depth and path[:depth] == container else None
        if isinstance(at, int) and at == index:
            continue
        if isinstance(at, int) and at > index:
            out[(*container, at - 1, *path[depth + 1 :])] = span
        else:
            out[path] = span
    return out


def _pruned(data: Any, paths: list[Path]) -> tuple[Any, list[Path]]:
    """A copy of ``data`` without ``paths``, and the list items dropped, in that order."""
    popped: list[Path] = []
    copy = json.loads(json.dumps(data, default=str))
    # Children before their parent and list items from the back (item 10 before item 9, as
    # numbers), so earlier deletions move nothing later: the paths in reverse order. Two
    # paths differ first where they name items of one container: both keys of a mapping
    # (text) or both indexes of a list.
    for path in sorted(paths, reverse=True):
        parent = copy
        for step in path[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, list) and isinstance(path[-1], int) and path[-1] < len(parent):
            parent.pop(path[-1])
            popped.append(path)
    return copy, popped


def _schema_diagnostics(doc: Document, error: jsonschema.ValidationError) -> list[Diagnostic]:
    branch = _branch_errors(error)
    if branch:
        return [d for e in branch for d in _schema_diagnostics(doc, e)]
    path: Path = tuple(error.absolute_path)
    where = ".".join(str(p) for p in path) or "document"
    validator = error.validator
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(_schema_of(error).get("properties", {}))
        out = []
        for key in error.instance:
            if key not in allowed and not str(key).startswith("x-"):
                hint = ", ".join(sorted(allowed))
                out.append(
                    doc.diag(
                        (*path, key),
                        "unknown-key",
                        f"unknown key {key!r} in {where} (allowed: {hint})",
                        key=True,
                    )
                )
        return out
    if validator == "required":
        return [doc.diag(path, "missing-field", f"{where}: {error.message}")]
    if validator == "type" or (validator == "anyOf" and _is_type_union(error)):
        expected = _expected_types(error)
        got = type(error.instance).__name__ if error.instance is not None else "null"
        got = {"dict": "mapping", "str": "string"}.get(got, got)
        hint = ""
        if got in ("int", "float", "bool") and _is_cel(error) and path:
            # `weight: 2`: an expression is text, and YAML read a number.
            hint = f" (a CEL expression: quote it, {path[-1]}: '{_scalar_text(error.instance)}')"
        return [doc.diag(path, "wrong-type", f"{where} must be {expected}, got {got}{hint}")]
    # Anything else (enum, const, minimum, pattern...): jsonschema's own words, at the value.
    return [doc.diag(path, "invalid-value", f"{where}: {error.message}")]


def _is_cel(error: jsonschema.ValidationError) -> bool:
    """Whether the field is a CEL expression (its schema's description says so)."""
    schema = _schema_of(error)
    branches = [schema, *(b for b in schema.get("anyOf", []) if isinstance(b, dict))]
    return any(str(b.get("description", "")).startswith("A CEL expression") for b in branches)


def _scalar_text(value: Any) -> str:
    """A YAML scalar as it was meant: ``true``, not ``True``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _schema_of(error: jsonschema.ValidationError) -> dict[str, Any]:
    return error.schema if isinstance(error.schema, dict) else {}


def _is_type_union(error: jsonschema.ValidationError) -> bool:
    options = error.validator_value if isinstance(error.validator_value, list) else []
    return all(isinstance(o, dict) and set(o) <= {"type"} for o in options)


def _expected_types(error: jsonschema.ValidationError) -> str:
    if error.validator == "type":
        value = error.validator_value
        names = value if isinstance(value, list) else [value]
    else:
        names = [o["type"] for o in error.validator_value]  # type: ignore[union-attr]
    readable = [
        {"object": "a mapping", "array": "a list"}.get(str(n), str(n)) for n in names if n != "null"
    ]
    return " or ".join(readable) or "null"
