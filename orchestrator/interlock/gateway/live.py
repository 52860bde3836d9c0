"""``GET /live/runs``: the run index's changes as Server-Sent Events.

A page listing runs learns of new and moved runs from this stream instead of asking for the
list again and again. It is fed by the watch of the run index the gateway keeps for
``GET /runs`` (no NATS subscription per follower). Events:

- ``ready``: the stream is following; list now, and apply the changes that follow;
- ``run``: a run's entry was written (data: its ``RunSummary``);
- ``gone``: a run's entry was deleted (data: ``{"run_id": ...}``);
- ``reset``: this follower fell behind and changes were dropped; list again (the stream
  ends; reconnect to follow again).

A comment line every 15 s keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from interlock.views import summary_from_index

if TYPE_CHECKING:
    from interlock.gateway.service import Gateway

KEEPALIVE_S = 15.0


async def stream_runs(request: Request, gw: Gateway) -> Response:
    # Following before the answer starts: no change after the caller's "ready" is missed.
    queue = await gw.run_list.follow()

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"event: ready\ndata: {}\n\n"
            while True:
                try:
                    change = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if change is None:
                    yield b"event: reset\ndata: {}\n\n"
                    return
                run_id, item = change
                if item is None:
                    data = msgspec.json.encode({"run_id": run_id})
                    yield b"event: gone\ndata: " + data + b"\n\n"
                else:
                    data = msgspec.json.encode(summary_from_index(item))
                    yield b"event: run\ndata: " + data + b"\n\n"
        finally:
            gw.run_list.unfollow(queue)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
