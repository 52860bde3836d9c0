"""Every ``pattern`` of the OpenAPI document admits no string that the gateway, which reads
the same pattern with Python's ``re``, refuses: a caller (or schemathesis, tests/gateway/
test_openapi.py) checking a value against the document in ECMA regex terms must not get a
400 for it. ``\\s`` was such a class: ECMA's leaves out U+001C-U+001F and U+0085, Python's
takes them in, so ``waiting=timer:\\x1c`` passed the document and was refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.gateway.openapi import document

jsonschema_rs = pytest.importorskip("jsonschema_rs")

UNUSUAL = [
    *map(chr, range(0x21)),
    *map(chr, range(0x7F, 0xA1)),
    *map(chr, (0x1680, 0x180E, *range(0x2000, 0x200C), 0x2028, 0x2029, 0x202F, 0x205F)),
    *map(chr, (0x3000, 0xFEFF, 0x212A)),  # the last: KELVIN SIGN, K when case is folded
    "é",
    "\u0661",  # ARABIC-INDIC DIGIT ONE: a digit to Python's \d, not to ECMA's
    "\u01c5",
    "ß",
    "_",
    "-",
    ".",
    ":",
    "/",
]
"""Characters where regex dialects differ (controls, Unicode spaces, digits and letters
beyond ASCII), put in place of one character of a string the pattern matches."""


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


PATTERNS = sorted(set(_patterns(document())))


def test_the_document_has_patterns() -> None:
    assert any("timer" in p for p in PATTERNS), PATTERNS


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=30, deadline=None, database=None)
@given(data=st.data())
def test_what_the_document_admits_the_gateway_admits(pattern: str, data: st.DataObject) -> None:
    ecma = jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
    python = re.compile(pattern)
    valid = data.draw(st.from_regex(pattern, fullmatch=True))
    for i in {0, len(valid) // 2, max(len(valid) - 1, 0)}:
        for char in UNUSUAL:
            value = valid[:i] + char + valid[i + 1 :]
            if ecma.is_valid(value):
                assert python.search(value), (pattern, value)
