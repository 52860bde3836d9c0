"""Files of every format that nobody wrote for these tests: each seed example with parts
replaced by values of the wrong shape is refused with diagnostics, never a crash."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.core.compiler import compile_sources
from interlock.core.source import load_documents
from interlock.dialects import prepare
from interlock.dialects.jsonpos import load_json
from support.dialects import FIXTURES

EXAMPLES = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".json", ".yaml"))


def _data(path: Any) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        doc, _ = load_json(text, path.name)
    else:
        (doc,), _ = load_documents(text, path.name)
    assert doc is not None
    return doc.data


ORIGINALS = [(p.name.split("-")[0], _data(p)) for p in EXAMPLES]
ODD = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["$terminal", "input.x ==", "{{ a.b }}", "steps.a.output", "done"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _places(item, (*path, i))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mangled_example_gets_diagnostics_not_a_crash(data: st.DataObject) -> None:
    dialect, original = data.draw(st.sampled_from(ORIGINALS))
    mangled = json.loads(json.dumps(original))
    for _ in range(data.draw(st.integers(1, 3))):
        places = [p for p in _places(mangled) if p]
        if not places:
            break
        place = data.draw(st.sampled_from(places))
        parent = mangled
        for key in place[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and data.draw(st.booleans()):
            del parent[place[-1]]
        else:
            parent[place[-1]] = data.draw(ODD)
    prepared = prepare([("mangled", json.dumps(mangled, indent=1))], dialect)
    compile_sources(prepared.sources, documents=[*prepared.documents, *prepared.agents])
    assert not [d for d in prepared.diagnostics if d.rule.endswith(".unreadable")]
