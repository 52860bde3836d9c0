"""What a manifest lowers to, pinned whole: every field of the definition the engine runs
(states, actions, retries, transitions, catches, timers, maps, parallel branches, loops,
DAGs, gates, triggers, inputs, correlation, the deadline, the budget), written out as JSON
in tests/core/lowered. ``every-part.yaml`` declares each part with values other than its
defaults; the golden workflows and a zynax.io/v1 manifest are lowered as they are. A change
to what lowering produces is a visible, reviewed change of a file there, re-recorded with

    .venv/bin/python tests/core/test_lowering_pinned.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition
from interlock.core.expr import Expression

HERE = Path(__file__).resolve().parent
PINNED = HERE / "lowered"
ROOT = HERE.parents[1]
CASES = {
    # name: the manifest, from the repository's root
    "every-part": "tests/core/lowered/every-part.yaml",
    "code-review": "tests/golden/code-review.yaml",
    "control-flow": "tests/golden/control-flow/control-flow.yaml",
    "constructs": "tests/golden/constructs/constructs.yaml",
    "zynax-code-review": "tests/core/manifests/valid/zynax-code-review.yaml",
}


def plain(value: Any) -> Any:
    """A definition as JSON values: a dataclass as its class name and its fields, a CEL
    expression as its source and the names it reads, a set sorted."""
    if isinstance(value, Expression):
        return {"cel": value.source, "reads": sorted(value.names)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **fields}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(plain(v) for v in value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def lowered(name: str) -> Any:
    """The one workflow of a case's manifest, lowered (the manifest itself and its source
    text left out: they are the file)."""
    path = ROOT / CASES[name]
    compiled = compile_sources([(path.name, path.read_text())])
    compiled.raise_for_errors()
    (definition,) = compiled.workflows
    assert isinstance(definition, Definition)
    out = plain(dataclasses.replace(definition, manifest={}))
    del out["source"]
    return out


def test_each_workflow_keeps_its_document_as_written() -> None:
    first = "# the first\napiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: a}\n"
    first += "spec:\n  initial_state: s\n  states:\n    s: {type: terminal}  # ends\n"
    second = (ROOT / CASES["code-review"]).read_text()
    compiled = compile_sources([("two.yaml", first + "---\n" + second + "...\n")])
    compiled.raise_for_errors()
    assert [d.source for d in compiled.workflows] == [first, second]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_manifest_lowers_to_what_it_did(name: str) -> None:
    pinned = json.loads((PINNED / f"{name}.json").read_text())
    assert lowered(name) == pinned


def test_the_hash_ignores_key_order_and_sees_every_value() -> None:
    text = (ROOT / CASES["every-part"]).read_text()
    reordered = text.replace(
        "metadata: {name: full, namespace: team-a, version: 3}",
        "metadata: {version: 3, namespace: team-a, name: full}",
    )
    changed = text.replace("max_iterations: 3", "max_iterations: 4")
    assert reordered != text
    assert changed != text
    hashes = []
    for variant in (text, reordered, changed):
        compiled = compile_sources([("every-part.yaml", variant)])
        compiled.raise_for_errors()
        hashes.append(compiled.workflows[0].spec_hash)
    assert hashes[0] == hashes[1] != hashes[2]
    assert hashes[0].startswith("sha256:")
    assert len(hashes[0]) == len("sha256:") + 64


def test_a_value_json_has_no_type_for_is_hashed_too() -> None:
    # YAML's !!binary gives bytes; an ``x-`` key may hold anything.
    text = (ROOT / CASES["every-part"]).read_text()
    hashes = []
    for blob in ("aGk=", "aGo="):
        variant = text.replace("kind: Workflow\n", f"kind: Workflow\nx-blob: !!binary {blob}\n")
        compiled = compile_sources([("every-part.yaml", variant)])
        compiled.raise_for_errors()
        hashes.append(compiled.workflows[0].spec_hash)
    assert hashes[0] != hashes[1]


def record() -> None:
    for name in sorted(CASES):
        target = PINNED / f"{name}.json"
        target.write_text(json.dumps(lowered(name), indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {target.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    record()
