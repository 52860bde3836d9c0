"""One small HTTP endpoint per process: ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the event loop runs and the process's own liveness check
(if any) passes: an orchestrator whose consumer loop ended is not alive, so that it gets
restarted (a liveness probe). ``/readyz`` answers
200 when the process is connected to NATS and the installation's streams and buckets
exist, 503 with the reason otherwise (a readiness probe). ``/metrics`` is the Prometheus
text format of a registry. It runs on the process's own event loop: a process whose loop
is stuck stops answering, which is what a liveness probe should notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from interlock.transport.provision import check_ready
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.health")

DEFAULT_SERVE_PORT = 9464
"""Default ``--metrics-port`` of ``interlock serve``."""
DEFAULT_AGENT_PORT = 9465
"""Default ``--metrics-port`` of ``interlock agent run``."""

Readiness = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else why not."""
Liveness = Callable[[], str | None]
"""Returns None when alive, else what is broken."""

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_READY_TIMEOUT = 5.0


def nats_readiness(nc: object, subjects: Subjects) -> Readiness:
    """Ready when ``nc`` is connected and every stream and bucket of ``subjects`` exists."""

    async def ready() -> str | None:
        if not getattr(nc, "is_connected", False):
            return "not connected to NATS"
        try:
            missing = await check_ready(nc, subjects)  # type: ignore[arg-type]
        except Exception as exc:
            return f"cannot ask JetStream about streams: {exc}"
        if missing:
            return "missing streams or buckets: " + ", ".join(missing)
        return None

    return ready


class HealthServer:
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
        host: str = "0.0.0.0",  # noqa: S104 - scraped and probed from outside the container
    ) -> None:
        self._requested_port = port
        self._ready = ready
        self._alive = alive
        self._registry = registry
        self._host = host
        self._server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._requested_port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._requested_port)
        log.info("metrics and health on :%d (/metrics, /healthz, /readyz)", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while True:  # headers: read and ignored
                line = await asyncio.wait_for(reader.readline(), 10)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            method, target = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
            status, ctype, body = await self._respond(method, target.split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        except Exception:
            log.exception("health endpoint failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, text, b"only GET\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        broken = self._alive() if self._alive is not None else None
        if path in ("/healthz", "/livez"):
            if broken is not None:
                return 503, text, f"not alive: {broken}\n".encode()
            return 200, text, b"ok\n"
        if path == "/readyz":
            if broken is not None:
                return 503, text, f"not ready: {broken}\n".encode()
            if self._ready is None:
                return 200, text, b"ready\n"
            try:
                problem = await asyncio.wait_for(self._ready(), _READY_TIMEOUT)
            except TimeoutError:
                problem = f"readiness check took longer than {_READY_TIMEOUT:g} s"
            if problem is None:
                return 200, text, b"ready\n"
            return 503, text, f"not ready: {problem}\n".encode()
        return 404, text, b"not found: try /metrics, /healthz or /readyz\n"
