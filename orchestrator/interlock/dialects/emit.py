"""Native manifests as YAML text, with the notes of a conversion as comments.

Block style for mappings and lists, each scalar written by PyYAML (so quoting is always
right), and each note as a ``#`` comment above the key it is about. The result reads back
through the native loader to the same data (a test checks it for every conversion).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from interlock.core.source import Path
from interlock.dialects.base import Note

WIDTH = 96


def _scalar(value: Any) -> str:
    if isinstance(value, str) and value in ("on", "yes", "no", "y", "n", "off"):
        return f'"{value}"'
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text.removesuffix("...").strip()


def _key(key: Any) -> str:
    return _scalar(str(key))


def _comment(lines: list[str], indent: str, notes: list[str]) -> None:
    for note in notes:
        for line in textwrap.wrap(note, WIDTH - len(indent) - 2) or [""]:
            lines.append(f"{indent}# {line}")


def _flow(value: Any) -> str | None:
    """A small mapping or list on one line, or None."""
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, list) and not value:
        return "[]"
    return None


def _emit(
    value: Any, path: Path, indent: int, lines: list[str], notes: Mapping[Path, list[str]]
) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            here = (*path, key)
            _comment(lines, pad, notes.get(here, []))
            flow = _flow(item)
            if isinstance(item, dict | list) and flow is None:
                lines.append(f"{pad}{_key(key)}:")
                _emit(item, here, indent + 2, lines, notes)
            else:
                lines.append(f"{pad}{_key(key)}: {flow or _scalar(item)}")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            here = (*path, i)
            _comment(lines, pad, notes.get(here, []))
            flow = _flow(item)
            if isinstance(item, dict) and flow is None:
                sub: list[str] = []
                _emit(item, here, indent + 2, sub, notes)
                first = next(n for n, line in enumerate(sub) if not line.lstrip().startswith("#"))
                lines.extend(sub[:first])
                lines.append(f"{pad}- {sub[first][indent + 2 :]}")
                lines.extend(sub[first + 1 :])
            elif isinstance(item, list) and flow is None:
                lines.append(f"{pad}-")
                _emit(item, here, indent + 2, lines, notes)
            else:
                lines.append(f"{pad}- {flow or _scalar(item)}")
        return
    lines.append(f"{pad}{_scalar(value)}")


def to_yaml(data: Any, notes: Sequence[Note] = (), header: Sequence[str] = ()) -> str:
    """One YAML document for ``data``, ``notes`` as comments above their keys."""
    present: set[Path] = set()
    _paths(data, (), present)
    by_path: dict[Path, list[str]] = {}
    for note in notes:
        where = tuple(note.path)
        while where and where not in present:
            where = where[:-1]  # a note about something the mapping left out: its parent
        by_path.setdefault(where, []).append(note.text)
    lines: list[str] = []
    _comment(lines, "", list(header))
    _comment(lines, "", by_path.pop((), []))
    _emit(data, (), 0, lines, by_path)
    return "\n".join(lines) + "\n"


def _paths(value: Any, path: Path, out: set[Path]) -> None:
    out.add(path)
    if isinstance(value, dict):
        for key, item in value.items():
            _paths(item, (*path, key), out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _paths(item, (*path, i), out)
