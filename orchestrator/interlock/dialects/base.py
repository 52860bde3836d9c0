"""What every dialect shares: a lowered document that keeps the original file's positions,
the notes a conversion writes as comments, shape checks, and CEL renaming.

A dialect reads a document of its own format (a :class:`Document` from the YAML or JSON
loader, with the position of every value), checks it with its own rules, and builds the
native manifest (``interlock.io/v1``) from it. Each part of the native manifest it builds is
tied to the part of the original it came from (:meth:`Lowering.at`), so when the native
compiler finds a problem in the lowered manifest it points at the line and column of the
original file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.expr import CompileError, Expression
from interlock.core.source import Document, Path, Span, position_in

API_VERSION = "interlock.io/v1"


@dataclass(slots=True)
class Note:
    """A decision the mapping took, written as a comment above ``path`` by ``convert``."""

    path: Path
    text: str


@dataclass(slots=True)
class Lowered:
    """One document of a dialect, lowered: the native workflow(s) and AgentDefs it implies."""

    dialect: str
    source: Document
    workflows: list[Document] = field(default_factory=list)
    agents: list[Document] = field(default_factory=list)
    notes: dict[int, list[Note]] = field(default_factory=dict)
    """Per native document (by ``id()``), the comments ``convert`` writes."""
    extra: dict[str, Any] = field(default_factory=dict)
    """What else a dialect keeps for its own commands (synapse's compiled tasks)."""
    warnings: list[Diagnostic] = field(default_factory=list)
    """What the file says that is kept but not acted on (it still loads)."""


class Lowering:
    """Builds one native document from ``src``, keeping positions and notes."""

    def __init__(self, src: Document, dialect: str) -> None:
        self.src = src
        self.dialect = dialect
        self.doc = Document(path=src.path, index=src.index, data=None, start=src.start)
        self.notes: list[Note] = []

    def at(self, native: Path, original: Path) -> None:
        """``native`` (a path in the lowered manifest) came from ``original``."""
        self.doc.values[native] = self.src.where(original)
        self.doc.keys[native] = self.src.where(original, key=True)

    def note(self, native: Path, text: str) -> None:
        self.notes.append(Note(native, text))

    def finish(self, data: dict[str, Any], lowered: Lowered) -> Document:
        self.doc.data = data
        if () not in self.doc.values:
            self.doc.values[()] = self.src.where(())
        lowered.notes[id(self.doc)] = self.notes
        return self.doc


class Checker:
    """Collects diagnostics with a dialect's own rule ids (``<dialect>.<rule>``)."""

    def __init__(self, src: Document, dialect: str, diags: list[Diagnostic]) -> None:
        self.src = src
        self.dialect = dialect
        self.diags = diags

    def error(self, path: Path, rule: str, message: str, *, key: bool = False) -> None:
        self.diags.append(self.src.diag(path, f"{self.dialect}.{rule}", message, key=key))

    def at_span(self, span: Span, rule: str, message: str) -> None:
        self.diags.append(
            Diagnostic(self.src.path, span.line, span.col, f"{self.dialect}.{rule}", message)
        )

    # -- shapes ------------------------------------------------------------------------

    def mapping(self, value: Any, path: Path, what: str) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.error(path, "wrong-type", f"{what} must be an object, got {_kind(value)}")
        return None

    def items(self, value: Any, path: Path, what: str) -> list[Any] | None:
        if isinstance(value, list):
            return value
        self.error(path, "wrong-type", f"{what} must be a list, got {_kind(value)}")
        return None

    def string(
        self,
        data: Mapping[str, Any],
        key: str,
        path: Path,
        *,
        required: bool = False,
        max_len: int | None = None,
        min_len: int = 0,
        pattern: re.Pattern[str] | None = None,
        form: str = "",
    ) -> str | None:
        if key not in data:
            if required:
                self.error(path, "missing-field", f"missing required field {key!r}")
            return None
        value = data[key]
        where = (*path, key)
        if not isinstance(value, str):
            self.error(where, "wrong-type", f"{key} must be a string, got {_kind(value)}")
            return None
        if len(value) < min_len or (max_len is not None and len(value) > max_len):
            bound = f"{min_len} to {max_len}" if max_len is not None else f"at least {min_len}"
            self.error(where, "invalid-value", f"{key} must be {bound} characters")
            return None
        if pattern is not None and not pattern.match(value):
            self.error(where, "invalid-value", f"{key} {value!r} must be {form}")
            return None
        return value

    def integer(
        self,
        data: Mapping[str, Any],
        key: str,
        path: Path,
        *,
        lo: int | None = None,
        hi: int | None = None,
        required: bool = False,
    ) -> int | None:
        if key not in data:
            if required:
                self.error(path, "missing-field", f"missing required field {key!r}")
            return None
        value = data[key]
        where = (*path, key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(where, "wrong-type", f"{key} must be an integer, got {_kind(value)}")
            return None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if hi is None:
                bound = f"at least {lo}"
            elif lo is None:
                bound = f"at most {hi}"
            else:
                bound = f"{lo} to {hi}"
            self.error(where, "invalid-value", f"{key} must be {bound}, got {value}")
            return None
        return value

    def unknown_keys(
        self,
        data: Mapping[str, Any],
        allowed: Iterable[str],
        path: Path,
        what: str,
        *,
        x_keys: bool = False,
    ) -> None:
        allowed = set(allowed)
        for key in data:
            if key in allowed or (x_keys and str(key).startswith("x-")):
                continue
            hint = ", ".join(sorted(allowed))
            self.error(
                (*path, key),
                "unknown-key",
                f"unknown key {key!r} in {what} (allowed: {hint})",
                key=True,
            )


def agent_def(
    name: str,
    capabilities: Iterable[tuple[str, str]],
    *,
    namespace: str | None = None,
    output_schemas: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The native AgentDef a converted file implies: one capability per (name, description),
    with its output JSON Schema when ``output_schemas`` has one under its name."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    declared = []
    for capability, description in capabilities:
        entry: dict[str, Any] = {"name": capability, "description": description}
        if output_schemas is not None and capability in output_schemas:
            entry["output_schema"] = output_schemas[capability]
        declared.append(entry)
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentDef",
        "metadata": metadata,
        "spec": {"capabilities": declared},
    }


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


# --- CEL --------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<string>[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
        |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


_KEYWORDS = frozenset({"true", "false", "null", "in"})
_MACRO_BINDERS = re.compile(r"\.(?:all|exists|exists_one|map|filter)\(\s*([A-Za-z_]\w*)\s*,")


@dataclass(frozen=True, slots=True)
class Name:
    """A top-level identifier of a CEL expression, with what follows it (``.a.b``)."""

    start: int
    end: int
    name: str
    fields: tuple[str, ...]
    """The field names that follow, selected (``steps.classify.output`` -> ("classify",
    "output")) or indexed by a string literal (``steps["score-batch"].output`` ->
    ("score-batch", "output"))."""
    ends: tuple[int, ...] = ()
    """Where each of ``fields`` ends in the source (after the ``]`` of an index)."""
    dynamic: bool = False
    """An index that is not a string literal follows the fields (``steps[k]``)."""


def top_level_names(source: str) -> list[Name]:
    """Identifiers that are variables (not fields after a ``.``, not function names, not
    inside string literals), each with the fields selected after it."""
    tokens = [(m.lastgroup, m.start(), m.end(), m.group(0)) for m in _TOKEN.finditer(source)]
    bound = set(_MACRO_BINDERS.findall(source))
    out: list[Name] = []
    for i, (kind, start, end, text) in enumerate(tokens):
        if kind != "ident" or text in _KEYWORDS or text in bound:
            continue
        prev = _previous(tokens, i)
        if prev is not None and prev[3] == ".":
            continue
        nxt = _next(tokens, i)
        if nxt is not None and nxt[3] == "(":
            continue  # a function: size(x), has(x)
        fields: list[str] = []
        ends: list[int] = []
        dynamic = False
        j = i
        while True:
            nxt_token = _next(tokens, j)
            if nxt_token is None or nxt_token[3] not in (".", "["):
                break
            k = tokens.index(nxt_token)
            part = _next(tokens, k)
            if nxt_token[3] == ".":
                if part is None or part[0] != "ident":
                    break
                fields.append(part[3])
                ends.append(part[2])
                j = tokens.index(part)
                continue
            key = _STRING_KEY.match(part[3]) if part is not None else None
            close = _next(tokens, tokens.index(part)) if part is not None else None
            if key is None or close is None or close[3] != "]":
                dynamic = True
                break
            fields.append(key.group(2))
            ends.append(close[2])
            j = tokens.index(close)
        out.append(Name(start, end, text, tuple(fields), tuple(ends), dynamic))
    return out


_STRING_KEY = re.compile(r"""^(['"])([^'"\\\n]*)\1$""")
"""A string literal without escapes: an index that names a field (``["score-batch"]``)."""


def _previous(tokens: list[tuple[Any, int, int, str]], i: int) -> Any:
    for j in range(i - 1, -1, -1):
        if not tokens[j][3].isspace():
            return tokens[j]
    return None


def _next(tokens: list[tuple[Any, int, int, str]], i: int) -> Any:
    for j in range(i + 1, len(tokens)):
        if not tokens[j][3].isspace():
            return tokens[j]
    return None


Rewrite = Callable[[Name, str], tuple[int, str] | None]
"""Given a top-level name, how many characters from its start to replace, and with what."""


@dataclass(slots=True)
class Cel:
    """An expression of a dialect rewritten into the native variables."""

    source: str
    native: str
    shifts: list[tuple[int, int]]
    """(position in ``native``, how many characters were added before it)."""

    def original_col(self, col: int) -> int:
        """A 1-based column in ``native`` back to ``source``."""
        added = sum(delta for pos, delta in self.shifts if pos < col - 1)
        return max(1, col - added)


def rewrite_cel(source: str, rewrite: Rewrite) -> Cel:
    """Apply ``rewrite`` to every top-level name of ``source``."""
    parts: list[str] = []
    shifts: list[tuple[int, int]] = []
    cursor = 0
    added = 0
    for name in top_level_names(source):
        change = rewrite(name, source)
        if change is None:
            continue
        length, text = change
        parts.append(source[cursor : name.start])
        parts.append(text)
        cursor = name.start + length
        added += len(text) - length
        shifts.append((name.start + added, len(text) - length))
    parts.append(source[cursor:])
    return Cel(source, "".join(parts), shifts)


def check_cel(
    cel: Cel, checker: Checker, path: Path, extra: frozenset[str] = frozenset(), *, offset: int = 0
) -> bool:
    """Compile ``cel.native``; on an error report it at its place in the original text."""
    try:
        Expression(cel.native, extra)
    except CompileError as exc:
        native_lines = cel.native.split("\n")
        at = sum(len(text) + 1 for text in native_lines[: exc.line - 1]) + exc.col - 1
        at -= sum(delta for pos, delta in cel.shifts if pos < at)  # back to the source
        at = max(0, min(at, len(cel.source)))
        span = checker.src.where(path)
        value = value_at(checker.src.data, path)
        written = value if isinstance(value, str) else cel.source
        start = offset or max(written.find(cel.source), 0)
        line, col = position_in(span, written, start + at)
        message = exc.message.replace("in CEL (known:", "(known:")
        if message.startswith("CEL does not compile: ") and exc.line <= len(native_lines):
            # celpy names the line it stopped on, as rewritten: say it as written
            source_line = cel.source.split("\n")[min(exc.line, len(cel.source.split("\n"))) - 1]
            message = f"CEL does not compile: {source_line.strip()!r}"
        checker.at_span(Span(line, col), "cel", message)
        return False
    return True


def value_at(data: Any, path: Path) -> Any:
    """The value at ``path`` of a document's data (None: not there)."""
    for part in path:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def template(expression: str) -> str:
    """A whole-string native template: the expression's value, with its type."""
    return "{{ " + expression + " }}"
