"""YAML documents with the position of every key and value.

PyYAML's composer gives a node tree with marks; we turn it into plain Python values plus a
map from a value's path (``("spec", "states", "review", "on", 0, "goto")``) to its line and
column, so every later error can point at the exact place. Duplicate keys, which PyYAML
silently merges, are reported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from interlock.core.diagnostics import Diagnostic

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Span:
    """Where a scalar or collection starts (1-based), and how a scalar was written."""

    line: int
    col: int
    style: str | None = None  # None plain, "'" or '"' quoted, "|" or ">" block
    content_col: int = 0
    """For a block scalar: the column its content starts at (its indentation + 1)."""


@dataclass(slots=True)
class Document:
    """One YAML document of a file: its value and where each part of it stands."""

    path: str
    index: int
    data: Any
    values: dict[Path, Span] = field(default_factory=dict)
    keys: dict[Path, Span] = field(default_factory=dict)
    start: Span = field(default_factory=lambda: Span(1, 1))

    def where(self, path: Path, *, key: bool = False) -> Span:
        """The closest known position for ``path`` (falls back to its parents)."""
        table = self.keys if key else self.values
        probe = path
        while probe:
            if probe in table:
                return table[probe]
            if probe in self.values:
                return self.values[probe]
            probe = probe[:-1]
        return self.values.get((), self.start)

    def diag(self, path: Path, rule: str, message: str, *, key: bool = False) -> Diagnostic:
        span = self.where(path, key=key)
        return Diagnostic(self.path, span.line, span.col, rule, message)


class _Loader(yaml.SafeLoader):
    """YAML 1.2 core-schema scalars: only true/false are booleans (``on:`` stays a key
    named "on", ``yes`` stays a string) and timestamps stay strings."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _span(node: yaml.Node) -> Span:
    style = node.style if isinstance(node, yaml.ScalarNode) else None
    mark = node.start_mark
    content_col = 0
    if style in ("|", ">") and isinstance(mark.buffer, str):
        # The content starts on the next line, indented: measure that indentation.
        newline = mark.buffer.find("\n", mark.pointer)
        if newline >= 0:
            rest = mark.buffer[newline + 1 :]
            content_col = len(rest) - len(rest.lstrip(" ")) + 1
    return Span(mark.line + 1, mark.column + 1, style or None, content_col)


class _Builder:
    def __init__(self, doc: Document, errors: list[Diagnostic]) -> None:
        self.doc = doc
        self.errors = errors
        self.constructor = _Loader("")

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.values[path] = _span(node)
        if isinstance(node, yaml.MappingNode):
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.errors.append(self._at(key_node, "wrong-type", "a key must be a scalar"))
                    continue
                # Keys are names: keep the text as written (``on``, ``1`` and ``null`` too).
                key = key_node.value
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.errors.append(
                        self._at(key_node, "unsupported", "merge keys (<<) are not supported")
                    )
                    continue
                if key in result:
                    first = self.doc.keys.get((*path, key))
                    where = f" (first defined at line {first.line})" if first else ""
                    self.errors.append(
                        self._at(key_node, "duplicate-key", f"duplicate key {key!r}{where}")
                    )
                    continue
                self.doc.keys[(*path, key)] = _span(key_node)
                result[key] = self.build(value_node, (*path, key))
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.constructor.construct_object(node, deep=True)

    def _at(self, node: yaml.Node, rule: str, message: str) -> Diagnostic:
        span = _span(node)
        return Diagnostic(self.doc.path, span.line, span.col, rule, message)


def load_documents(text: str, path: str) -> tuple[list[Document], list[Diagnostic]]:
    """Parse every YAML document in ``text``; errors carry ``path`` and a position."""
    documents: list[Document] = []
    errors: list[Diagnostic] = []
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or str(exc)
        errors.append(Diagnostic(path, line, col, "yaml-syntax", problem))
        return documents, errors
    except yaml.YAMLError as exc:
        errors.append(Diagnostic(path, 1, 1, "yaml-syntax", str(exc)))
        return documents, errors
    for index, node in enumerate(nodes):
        if node is None or (
            isinstance(node, yaml.ScalarNode)
            and node.tag == "tag:yaml.org,2002:null"
            and node.value in ("", "~", "null")
        ):
            continue  # an empty document (a trailing '---'): nothing to check
        doc = Document(path=path, index=index, data=None, start=_span(node))
        try:
            doc.data = _Builder(doc, errors).build(node, ())
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            errors.append(Diagnostic(path, line, col, "yaml-syntax", exc.problem or str(exc)))
            continue
        documents.append(doc)
    return documents, errors
