"""``--output json|yaml|table`` (and ``--json``, its shorthand) for every command that reads.

JSON and YAML print the views of :mod:`interlock.views` as they are (the shapes the HTTP API
answers with); ``table`` is for people. Nothing heavy is imported here: building the parser
must stay cheap (``--help`` and shell completion run it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

FORMATS = ("table", "json", "yaml")


def add_output_flags(p: argparse.ArgumentParser, *, default: str = "table") -> None:
    """``--output/-o FORMAT`` and ``--json`` (= ``--output json``)."""
    p.add_argument(
        "--output",
        "-o",
        choices=FORMATS,
        default=None,
        help=f"how to print it (default {default})",
    )
    p.add_argument("--json", action="store_true", help="shorthand for --output json")
    p.set_defaults(output_default=default)


def output_format(args: argparse.Namespace) -> str:
    if getattr(args, "json", False):
        return "json"
    chosen = getattr(args, "output", None)
    return str(chosen or getattr(args, "output_default", "table"))


def plain(value: Any) -> Any:
    """Views (msgspec Structs) and lists of them as dicts and lists."""
    import msgspec

    return msgspec.to_builtins(value)


def dump(value: Any, fmt: str) -> str:
    """``value`` (a view, or plain data) as JSON or YAML text."""
    data = plain(value)
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def emit(
    args: argparse.Namespace,
    value: Any,
    table: Callable[[], None] | None = None,
) -> None:
    """Print ``value`` as the command's ``--output`` says; ``table`` prints it for people."""
    fmt = output_format(args)
    if fmt == "table" and table is not None:
        table()
        return
    sys.stdout.write(dump(value, "yaml" if fmt == "yaml" else "json"))


def binary_size(size: int) -> str:
    """``size`` bytes for people: ``812 B``, ``3.0 KiB``, ``256 MiB`` (whole units bare)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            if unit == "B" or value.is_integer():
                return f"{int(value):,} {unit}"
            return f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns as wide as their widest cell; the last column is not padded."""
    cells = [[str(c) if c is not None else "" for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))
    fmt = "  ".join(f"{{:{w}}}" for w in widths[:-1]) + ("  {}" if len(headers) > 1 else "{}")
    out = [fmt.format(*headers).rstrip()]
    out += [fmt.format(*row).rstrip() for row in cells]
    sys.stdout.write("\n".join(out) + "\n")
