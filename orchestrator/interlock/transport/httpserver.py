"""Serving an ASGI app from inside a running process: uvicorn on a socket bound up front.

Every HTTP listener of Interlock (the health and metrics endpoints of each process, and the
gateway) runs through :class:`HttpServer`. The socket is bound before uvicorn starts, so a
port in use fails at once with ``OSError`` and port 0 has its real number as soon as
:meth:`HttpServer.start` returns. uvicorn runs as a task on the process's own event loop:
it installs no signal handlers (the process owns SIGINT/SIGTERM) and leaves the logging
configuration alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from interlock.transport.cancelling import cancel_and_wait

log = logging.getLogger("interlock.http")

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


HEADER_TIMEOUT_S = 10.0
"""Seconds a connection has to send a whole request head, from its start or from the end
of its last response."""


MAX_HEAD_BYTES = 32 * 1024
"""Largest request head (request line and headers) taken; a larger one is answered 431."""

_LINGER_S = 2.0
_HEAD_TOO_LARGE_BODY = msgspec.json.encode(
    {
        "type": "https://interlock.io/problems/header-too-large",
        "title": "Request header fields too large",
        "status": 431,
        "detail": f"the request line and headers are larger than {MAX_HEAD_BYTES} bytes",
        "max_bytes": MAX_HEAD_BYTES,
    }
)
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/problem+json\r\n"
    + f"content-length: {len(_HEAD_TOO_LARGE_BODY)}\r\n".encode()
    + b"connection: close\r\n\r\n"
    + _HEAD_TOO_LARGE_BODY
)


class _HeadTimedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request head does not come
    whole within ``header_timeout``, and answering 431 to a head over ``MAX_HEAD_BYTES``.

    uvicorn times a connection out only between requests, once a response is sent, and
    any byte received stops that clock: a client that opened connections and sent their
    heads slowly, or not at all, held each open for good, and enough of them left no
    socket for the other callers.
    """

    header_timeout = HEADER_TIMEOUT_S
    _head_cycle: Any
    _head_bytes: int
    _head_tail: bytes
    _head_open: bool

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        # Bytes since the head began; h11 bounds only a head that is still incomplete
        # (and answers 400, which reads as the caller's syntax, not its size).
        if self._head_open and not self._refused and self.cycle is self._head_cycle:
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            if end >= 0:  # the head ends here: only it counts, not the body after it
                self._head_open = False
                size = self._head_bytes - len(self._head_tail) + end + 4
            else:
                size = self._head_bytes + len(data)
                self._head_tail = seen[-3:]
            self._head_bytes += len(data)
            if size > MAX_HEAD_BYTES:
                self._refuse_head()
                return
        if self._refused:
            return  # the rest of a refused head, read and dropped
        super().data_received(data)

    def _refuse_head(self) -> None:
        """Answer 431, then read and drop what still comes for a moment before closing:
        closed at once with unread bytes, the connection is reset and the caller never
        reads the answer."""
        self._cancel_head_timer()
        self._refused = True
        if self.transport.is_closing():
            return
        self.transport.write(_HEAD_TOO_LARGE)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self.transport.close)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_bytes = 0
        self._head_tail = b""
        self._head_open = True
        self._head_cycle = self.cycle
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is self._head_cycle and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not self._head_cycle:  # a request head came whole
            self._cancel_head_timer()
            self._head_cycle = self.cycle

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()  # the next request's head, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process owns its signals; stopping is ``HttpServer.stop``.
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    family = socket.AF_INET
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            family = socket.AF_INET6
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only
    # on connections whose socket says it is TCP, and the connections accepted here inherit
    # it. With Nagle on, a response written in two parts (head, then body) waits for the
    # client's delayed ACK: ~40 ms per request on a keep-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpServer:
    """An ASGI ``app`` served by uvicorn on ``host:port`` until :meth:`stop`.

    Args:
        app: the ASGI application.
        port: the TCP port (0: any free port; see :attr:`port` once started).
        host: the address to listen on.
        header_timeout: seconds a connection has to send a whole request head (then it
            is closed).
    """

    def __init__(
        self,
        app: Any,
        port: int,
        *,
        host: str = "127.0.0.1",
        header_timeout: float = HEADER_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.host = host
        self.header_timeout = header_timeout
        self._requested_port = port
        self._sock: socket.socket | None = None
        self._bound_port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._requested_port if self._bound_port is None else self._bound_port

    @property
    def url(self) -> str:
        host = self.host
        if host in ("0.0.0.0", "::"):  # noqa: S104 - naming it, not binding it
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and start serving; raises ``OSError`` when the port cannot be had."""
        self._sock = bind(self.host, self._requested_port)
        self._bound_port = int(self._sock.getsockname()[1])
        protocol = type("HeadTimedH11", (_HeadTimedH11,), {"header_timeout": self.header_timeout})
        config = uvicorn.Config(
            self.app,
            http=protocol,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            # Above ours: a head over MAX_HEAD_BYTES is answered 431 before h11 sees it.
            h11_max_incomplete_event_size=MAX_HEAD_BYTES + 64 * 1024,
            timeout_graceful_shutdown=int(_STOP_TIMEOUT_S),
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _START_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise OSError(f"HTTP server on {self.url} stopped while starting")
            if loop.time() > deadline:
                await self.stop()
                raise OSError(f"HTTP server on {self.url} did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        server, task, sock = self._server, self._task, self._sock
        self._server, self._task = None, None
        if server is not None and task is not None:
            server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(task), _STOP_TIMEOUT_S + 1)
            except TimeoutError:
                server.force_exit = True
                # Stopping: what ended the task was logged where it happened.
                await cancel_and_wait(task)
            except Exception:
                log.exception("HTTP server on port %d failed", self.port)
        if sock is not None:
            sock.close()
            self._sock = None

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
