"""docs/console.md names the console's pages and the gateway's routes as they are: every
page address of its table is one the console's router opens and the router opens no
other section, every API call it names is a route of the gateway's OpenAPI document with
the query parameters it shows, and every screenshot it shows is a file. No browser runs:
the router's source and the document are read."""

from __future__ import annotations

import re
from pathlib import Path

from interlock.gateway.openapi import document

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "console.md").read_text(encoding="utf-8")
FLAT = re.sub(r"\s+", " ", DOC)
ROUTER = (ROOT / "orchestrator/interlock/console/static/js/main.js").read_text(encoding="utf-8")


def _shape(path: str) -> str:
    """A path with its parameters unnamed: ``/runs/{id}`` is ``/runs/{run_id}``."""
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_the_pages_table_names_every_section_the_router_opens() -> None:
    table = DOC.split("## Pages", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    named = {m for row in rows for m in re.findall(r"`#/([a-z-]+)", row)}
    opened = set(re.findall(r'section === "([a-z-]+)"', ROUTER))
    assert opened
    assert named == opened


def test_every_api_call_the_page_names_is_a_route_with_its_parameters() -> None:
    routes: dict[tuple[str, str], set[str]] = {}
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            query = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
            routes[method.upper(), _shape(path)] = query
    wrong = []
    calls = re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`]*)`", FLAT)
    calls += [f"GET {p}" for p in re.findall(r"`(/(?:runs|workflows|agents|queues)[^`]*)`", FLAT)]
    assert len(calls) >= 10
    for call in calls:
        method, rest = call.split(" ", 1)
        path, _, query = rest.replace("\\|", "|").partition("?")
        base, _, alternatives = path.rpartition("/")
        for last in alternatives.split("|"):
            route = (method, _shape(f"{base}/{last}"))
            params = {part.split("=", 1)[0] for part in query.split("&") if part}
            if route not in routes:
                wrong.append(f"{call}: no such route")
            elif params - routes[route]:
                wrong.append(f"{call}: takes no {sorted(params - routes[route])}")
    assert wrong == []


def test_every_screenshot_the_page_shows_is_a_file() -> None:
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", DOC)
    assert shown
    assert [s for s in shown if not (ROOT / "docs" / s).is_file()] == []
