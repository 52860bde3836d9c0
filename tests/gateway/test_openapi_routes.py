"""/openapi.json documents every route the gateway serves, and no route it does not: the
document served over a real socket against the routes of the gateway's app."""

from __future__ import annotations

import pytest
from starlette.routing import Route

from interlock.gateway.app import build_app
from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack

pytestmark = pytest.mark.asyncio

UNDOCUMENTED = {("/openapi.json", "get")}
"""Served and, on purpose, not in the document (the document itself); so are the routes
marked ``include_in_schema=False`` (the probes ``/metrics``, ``/healthz``, ``/livez``,
``/readyz``: docs/operations.md) and the web console's pages under ``/ui``
(docs/console.md)."""


async def test_the_document_lists_every_route_served(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects) as gs:
        async with gs.http(None) as http:
            answer = await http.get("/openapi.json")
        assert answer.status_code == 200
        documented = {
            (path, method)
            for path, operations in answer.json()["paths"].items()
            for method in operations
            if method in {"get", "post", "put", "patch", "delete"}
        }
        served = {
            (route.path, method.lower())
            for route in build_app(gs.gateway).routes
            if isinstance(route, Route)
            and route.include_in_schema
            and route.path != "/ui"
            and not route.path.startswith("/ui/")
            for method in route.methods or ()
            if method != "HEAD"
        }
    assert sorted(served - UNDOCUMENTED - documented) == [], "served, not documented"
    assert sorted(documented - served) == [], "documented, not served"
    assert served >= UNDOCUMENTED
