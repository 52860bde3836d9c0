"""docs/http.md says what the gateway's OpenAPI document says (and that document is what
the gateway serves: tests/gateway/test_openapi_routes.py): every route is named in the
page and the page names no other, a route's query parameters and request body fields are
the document's, and every status code the page gives a route is one the document lists
for it. Nothing runs: the document is built as the gateway builds it."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest

from interlock.gateway.openapi import document
from support.core import ROOT

DOC = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
METHODS = ("get", "post", "put", "patch", "delete")
SERVED_BESIDE = {("GET", "/openapi.json")}
"""Served and named in the page, not in the document: the document itself."""

Route = tuple[str, str]


@cache
def operations() -> dict[Route, dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in document()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    }


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = document()["components"]["schemas"][name]
    return schema


def _named(text: str) -> list[tuple[Route, str]]:
    """Each ``METHOD /path?query`` code span of ``text`` as (route, query); ``.../resume``
    after one names the same path with its last segment replaced."""
    out: list[tuple[Route, str]] = []
    last: Route | None = None
    for code in re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`]*|\.\.\./[a-z-]+)`", text):
        if code.startswith("...") and last is not None:
            route = (last[0], last[1].rsplit("/", 1)[0] + code[3:])
            out.append((route, ""))
            continue
        method, rest = code.split(" ", 1)
        path, _, query = rest.partition("?")
        last = (method, path.split(" ")[0])
        out.append((last, query))
    return out


def rows() -> dict[Route, tuple[str, str]]:
    """The REST table: each route of a row's first cell, with its query and the row."""
    table = DOC.split("## Runs over REST", 1)[1].split("\n## ", 1)[0]
    out: dict[Route, tuple[str, str]] = {}
    for line in table.splitlines():
        cells = re.split(r"(?<!\\)\|", line)
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        for route, query in _named(cells[1]):
            out[route] = (query, line)
    return out


def test_every_route_of_the_document_is_in_the_page_and_no_other() -> None:
    named = {route for route, _ in _named(DOC)}
    assert sorted(set(operations()) - named) == [], "in the OpenAPI document, not in http.md"
    assert sorted(named - set(operations()) - SERVED_BESIDE) == [], "in http.md only"


def test_the_rest_table_has_a_row_per_route_of_the_api() -> None:
    """Every route but the events' and the webhooks' (each with a section of its own)."""
    api = {r for r in operations() if not r[1].startswith(("/events", "/webhooks"))}
    assert sorted(api - set(rows())) == []


def _query(route: Route) -> set[str]:
    params = operations()[route].get("parameters", [])
    return {p["name"] for p in params if p["in"] == "query"}


@pytest.mark.parametrize("route", sorted(rows()), ids=" ".join)
def test_a_rows_query_parameters_are_the_documents(route: Route) -> None:
    query, _ = rows()[route]
    written = {part.split("=", 1)[0] for part in query.split("&") if part}
    if route in operations():
        assert written == _query(route), f"{' '.join(route)}: ?{query}"


def test_every_query_parameter_of_the_document_is_in_the_page() -> None:
    missing = sorted(
        (route, name)
        for route in operations()
        for name in _query(route)
        if not re.search(rf"[?&`]{name}=", DOC)
    )
    assert missing == []


def _body_fields(route: Route) -> tuple[set[str], set[str]] | None:
    body = operations()[route].get("requestBody")
    if body is None or "application/json" not in body["content"]:
        return None
    schema = _resolve(body["content"]["application/json"]["schema"])
    if "properties" not in schema:
        return None
    return set(schema["properties"]), set(schema.get("required", ()))


@pytest.mark.parametrize("route", sorted(rows()), ids=" ".join)
def test_a_rows_body_fields_are_the_documents(route: Route) -> None:
    """``{"workflow", "inputs", "run_id"?}`` in a row's first cell: the request body's
    fields, ``?`` marking those it may leave out."""
    _, line = rows()[route]
    cell = re.split(r"(?<!\\)\|", line)[1]
    written = re.search(r"`(\{.*?\})`", cell)
    fields = _body_fields(route) if route in operations() else None
    if written is None:
        assert fields is None or not fields[1], f"{' '.join(route)} requires {fields}"
        return
    names = re.findall(r'"(\w+)"(\??)', written[1])
    assert fields is not None, f"{' '.join(route)} takes no JSON object"
    assert {n for n, _ in names} == fields[0]
    assert {n for n, optional in names if not optional} == fields[1]


def _codes(text: str) -> set[str]:
    """The status codes ``text`` names (``404``, ``409 `run-exists```), not its other
    numbers (``default 500``, ``at most 300 s``, ``1-500``, ``16 KiB``)."""
    number = r"(?<![\w.:/,-])(?<!default )(?<!most )([1-5]\d\d)"
    return set(re.findall(number + r"(?![\w.%,-]| ?(?:KiB|MiB|MB|s\b|ms\b|lines))", text))


def _section_codes() -> dict[Route, set[str]]:
    """The codes of the events' and the webhooks' status tables."""
    out: dict[Route, set[str]] = {}
    for heading, routes in (
        ("## `POST /events`", [("POST", "/events")]),
        (
            "## `POST /webhooks/{name}`",
            [r for r in operations() if r[1].startswith("/webhooks/")],
        ),
    ):
        section = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
        table = [line for line in section.splitlines() if re.match(r"\| \*?\*?\d{3}", line)]
        for route in routes:
            out[route] = {code for line in table for code in _codes(line.split("|")[1])}
    return out


def test_every_status_the_page_gives_a_route_is_in_the_document() -> None:
    """A row of several routes (``POST .../pause``, ``.../resume``) gives each code to
    one of them at least."""
    lines: dict[str, list[Route]] = {}
    for route, (_, line) in rows().items():
        lines.setdefault(line, []).append(route)
    given = {tuple(routes): _codes(line.split("|", 3)[3]) for line, routes in lines.items()}
    given |= {(route,): codes for route, codes in _section_codes().items()}
    wrong = {}
    for routes, codes in given.items():
        listed = {c for r in routes if r in operations() for c in operations()[r]["responses"]}
        if codes - listed:
            wrong[" ".join(routes[0])] = sorted(codes - listed)
    assert wrong == {}


def test_every_query_parameter_a_section_names_is_in_the_document() -> None:
    """``?wait=`` in the events' and the webhooks' sections is a parameter of their routes."""
    wrong = []
    for heading, prefix in (("## `POST /events`", "/events"), ("## `POST /webhooks", "/webhooks")):
        section = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
        taken = {
            name for route in operations() if route[1].startswith(prefix) for name in _query(route)
        }
        routes = [r for r in operations() if r[1].startswith(prefix)]
        for name in set(re.findall(r"`\?(\w+)=", section)):
            if not all(name in _query(route) for route in routes):
                wrong.append((prefix, name, sorted(taken)))
    assert wrong == []


@pytest.mark.parametrize("route", sorted(rows()), ids=" ".join)
def test_an_answer_shape_the_page_shows_is_the_documents(route: Route) -> None:
    """An answer a row shows as ``{"run_id", "cancelled"}`` has those fields, all of them."""
    answer = re.split(r"(?<!\\)\|", rows()[route][1])[3].strip()
    shown = re.match(r"(?:\d{3} )?`(\{[^`]*\})`", answer)
    if shown is None or route not in operations():
        return
    responses = operations()[route]["responses"]
    ok = next(code for code in sorted(responses) if code.startswith("2"))
    schema = _resolve(responses[ok]["content"]["application/json"]["schema"])
    assert set(re.findall(r'"(\w+)"', shown[1])) == set(schema["properties"])


def test_every_type_the_page_names_is_a_schema_of_the_document() -> None:
    """``RunDescription``, ``[QueueView]``: the answers' types, by the names the document
    gives them (the names of ``interlock.views``)."""
    named = set(re.findall(r"`\[?([A-Z][a-z]+(?:[A-Z][a-z]+)+)\]?`", DOC)) - {"EventSource"}
    assert sorted(named - set(document()["components"]["schemas"])) == []


def _curls() -> list[tuple[str, str, str]]:
    """Each ``curl`` of the README's and the docs' shell blocks to the gateway: (page,
    method, path with query)."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                found = re.search(r"curl .*?(?:localhost|127\.0\.0\.1):8480(/[^\s\"']*)", line)
                if found is None:
                    continue
                explicit = re.search(r"-X\s*([A-Z]+)", line)
                method = explicit[1] if explicit else ("POST" if " -d " in line else "GET")
                out.append((page.name, method, found[1]))
    return out


def test_every_curl_in_the_docs_calls_a_route_with_its_parameters() -> None:
    assert len(_curls()) >= 10
    wrong = []
    for page, method, target in _curls():
        path, _, query = target.partition("?")
        matches = [
            route
            for route in operations()
            if route[0] == method
            and re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(route[1])), path)
        ]
        params = {part.split("=", 1)[0] for part in query.split("&") if part}
        if not matches:
            wrong.append(f"{page}: {method} {target}: no such route")
        elif not any(params <= _query(route) for route in matches):
            wrong.append(f"{page}: {method} {target}: takes no {sorted(params)}")
    assert wrong == []


def _problem_slugs() -> set[str]:
    """Every problem ``type`` slug the gateway answers, from its source: ``Problem(400,
    "slug", ...)``, the client errors' table (``Meaning(404, "slug", ...)``), the
    fallbacks by status, and the HTTP server's own ``problems/slug``."""
    code = "\n".join(
        path.read_text(encoding="utf-8") for path in (ROOT / "orchestrator").rglob("*.py")
    )
    found = set(re.findall(r'(?:Problem|Meaning)\(\s*\d{3},\s*"([a-z-]+)"', code))
    found |= set(re.findall(r'\b\d{3}: "([a-z]+(?:-[a-z]+)+)"', code))
    found |= set(re.findall(r'interlock\.io/problems/([a-z-]+)"', code))
    found |= set(re.findall(r'\.get\(status, "([a-z-]+)"\)', code))
    return found


def test_every_problem_the_gateway_answers_is_named_in_the_page_and_no_other() -> None:
    slugs = _problem_slugs()
    assert {"unknown-run", "header-too-large", "http-error"} <= slugs
    flat = re.sub(r"\s+", " ", DOC)
    named = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", flat))
    assert sorted(slugs - named) == [], "answered, not in http.md"
    given = set(re.findall(r"\b[1-5]\d\d `([a-z]+(?:-[a-z]+)+)`", flat))
    listing = flat.split("ends in a stable slug (", 1)[1].split("...")[0]
    listed = re.findall(r"`([a-z-]+)`", re.sub(r"\([^()]*\)", "", listing))
    assert sorted((given | set(listed)) - slugs) == [], "in http.md, answered by nothing"
