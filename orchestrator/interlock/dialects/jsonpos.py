"""JSON with the position of every key and value, as :mod:`interlock.core.source` gives
for YAML.

The standard library's decoder keeps no positions, so this is a small recursive-descent
reader that uses the standard library's own string and number scanners (``json.decoder``)
for the tokens, and records where each value and key starts. It is strict JSON (RFC 8259):
no comments, no trailing commas, no ``NaN``; a duplicate key is an error, as in the YAML
loader. Size and nesting have the YAML loader's bounds (``MAX_BYTES``, ``MAX_DEPTH``), so a
hostile file costs little (rule ``json-limit``).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from bisect import bisect_right
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import MAX_BYTES, MAX_DEPTH, Document, Path, Span

_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009 (untyped in typeshed)
_WS = " \t\n\r"


class _Error(Exception):
    def __init__(self, pos: int, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


class _Limit(_Error):
    pass


class _Reader:
    def __init__(self, text: str, doc: Document, errors: list[Diagnostic]) -> None:
        self.text = text
        self.doc = doc
        self.errors = errors
        self.lines = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def span(self, pos: int, style: str | None = None) -> Span:
        line = bisect_right(self.lines, pos)
        return Span(line, pos - self.lines[line - 1] + 1, style)

    def skip(self, pos: int) -> int:
        text = self.text
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        return pos

    def value(self, pos: int, path: Path, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise _Limit(pos, f"nested deeper than {MAX_DEPTH} levels")
        text = self.text
        if pos >= len(text):
            raise _Error(pos, "expected a value, got the end of the file")
        char = text[pos]
        if char == "{":
            self.doc.values[path] = self.span(pos)
            return self.object(pos + 1, path, depth)
        if char == "[":
            self.doc.values[path] = self.span(pos)
            return self.array(pos + 1, path, depth)
        if char == '"':
            self.doc.values[path] = self.span(pos, '"')
            return self.string(pos)
        for word, literal in (("true", True), ("false", False), ("null", None)):
            if text.startswith(word, pos):
                self.doc.values[path] = self.span(pos)
                return literal, pos + len(word)
        match = json.scanner.NUMBER_RE.match(text, pos)
        if match and match.group(0):
            integer, fraction, exponent = match.groups()
            self.doc.values[path] = self.span(pos)
            if fraction or exponent:
                return float(integer + (fraction or "") + (exponent or "")), match.end()
            return int(integer), match.end()
        raise _Error(pos, f"expected a value, got {text[pos]!r}")

    def string(self, pos: int) -> tuple[str, int]:
        try:
            value, end = _scanstring(self.text, pos + 1, True)
        except json.JSONDecodeError as exc:
            raise _Error(exc.pos, exc.msg) from exc
        return str(value), int(end)

    def object(self, pos: int, path: Path, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        pos = self.skip(pos)
        if pos < len(self.text) and self.text[pos] == "}":
            return out, pos + 1
        while True:
            pos = self.skip(pos)
            if pos >= len(self.text) or self.text[pos] != '"':
                raise _Error(pos, "expected a key in double quotes")
            key_pos = pos
            key, pos = self.string(pos)
            pos = self.skip(pos)
            if pos >= len(self.text) or self.text[pos] != ":":
                raise _Error(pos, "expected ':' after a key")
            duplicate = key in out
            key_path = (*path, key)
            if duplicate:
                first = self.doc.keys.get(key_path)
                where = f" (first defined at line {first.line})" if first else ""
                span = self.span(key_pos)
                self.errors.append(
                    Diagnostic(
                        self.doc.path,
                        span.line,
                        span.col,
                        "duplicate-key",
                        f"duplicate key {key!r}{where}",
                    )
                )
                # Parse the value to move on, but keep the first one and its positions.
                scratch = Document(self.doc.path, 0, None)
                _, pos = _Reader(self.text, scratch, []).value(
                    self.skip(pos + 1), key_path, depth + 1
                )
            else:
                self.doc.keys[key_path] = self.span(key_pos, '"')
                out[key], pos = self.value(self.skip(pos + 1), key_path, depth + 1)
            pos = self.skip(pos)
            if pos < len(self.text) and self.text[pos] == ",":
                pos += 1
                continue
            if pos < len(self.text) and self.text[pos] == "}":
                return out, pos + 1
            raise _Error(pos, "expected ',' or '}' in an object")

    def array(self, pos: int, path: Path, depth: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        pos = self.skip(pos)
        if pos < len(self.text) and self.text[pos] == "]":
            return out, pos + 1
        while True:
            item, pos = self.value(self.skip(pos), (*path, len(out)), depth + 1)
            out.append(item)
            pos = self.skip(pos)
            if pos < len(self.text) and self.text[pos] == ",":
                pos += 1
                continue
            if pos < len(self.text) and self.text[pos] == "]":
                return out, pos + 1
            raise _Error(pos, "expected ',' or ']' in an array")


def load_json(text: str, path: str) -> tuple[Document | None, list[Diagnostic]]:
    """Parse one JSON document; errors carry ``path`` and a position (rule ``json-syntax``)."""
    errors: list[Diagnostic] = []
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        return None, [
            Diagnostic(path, 1, 1, "json-limit", f"the file is larger than {MAX_BYTES} bytes")
        ]
    doc = Document(path=path, index=0, data=None)
    reader = _Reader(text, doc, errors)
    start = reader.skip(1 if text.startswith("\ufeff") else 0)
    try:
        doc.data, end = reader.value(start, (), 0)
        end = reader.skip(end)
        if end < len(text):
            # The parser's own error, turned into a diagnostic just below.
            raise _Error(end, "extra data after the JSON value")  # noqa: TRY301
    except _Error as exc:
        span = reader.span(min(exc.pos, len(text)))
        rule = "json-limit" if isinstance(exc, _Limit) else "json-syntax"
        return None, [Diagnostic(path, span.line, span.col, rule, exc.message)]
    doc.start = reader.span(start)
    return doc, errors


def looks_like_json(text: str) -> bool:
    """A file whose first character (after whitespace) opens a JSON object or array."""
    stripped = text.lstrip(_WS + "\ufeff")
    return stripped[:1] in ("{", "[")
