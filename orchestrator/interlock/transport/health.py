"""One small HTTP endpoint per process: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the event loop runs and the process's own liveness check
(if any) passes: an orchestrator whose consumer loop ended is not alive, so that it gets
restarted (a liveness probe). ``/readyz`` answers
200 when the process is connected to NATS and the installation's streams and buckets
exist, 503 with the reason otherwise (a readiness probe). ``/metrics`` is the Prometheus
text format of a registry. The routes are Starlette's, served by uvicorn on the process's
own event loop (``interlock.transport.httpserver``): a process whose loop is stuck stops
answering, which is what a liveness probe should notice. The HTTP gateway serves the same
routes next to its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from interlock.transport.httpserver import HttpServer
from interlock.transport.provision import check_ready
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.health")

DEFAULT_SERVE_PORT = 9464
"""Default ``--metrics-port`` of ``interlock serve``."""
DEFAULT_AGENT_PORT = 9465
"""Default ``--metrics-port`` of ``interlock agent run``."""
ALL_HOSTS = "0.0.0.0"  # noqa: S104 - scraped and probed from outside the container
"""Default ``--metrics-host`` of ``serve`` and ``agent run``: every address."""
LOCAL_HOST = "127.0.0.1"
"""Default ``--metrics-host`` of ``interlock dev``: this machine only."""

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else why not."""
Liveness = Callable[[], str | None]
"""Returns None when alive, else what is broken."""

_READY_TIMEOUT = 5.0
_TEXT = "text/plain; charset=utf-8"
_CLOSE = {"Connection": "close"}
"""Probes and scrapes are one request each: answer and close, as the endpoint always has."""


def nats_readiness(nc: object, subjects: Subjects) -> Readiness:
    """Ready when ``nc`` is connected and every stream and bucket of ``subjects`` exists."""

    async def ready() -> str | None:
        if not getattr(nc, "is_connected", False):
            return "not connected to NATS"
        try:
            missing = await check_ready(nc, subjects)  # type: ignore[arg-type]
        # Any failure is the readiness answer.
        except Exception as exc:  # noqa: BLE001
            return f"cannot ask JetStream about streams: {exc}"
        if missing:
            return "missing streams or buckets: " + ", ".join(missing)
        return None

    return ready


def health_routes(
    *,
    ready: Readiness | None = None,
    alive: Liveness | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> list[Route]:
    """The ``/metrics``, ``/healthz`` (``/livez``) and ``/readyz`` routes (GET and HEAD)."""

    def text(status: int, body: str) -> Response:
        return Response(body, status_code=status, media_type=_TEXT, headers=_CLOSE)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST, headers=_CLOSE)

    async def healthz(request: Request) -> Response:
        broken = alive() if alive is not None else None
        if broken is not None:
            return text(503, f"not alive: {broken}\n")
        return text(200, "ok\n")

    async def readyz(request: Request) -> Response:
        broken = alive() if alive is not None else None
        if broken is not None:
            return text(503, f"not ready: {broken}\n")
        if ready is None:
            return text(200, "ready\n")
        try:
            problem = await asyncio.wait_for(ready(), _READY_TIMEOUT)
        except TimeoutError:
            problem = f"readiness check took longer than {_READY_TIMEOUT:g} s"
        if problem is None:
            return text(200, "ready\n")
        return text(503, f"not ready: {problem}\n")

    methods = ["GET", "HEAD"]
    return [
        Route("/metrics", metrics, methods=methods, include_in_schema=False),
        Route("/healthz", healthz, methods=methods, include_in_schema=False),
        Route("/livez", healthz, methods=methods, include_in_schema=False),
        Route("/readyz", readyz, methods=methods, include_in_schema=False),
    ]


async def _not_found(request: Request, exc: Exception) -> Response:
    return Response(
        "not found: try /metrics, /healthz or /readyz\n", 404, media_type=_TEXT, headers=_CLOSE
    )


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return Response("only GET\n", 405, media_type=_TEXT, headers=_CLOSE)


class HealthServer(HttpServer):
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on one port.

    Args:
        port: the TCP port (0: any free port; see :attr:`port` once started).
        ready: the readiness check (None: ready as soon as the server runs).
        alive: the liveness check (None: alive while the event loop answers).
        registry: the Prometheus registry to expose.
        host: the address to listen on.
    """

    def __init__(
        self,
        port: int,
        *,
        ready: Readiness | None = None,
        alive: Liveness | None = None,
        registry: CollectorRegistry = REGISTRY,
        host: str = ALL_HOSTS,
    ) -> None:
        app = Starlette(
            routes=health_routes(ready=ready, alive=alive, registry=registry),
            exception_handlers={404: _not_found, 405: _not_allowed},
        )
        super().__init__(app, port, host=host)

    async def start(self) -> None:
        await super().start()
        log.info("metrics and health on %s:%d (/metrics, /healthz, /readyz)", self.host, self.port)

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self
