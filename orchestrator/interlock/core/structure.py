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
        doc.data = _pruned(data, prune)
        try:
            msgspec.convert(doc.data, model.KINDS[kind])
        except msgspec.ValidationError:
            return None
    return str(kind)


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


def _pruned(data: Any, paths: list[Path]) -> Any:
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
    return copy


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
