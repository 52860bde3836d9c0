"""docs/client.md names every public call of ``interlock.Client`` with parameters it takes,
and every error ``interlock`` exports (its examples are run by
tests/runtime/test_client_docs.py). Nothing connects: the class is read."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import interlock
from interlock import Client

DOC = (Path(__file__).resolve().parents[1] / "docs" / "client.md").read_text(encoding="utf-8")
CALLS = {
    name
    for name, member in inspect.getmembers(Client)
    if not name.startswith("_") and callable(member)
}


def table() -> list[tuple[str, str]]:
    """Each call of the table of calls (``name(params)`` in a row's first cell)."""
    rows = [line for line in DOC.splitlines() if line.startswith("| `")]
    return [
        (found[1], found[2])
        for row in rows
        for found in re.finditer(r"`(\w+)\(([^`]*)\)`", row.split(" | ", 1)[0])
    ]


def test_every_call_of_the_client_is_named_in_the_page() -> None:
    named = set(re.findall(r"(?:\.|`)(\w+)\(", DOC))
    assert sorted(CALLS - named) == []


@pytest.mark.parametrize(("name", "params"), table(), ids=[n for n, _ in table()])
def test_a_call_of_the_table_takes_the_parameters_it_shows(name: str, params: str) -> None:
    assert name in CALLS, f"Client has no {name}()"
    taken = set(inspect.signature(getattr(Client, name)).parameters) - {"self"}
    shown = {p.split("=")[0].strip() for p in params.replace("…", "").split(",")}
    shown -= {"", "*", "event or type"}
    assert sorted(shown - taken) == [], f"{name}() takes {sorted(taken)}"


def test_every_error_interlock_exports_is_named_in_the_page() -> None:
    errors = {
        name
        for name in interlock.__all__
        if isinstance(getattr(interlock, name), type)
        and issubclass(getattr(interlock, name), Exception)
    }
    section = DOC.split("Errors a program handles are exported by `interlock`", 1)[1]
    named = set(re.findall(r"`(\w+)`", section.split("\n\n", 1)[0]))
    assert sorted(errors - named) == [], "exported, not in the page"
    assert sorted(named & set(dir(interlock)) - errors) == []
