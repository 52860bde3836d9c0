"""Checking an answer against its capability's output_schema: the shortcut for schemas that
are only a type agrees with jsonschema, value for value and message for message."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.runtime.schemas import CompiledSchema, SchemaMismatch

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
SCHEMAS = [
    {"type": "object"},
    {"type": "array"},
    {"type": "string"},
    {"type": "boolean"},
    {"type": "integer"},  # not a shortcut: jsonschema decides
    {"type": ["string", "null"]},
    {"type": "object", "required": ["score"]},
]


def outcome(check: Any, instance: Any, schema: dict[str, Any]) -> str | None:
    try:
        check(instance, schema)
    except jsonschema.ValidationError as exc:
        return exc.message
    except SchemaMismatch as exc:
        return exc.message
    return None


def compiled(instance: Any, schema: dict[str, Any]) -> None:
    CompiledSchema(schema).check(instance)


@pytest.mark.parametrize("schema", SCHEMAS, ids=str)
@given(instance=JSON)
def test_the_shortcut_agrees_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    assert outcome(compiled, instance, schema) == outcome(jsonschema.validate, instance, schema)
