"""The HTTP listener's sockets: what keeps a keep-alive connection from waiting on Nagle."""

from __future__ import annotations

import asyncio
import socket

from interlock.transport.httpserver import bind


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
