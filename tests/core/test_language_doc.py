"""docs/language.md stays true to the code: its manifests validate, and it names every
field, rule id and error class the code has."""

from __future__ import annotations

import re
import textwrap

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
INVALID = re.compile(
    r"<!-- invalid: ([a-z, -]+) -->\n+```yaml\n(.*?)```(?:\n+```\n(.*?)```)?", re.S
)
"""A block marked as an error example: ``<!-- invalid: RULE[, RULE] -->`` on the line
before it, and, in a plain block right after it, what ``validate`` prints for it."""
MARKED = {found[2]: found for found in INVALID.finditer(DOC)}


def test_the_doc_has_whole_manifests() -> None:
    assert len(MANIFESTS) >= 2


@pytest.mark.parametrize("block", MANIFESTS, ids=[f"manifest-{i}" for i in range(len(MANIFESTS))])
def test_every_whole_manifest_in_the_doc_validates(block: str) -> None:
    """...or is an error example that fails with the rules it is marked with, printing
    what the page shows."""
    marked = MARKED.get(block)
    shown = (marked[3] or "").splitlines() if marked else []
    path = shown[0].split(":", 1)[0] if shown else "docs/language.md"
    compiled = compile_sources([(path, block)])
    if marked is None:
        assert compiled.diagnostics == []
        return
    assert {d.rule for d in compiled.diagnostics} == {r.strip() for r in marked[1].split(",")}
    if shown:
        assert [str(d) for d in compiled.diagnostics] == shown


def test_the_doc_has_an_error_example_and_marks_only_blocks_it_has() -> None:
    assert MARKED
    assert all(block in BLOCKS for block in MARKED)


STATE_KEYS = {f.encode_name for f in msgspec.structs.fields(model.State)}
CONTEXT = {"unknown-goto", "unreachable-state", "no-terminal-path", "unknown-state-ref"}
"""What a fragment may break for want of the manifest around it: a ``goto`` or a
``$.states`` reference to a state it leaves out, states it does not connect."""
HEAD = "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: frag}\nspec:\n"
DONE = "    done: {type: terminal}\n"


def in_a_manifest(block: str) -> tuple[str, set[str]]:
    """A fragment (``states:``, a state's fields, states by name, an ``on`` list) in a
    manifest as a reader would paste it, and the rules its missing context may break."""
    keys = re.findall(r"^([A-Za-z_][\w.-]*):", block, re.M)
    if block.startswith("- "):  # an `on` list
        on = textwrap.indent(block, "        ")
        return f"{HEAD}  initial_state: s\n  states:\n    s:\n      on:\n{on}{DONE}", CONTEXT
    if keys[0] == "states":  # all the states: they must connect among themselves
        first = re.search(r"^  ([\w-]+):", block, re.M)
        assert first is not None
        indented = textwrap.indent(block, "  ")
        return f"{HEAD}  initial_state: {first[1]}\n{indented}", {"unknown-state-ref"}
    if set(keys) <= STATE_KEYS:  # one state's fields
        fields = textwrap.indent(block, "      ")
        return f"{HEAD}  initial_state: s\n  states:\n    s:\n{fields}{DONE}", CONTEXT
    states = textwrap.indent(block, "    ")  # states by name
    return f"{HEAD}  initial_state: {keys[0]}\n  states:\n{states}{DONE}", CONTEXT


FRAGMENTS = [b for b in BLOCKS if b not in MANIFESTS and not b.startswith("spec:")]


@pytest.mark.parametrize("block", FRAGMENTS, ids=[f"fragment-{i}" for i in range(len(FRAGMENTS))])
def test_every_fragment_validates_in_a_manifest(block: str) -> None:
    """A fragment of a state machine breaks no rule but those its missing context makes
    it break (or is marked as an error example, and breaks those it is marked with)."""
    manifest, context = in_a_manifest(block)
    rules = {d.rule for d in compile_sources([("docs/language.md", manifest)]).diagnostics}
    marked = MARKED.get(block)
    expected = {r.strip() for r in marked[1].split(",")} if marked else set()
    assert rules - context == expected, manifest


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
