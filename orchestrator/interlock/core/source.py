"""YAML documents with the position of every key and value.

PyYAML's composer gives a node tree with marks; we turn it into plain Python values plus a
map from a value's path (``("spec", "states", "review", "on", 0, "goto")``) to its line and
column, so every later error can point at the exact place. Duplicate keys, which PyYAML
silently merges, are reported here.

A manifest may come from anyone allowed to apply one, so the loader bounds what a file may
cost before building anything: its size (``MAX_BYTES``), how deep it nests (``MAX_DEPTH``,
checked while composing, before PyYAML's recursive composer could overflow the stack) and
how many values it expands to once aliases are followed (``MAX_VALUES``: a "billion laughs"
file of a few hundred bytes is refused without expanding it). Each breaks rule
``yaml-limit``.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from interlock.core.bounds import MAX_DEPTH as BOUND_DEPTH
from interlock.core.diagnostics import Diagnostic
from interlock.core.rfc3339 import format_time

Path = tuple[str | int, ...]

MERGE_REFUSED = "merge keys (<<) are not supported"
"""Why a native document's merge key is refused."""
MAX_BYTES = 512 * 1024
"""Largest manifest file accepted (a stored workflow must fit in one NATS message)."""
MAX_DEPTH = BOUND_DEPTH
"""Deepest nesting of mappings and sequences accepted."""
MAX_VALUES = 500_000
"""Most values a document may expand to, aliases followed (a file of ``MAX_BYTES`` written
without aliases stays below it)."""


@dataclass(frozen=True, slots=True)
class Span:
    """Where a scalar or collection starts (1-based), and how a scalar was written."""

    line: int
    col: int
    style: str | None = None  # None plain, "'" or '"' quoted, "|" or ">" block
    content_col: int = 0
    """For a block scalar: the column its content starts at (its indentation + 1)."""
    raw: str | None = field(default=None, compare=False)
    """For a quoted scalar written on one line with an escape (``\\n``, ``\\x41``) or a
    doubled quote (``''``): its text between the quotes as written, where a place in its
    value is found (an escape is one character of the value, two or more of the file).
    For a block scalar: its lines as written, indentation included (from the line after
    its ``|`` or ``>``), where a template on any of its lines is found."""
    across: str | None = field(default=None, compare=False)
    """For a plain or quoted scalar written across lines: its text as written (between
    the quotes), from its first character to its last, where a place in its value is
    found (YAML folds its line breaks and indentation into spaces)."""


@dataclass(slots=True)
class Document:
    """One YAML document of a file: its value and where each part of it stands."""

    path: str
    index: int
    data: Any
    values: dict[Path, Span] = field(default_factory=dict)
    keys: dict[Path, Span] = field(default_factory=dict)
    start: Span = field(default_factory=lambda: Span(1, 1))
    text: str = ""
    """The document as written: its lines, with the comments above it and in it (not the
    ``---`` that begins it)."""
    partial: bool = False
    """Whole objects of it were left out so the rest decodes (a list item or a state the
    schema refused): only the errors of the expressions left are worth reporting beside
    the schema's (the other rules would read the gaps as errors of their own)."""
    merges: list[Span] = field(default_factory=list)
    """Where its merge keys (``<<``) are, when it was read with them merged (the files of
    the formats whose YAML takes them: see :func:`load_documents`)."""

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


class _TooDeep(yaml.MarkedYAMLError):
    """Nesting beyond ``MAX_DEPTH``, raised while composing."""


class _Loader(yaml.SafeLoader):
    """YAML 1.2 core-schema scalars: only true/false are booleans (``on:`` stays a key
    named "on", ``yes`` stays a string) and timestamps stay strings. Nesting is bounded."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self._depth >= MAX_DEPTH:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise _TooDeep(problem=f"nesting deeper than {MAX_DEPTH} levels", problem_mark=mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded (memoised by node
    identity, so a graph of shared nodes costs its distinct nodes only)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    total = 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            total += _expanded_size(key_node, sizes) + _expanded_size(value_node, sizes)
            if total > MAX_VALUES:
                break
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += _expanded_size(item, sizes)
            if total > MAX_VALUES:
                break
    sizes[id(node)] = total
    return total


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
    raw = None
    if style in ("|", ">") and isinstance(mark.buffer, str):
        # The content starts on the next line, indented: measure that indentation.
        newline = mark.buffer.find("\n", mark.pointer)
        if newline >= 0:
            rest = mark.buffer[newline + 1 :]
            content_col = len(rest) - len(rest.lstrip(" ")) + 1
            raw = mark.buffer[newline + 1 : node.end_mark.pointer]
    if style in ("'", '"') and isinstance(mark.buffer, str) and node.end_mark.line == mark.line:
        written = mark.buffer[mark.pointer + 1 : node.end_mark.pointer - 1]
        if ("\\" if style == '"' else "''") in written:
            raw = written
    across = None
    if (
        isinstance(node, yaml.ScalarNode)
        and style in (None, "'", '"')
        and node.end_mark.line != mark.line
        and isinstance(mark.buffer, str)
    ):
        lead = 0 if style is None else 1
        across = mark.buffer[mark.pointer + lead : node.end_mark.pointer - lead]
    return Span(mark.line + 1, mark.column + 1, style or None, content_col, raw, across)


def _timestamp_text(value: datetime.date) -> str:
    """An explicit ``!!timestamp`` as the RFC 3339 text JSON carries it (a manifest's values
    are JSON; YAML's implicit timestamps stay the strings they are written as): a date as
    ``2026-01-01``, a time with its offset as written, one without any in UTC (``Z``), as
    YAML reads it."""
    if not isinstance(value, datetime.datetime):
        return value.isoformat()
    return format_time(value, "auto", utc=value.tzinfo is None)


class _Builder:
    def __init__(self, doc: Document, errors: list[Diagnostic], *, merge: bool = False) -> None:
        self.doc = doc
        self.errors = errors
        self.constructor = _Loader("")
        self.merge = merge

    def build(self, node: yaml.Node, path: Path) -> Any:
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        self.doc.values[path] = _span(node)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node)

    def _merged(self, node: yaml.MappingNode, path: Path) -> dict[Any, Any]:
        """What the merge keys of ``node`` bring in (an earlier source wins over a later
        one, as YAML's merge says), each value where its anchor wrote it."""
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge" or not self.merge:
                continue  # refused in its place among the keys, without merging
            self.doc.merges.append(_span(key_node))
            sources = (
                value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            )
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    self.errors.append(
                        self._at(
                            source,
                            "wrong-type",
                            "a merge key (<<) takes a mapping or a list of them",
                        )
                    )
                    continue
                for key, value in self._mapping(source, path).items():
                    result.setdefault(key, value)
        return result

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[Any, Any]:
        result = self._merged(node, path)
        inherited = set(result)
        self.doc.values[path] = _span(node)
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                if not self.merge:
                    self.errors.append(self._at(key_node, "unsupported", MERGE_REFUSED))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(self._at(key_node, "wrong-type", "a key must be a scalar"))
                continue
            # Keys are names: keep the text as written (``on``, ``1`` and ``null`` too).
            key = key_node.value
            if key in result and key not in inherited:
                first = self.doc.keys.get((*path, key))
                where = f" (first defined at line {first.line})" if first else ""
                self.errors.append(
                    self._at(key_node, "duplicate-key", f"duplicate key {key!r}{where}")
                )
                continue
            inherited.discard(key)  # written here: it wins over what a merge brought
            self.doc.keys[(*path, key)] = _span(key_node)
            result[key] = self.build(value_node, (*path, key))
        return result

    def _scalar(self, node: yaml.Node) -> Any:
        try:
            value = self.constructor.construct_object(node, deep=True)
        except (ValueError, KeyError, AttributeError) as exc:
            # A scalar its explicit tag cannot read (``!!int many``, ``!!bool maybe``,
            # ``!!timestamp soon``): PyYAML's constructors fail with Python's own errors.
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is not a valid {tag}", node.start_mark
            ) from exc
        if isinstance(value, datetime.date):
            return _timestamp_text(value)
        return value

    def _at(self, node: yaml.Node, rule: str, message: str) -> Diagnostic:
        span = _span(node)
        return Diagnostic(self.doc.path, span.line, span.col, rule, message)


def too_large(path: str, size: int, *, at_least: bool = False) -> Diagnostic:
    """The diagnostic for a file beyond ``MAX_BYTES`` (``at_least``: a stream, read only
    up to the limit)."""
    more = "more than " if at_least else ""
    return Diagnostic(
        path,
        1,
        1,
        "yaml-limit",
        f"the file has {more}{size - 1 if at_least else size:,} bytes; "
        f"at most {MAX_BYTES:,} are accepted",
    )


def _written(text: str, begin: int, node: yaml.Node) -> str:
    """A document's text: from where the one before it ended (its comments above it
    included) to its own end, without the ``---`` line (or directives) that begin it."""
    lines = text[begin : node.end_mark.index].splitlines(keepends=True)
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith(("---", "%", "..."))):
        lines.pop(0)
    return "".join(lines)


def load_documents(
    text: str, path: str, *, merge: bool = False
) -> tuple[list[Document], list[Diagnostic]]:
    """Parse every YAML document in ``text``; errors carry ``path`` and a position.

    ``merge``: take merge keys (``<<: *defaults``), as the YAML readers of the formats
    loaded as written do (Kubernetes' for ctxmesh); the native language refuses them."""
    documents: list[Document] = []
    errors: list[Diagnostic] = []
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > MAX_BYTES else 0
    if size > MAX_BYTES:
        errors.append(too_large(path, size))
        return documents, errors
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except _TooDeep as exc:
        mark = exc.problem_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        errors.append(Diagnostic(path, line, col, "yaml-limit", exc.problem or str(exc)))
        return documents, errors
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or str(exc)
        errors.append(Diagnostic(path, line, col, "yaml-syntax", problem))
        return documents, errors
    except yaml.YAMLError as exc:
        errors.append(Diagnostic(path, 1, 1, "yaml-syntax", str(exc)))
        return documents, errors
    begin = 0
    for index, node in enumerate(nodes):
        if node is not None:
            written, begin = _written(text, begin, node), node.end_mark.index
        if node is None or (
            isinstance(node, yaml.ScalarNode)
            and node.tag == "tag:yaml.org,2002:null"
            and node.value in ("", "~", "null")
        ):
            continue  # an empty document (a trailing '---'): nothing to check
        if _expanded_size(node, {}) > MAX_VALUES:
            span = _span(node)
            errors.append(
                Diagnostic(
                    path,
                    span.line,
                    span.col,
                    "yaml-limit",
                    f"the document expands to more than {MAX_VALUES:,} values "
                    "(aliases repeat what they point at)",
                )
            )
            continue
        doc = Document(path=path, index=index, data=None, start=_span(node), text=written)
        try:
            doc.data = _Builder(doc, errors, merge=merge).build(node, ())
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            errors.append(Diagnostic(path, line, col, "yaml-syntax", exc.problem or str(exc)))
            continue
        documents.append(doc)
    return documents, errors


_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}


def written_offset(raw: str, style: str | None, line: int, col: int) -> int:
    """Where in ``raw``, a quoted scalar's text as written on one line, the value's
    ``line``/``col`` stands. The value's lines are only those its ``\\n`` escapes make; on
    the line asked for, ``col`` counts characters of the value (a template's offset may
    run past its line's end)."""
    at, current, left = 0, 1, col - 1
    while at < len(raw) and (current < line or left > 0):
        newline = False
        if style == '"' and raw[at] == "\\":
            code = raw[at + 1 : at + 2]
            width = 2 + _ESCAPE_DIGITS.get(code, 0)
            newline = code == "n"
        elif style == "'" and raw.startswith("''", at):
            width = 2
        else:
            width = 1
        at += width
        if current < line:
            current += newline
        else:
            left -= 1
    return at


def position_in(span: Span, value: str, offset: int) -> tuple[int, int]:
    """Where in the file (line, column) the character at ``offset`` of a scalar's
    ``value`` is written, for a scalar that starts at ``span``: one written on one line
    (its escapes counted as written), a block scalar, or one written across lines (YAML
    folds their line breaks and indentation: the value's other characters are the
    text's, in order)."""
    quoted = span.style in ("'", '"')
    text = span.raw if span.style in ("|", ">") else span.across
    if text is None:
        if quoted and span.raw is not None:
            return span.line, span.col + 1 + written_offset(span.raw, span.style, 1, offset + 1)
        return span.line, span.col + (1 if quoted else 0) + offset
    line, col = (span.line + 1, 1) if span.style in ("|", ">") else (span.line, span.col)
    col += 1 if quoted else 0
    wanted = sum(1 for c in value[:offset] if not c.isspace())
    at = len(text)
    for i, c in enumerate(text):
        if not c.isspace():
            if wanted == 0:
                at = i
                break
            wanted -= 1
    before = text[:at]
    if "\n" not in before:
        return line, col + at
    return line + before.count("\n"), at - before.rfind("\n")
