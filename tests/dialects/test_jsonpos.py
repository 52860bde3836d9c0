"""The JSON loader keeps positions as the YAML one does, and is strict JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.core.source import MAX_BYTES
from interlock.dialects.jsonpos import MAX_DEPTH, load_json

TEXT = '{\n  "name": "release",\n  "steps": [\n    {"id": "build", "n": 1.5e3}\n  ]\n}\n'


def test_positions_of_values_and_keys() -> None:
    doc, errors = load_json(TEXT, "r.json")
    assert not errors
    assert doc is not None
    assert doc.data == json.loads(TEXT)
    assert (doc.values[("name",)].line, doc.values[("name",)].col) == (2, 11)
    assert (doc.keys[("steps",)].line, doc.keys[("steps",)].col) == (3, 3)
    assert (doc.values[("steps", 0, "id")].line, doc.values[("steps", 0, "id")].col) == (4, 12)
    assert doc.diag(("steps", 0, "n"), "r", "m").col == 26


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": 1,}', "1:9"),
        ('{"a": [1 2]}', "1:10"),
        ("[1, 2", "1:6"),
        ('{"a": NaN}', "1:7"),
        ('{"a": 1} x', "1:10"),
        ("{'a': 1}", "1:2"),
    ],
)
def test_syntax_errors_have_positions(text: str, where: str) -> None:
    doc, errors = load_json(text, "f.json")
    assert doc is None
    assert [f"{e.line}:{e.col}" for e in errors] == [where]
    assert errors[0].rule == "json-syntax"


def test_duplicate_keys_are_errors_and_the_first_is_kept() -> None:
    doc, errors = load_json('{"a": 1,\n "a": 2}', "f.json")
    assert doc is not None
    assert doc.data == {"a": 1}
    assert [str(e) for e in errors] == [
        "f.json:2:2: duplicate-key: duplicate key 'a' (first defined at line 1)"
    ]


def test_nesting_is_bounded() -> None:
    doc, errors = load_json("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5), "f.json")
    assert doc is None
    assert "nested deeper" in errors[0].message
    assert errors[0].rule == "json-limit"


def test_size_is_bounded() -> None:
    doc, errors = load_json("[" + "1," * (MAX_BYTES // 2) + "1]", "f.json")
    assert doc is None
    assert errors[0].rule == "json-limit"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(JSON)
def test_reads_what_the_standard_library_writes(value: object) -> None:
    for indent in (None, 2):
        doc, errors = load_json(json.dumps(value, indent=indent), "f.json")
        assert not errors
        assert doc is not None
        assert doc.data == value
