"""Request metrics of the gateway, as ASGI middleware around the app (the handlers do not
know about them): how many requests each route answered with each status, and how long
each took to answer.

Requests are labelled by route *template* (``/runs/{run_id}``), never by the path a caller
sent, so a scan of made-up paths cannot grow the series without bound: a path no route
matches is counted as ``unmatched``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds; a long poll (``/result?timeout=``) ends in the last buckets."""


@dataclass(frozen=True, slots=True)
class _Series:
    requests: Counter
    duration: Histogram


_SERIES: weakref.WeakKeyDictionary[CollectorRegistry, _Series] = weakref.WeakKeyDictionary()
"""One set of series per registry (a second gateway in the same process shares them)."""


def _series(registry: CollectorRegistry) -> _Series:
    found = _SERIES.get(registry)
    if found is None:
        found = _Series(
            requests=Counter(
                "interlock_gateway_requests_total",
                "HTTP requests answered by the gateway, by route template, method and status",
                ["route", "method", "status"],
                registry=registry,
            ),
            duration=Histogram(
                "interlock_gateway_request_duration_seconds",
                "Time from a request's arrival to the start of its answer (the status and "
                "headers; a Server-Sent Events stream is timed to its start)",
                ["route", "method"],
                buckets=_BUCKETS,
                registry=registry,
            ),
        )
        _SERIES[registry] = found
    return found


class RequestMetrics:
    """ASGI middleware counting and timing each HTTP request by route template and status.

    Args:
        app: the application it wraps.
        routes: the application's routes (to name a request's template).
        registry: where the series are registered (the one ``/metrics`` serves).
    """

    def __init__(
        self, app: ASGIApp, *, routes: Sequence[BaseRoute], registry: CollectorRegistry
    ) -> None:
        self.app = app
        self.routes = list(routes)
        self.series = _series(registry)

    def template(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path is a route's, the method not
                path = getattr(route, "path", None)  # a Mount's is its prefix
                return path if isinstance(path, str) and path else UNMATCHED
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app fails before answering
        answered: float | None = None

        async def sending(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = int(message["status"])
                answered = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route, method = self.template(scope), str(scope.get("method", ""))
            self.series.requests.labels(route, method, str(status)).inc()
            took = (answered if answered is not None else time.perf_counter()) - started
            self.series.duration.labels(route, method).observe(took)
