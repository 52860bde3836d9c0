"""A capability's JSON Schemas, compiled once, when the registry learns the capability.

The orchestrator checks every request's input before dispatching it and every answer's
output before deciding on it; checking the schema against its meta-schema and building a
validator was most of that cost, so it is done once per capability (and again only when
an AgentDef is applied anew), never per message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from interlock.core.vocabulary import InterlockError

_SIMPLE_TYPES: dict[str, type] = {"object": dict, "array": list, "string": str, "boolean": bool}
"""Schemas that are only a type, checked without jsonschema (most output schemas)."""


class SchemaMismatch(ValueError, InterlockError):
    """An instance does not match a schema; ``where`` is its JSON path (``(root)``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"at {where}: {message}")
        self.where = where
        self.message = message


class CompiledSchema:
    """One JSON Schema, checked against its meta-schema and compiled.

    Raises:
        jsonschema.SchemaError: (at construction) the schema itself is not valid.
    """

    def __init__(self, schema: Mapping[str, Any]) -> None:
        kind = schema.get("type") if len(schema) == 1 else None
        self._simple = _SIMPLE_TYPES.get(kind) if isinstance(kind, str) else None
        self._kind = kind
        self._validator: Any = None
        if self._simple is None:
            plain = dict(schema)
            cls = jsonschema.validators.validator_for(plain)
            cls.check_schema(plain)
            self._validator = cls(plain)

    def check(self, instance: Any) -> None:
        """Raises :class:`SchemaMismatch` (with the best-matching error) on a mismatch."""
        if self._simple is not None:  # {"type": "object"} and the like: no validator needed
            if not isinstance(instance, self._simple):
                raise SchemaMismatch("(root)", f"{instance!r} is not of type {self._kind!r}")
            return
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(instance))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise SchemaMismatch(where, error.message)


@dataclass(frozen=True, slots=True)
class CapabilitySchemas:
    """The compiled input and output schemas of one capability (None: no schema)."""

    input: CompiledSchema | None = None
    output: CompiledSchema | None = None


def compile_schemas(
    input_schema: Mapping[str, Any] | None, output_schema: Mapping[str, Any] | None
) -> CapabilitySchemas:
    return CapabilitySchemas(
        input=CompiledSchema(input_schema) if input_schema else None,
        output=CompiledSchema(output_schema) if output_schema else None,
    )
