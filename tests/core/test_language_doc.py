"""docs/language.md stays true to the code: its manifests validate, and it names every
field, rule id and error class the code has."""

from __future__ import annotations

import re

import msgspec
import pytest
import yaml
from test_validator import RULES

from interlock.core import model
from interlock.core.compiler import compile_sources
from interlock.core.vocabulary import ErrorClass
from support.core import ROOT

DOC = (ROOT / "docs/language.md").read_text()
BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC, re.DOTALL)
MANIFESTS = [b for b in BLOCKS if "\nkind: " in f"\n{b}"]


def test_the_doc_has_whole_manifests() -> None:
    assert len(MANIFESTS) >= 2


@pytest.mark.parametrize("block", MANIFESTS, ids=[f"manifest-{i}" for i in range(len(MANIFESTS))])
def test_every_whole_manifest_in_the_doc_validates(block: str) -> None:
    compiled = compile_sources([("docs/language.md", block)])
    assert compiled.diagnostics == []


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_every_yaml_block_in_the_doc_parses(block: str) -> None:
    compiled = compile_sources([("docs/language.md", block)])
    assert not [d for d in compiled.diagnostics if d.rule in ("yaml-syntax", "duplicate-key")]


def test_the_rules_table_lists_every_rule() -> None:
    table = set(re.findall(r"^\| `([a-z-]+)` \|", DOC.split("## Validation rules")[1], re.M))
    assert table == RULES


def test_the_error_classes_table_lists_every_class() -> None:
    section = DOC.split("## Error classes")[1].split("\n## ")[0]
    table = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert table == list(ErrorClass)


def _field_names(cls: type, seen: set[type]) -> set[str]:
    if cls in seen:
        return set()
    seen.add(cls)
    names: set[str] = set()
    for field in msgspec.structs.fields(cls):
        names.add(field.encode_name)
        for inner in _structs_in(field.type):
            names |= _field_names(inner, seen)
    return names


def _structs_in(annotation: object) -> list[type]:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return [annotation]
    out: list[type] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_structs_in(arg))
    origin = getattr(annotation, "__origin__", None)
    if origin is not None and origin is not annotation:
        out.extend(_structs_in(origin))
    return out


@pytest.mark.parametrize("kind", ["Workflow", "AgentDef"])
def test_the_doc_names_every_field(kind: str) -> None:
    # a field may be named alone (`goto`) or in a dotted path (`backoff.initial`)
    prose = re.sub(r"```.*?```", "", DOC, flags=re.DOTALL)
    codes = re.findall(r"`([^`]+)`", prose)
    written = {part for code in codes for part in re.split(r"[.\[\]]", code)}
    missing = sorted(name for name in _field_names(model.KINDS[kind], set()) if name not in written)
    assert missing == []


def test_the_doc_names_every_input_type() -> None:
    for type_name in ("string", "integer", "number", "boolean", "object", "list", "any"):
        assert f"`{type_name}`" in DOC


SNIPPETS = [b for b in BLOCKS if b.startswith("spec:")]
PLACEHOLDER_STATES = {
    "s": {"type": "human_in_the_loop", "on": [{"event": "go", "goto": "done"}]},
    "done": {"type": "terminal"},
}


@pytest.mark.parametrize("block", SNIPPETS, ids=[f"spec-{i}" for i in range(len(SNIPPETS))])
def test_every_spec_snippet_validates_in_a_manifest(block: str) -> None:
    """A ``spec:`` snippet (a trigger's debounce, a rate, fair-share concurrency, history
    limits, a capability's limits), pasted into a manifest as a reader would, validates;
    only a ``goto`` naming a state the snippet leaves out may be missing."""
    spec = yaml.safe_load(block)["spec"]
    kind = "AgentDef" if "capabilities" in spec else "Workflow"
    if kind == "Workflow":
        spec.setdefault("initial_state", "s")
        spec.setdefault("states", PLACEHOLDER_STATES)
    manifest = {"apiVersion": "interlock.io/v1", "kind": kind, "metadata": {"name": "snip"}}
    compiled = compile_sources([("docs/language.md", yaml.safe_dump(manifest | {"spec": spec}))])
    assert [d for d in compiled.diagnostics if d.rule != "unknown-goto"] == []
