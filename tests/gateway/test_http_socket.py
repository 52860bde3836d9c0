"""The HTTP listener's sockets: what keeps a keep-alive connection from waiting on Nagle,
and what closes one that never sends a whole request head."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from interlock.transport.httpserver import HttpServer, bind


async def test_accepted_connections_have_nagle_off() -> None:
    """A response goes out in two writes (head, body); with Nagle's algorithm on, the
    second waits for the client's delayed ACK, ~40 ms per request (``POST /events`` ran at
    19 requests/s). asyncio disables Nagle only on sockets that say they are TCP."""
    listener = bind("127.0.0.1", 0)
    assert listener.proto == socket.IPPROTO_TCP
    nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        nodelay.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=listener)
    try:
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(nodelay, 10) != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


@asynccontextmanager
async def _serving(header_timeout: float) -> AsyncIterator[int]:
    server = HttpServer(_hello, 0, header_timeout=header_timeout)
    await server.start()
    try:
        yield server.port
    finally:
        await server.stop()


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before it closed the connection (within ``within`` s)."""
    return await asyncio.wait_for(reader.read(), within)


async def test_a_connection_that_never_finishes_its_request_head_is_closed() -> None:
    # Opened and left silent, or sending its head a byte at a time: either held a socket
    # for good (uvicorn's own clock runs only between requests, and any byte stops it).
    async with _serving(header_timeout=0.5) as port:
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", port)
        reader, trickling = await asyncio.open_connection("127.0.0.1", port)
        head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40

        async def trickle() -> None:
            for byte in head:
                if trickling.is_closing():
                    return
                trickling.write(bytes([byte]))
                await asyncio.sleep(0.05)  # a byte every 50 ms: 2 s for the head

        feeding = asyncio.create_task(trickle())
        try:
            assert await _closed_by_server(reader, 10) == b""
            assert await _closed_by_server(silent_reader, 10) == b""
        finally:
            feeding.cancel()
            silent.close()
            trickling.close()


async def test_requests_whose_heads_come_whole_are_answered_on_a_kept_alive_connection() -> None:
    async with _serving(header_timeout=0.5) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(3):
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                status = await asyncio.wait_for(reader.readline(), 10)
                assert status.startswith(b"HTTP/1.1 200"), status
                while await asyncio.wait_for(reader.readline(), 10) != b"\r\n":
                    pass  # the other header lines
                assert await asyncio.wait_for(reader.readexactly(5), 10) == b"hello"
        finally:
            writer.close()
