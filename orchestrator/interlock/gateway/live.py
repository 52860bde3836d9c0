"""The gateway's Server-Sent Events: ``GET /live/runs`` and ``GET /runs/{id}/log/stream``.

``GET /live/runs``: the run index's changes.

A page listing runs learns of new and moved runs from this stream instead of asking for the
list again and again. It is fed by the one follower of the run index's new writes the
gateway keeps for all of them (made when the first comes; see ``RunList.follow``): no
NATS subscription per follower. Events:

- ``ready``: the stream is following; list now, and apply the changes that follow;
- ``run``: a run's entry was written (data: its ``RunSummary``);
- ``gone``: a run's entry was deleted (data: ``{"run_id": ...}``);
- ``reset``: this follower fell behind and changes were dropped, or the gateway's NATS
  connection came back after a loss (what was written meanwhile was not heard); list again
  (the stream ends; reconnect to follow again).

A comment line every 15 s keeps proxies from closing an idle stream.

Both streams end once their caller's token is revoked, within the 5 s a new request with
it takes to be refused: the token is checked again every second (``revoked`` is the last
event; reconnecting gets 401).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from interlock import views
from interlock.core import events as ev
from interlock.gateway.auth import RECHECK_S
from interlock.gateway.logrange import seek
from interlock.gateway.problems import int_param
from interlock.transport.cancelling import cancel_and_wait
from interlock.views import summary_from_index

if TYPE_CHECKING:
    from interlock.gateway.service import Gateway

HEAD_RECORDS = 1000
"""A log not kept longer than this is streamed a page at a time (see ``stream_log``)."""

KEEPALIVE_S = 15.0
_PAGE = 200
"""Messages a long log's stream reads at a time."""
_ENDINGS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)


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

    return _sse(request, gw, events())


def _sse(request: Request, gw: Gateway, events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(
        while_allowed(events, lambda: gw.still_reads(request)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def while_allowed(
    events: AsyncIterator[bytes], allowed: Callable[[], Awaitable[bool]]
) -> AsyncIterator[bytes]:
    """``events`` while ``allowed()`` says so, asked every ``RECHECK_S`` however quiet the
    stream; then ``event: revoked`` and the end (``events`` closed, its cleanup run)."""
    pending: asyncio.Task[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=RECHECK_S)
            if done:
                try:
                    chunk = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield chunk
            if not await allowed():
                yield b'event: revoked\ndata: {"detail": "the token was revoked"}\n\n'
                return
    finally:
        if pending is not None:
            await cancel_and_wait(pending)
        await events.aclose()  # type: ignore[attr-defined]


async def stream_log(request: Request, gw: Gateway) -> Response:
    """The log as Server-Sent Events: every record (from ``offset``), then each new one,
    until the run ends; ``id`` is the record's position, so a reconnecting EventSource
    (``Last-Event-ID``) resumes where it left off.

    The records so far come from the log the gateway keeps (brought up to date by reading
    only what was appended), and following starts after its last message: a connection,
    or a reconnection, does not read the whole log again."""
    run_id = request.path_params["run_id"]
    start = int_param(request, "offset", 0, 0, 1 << 31)
    last = request.headers.get("last-event-id", "")
    if last.isdigit():
        start = int(last) + 1
    if not gw.run_logs.keeps(run_id):
        # A long log not kept is streamed from where ``start`` lies, a page at a time:
        # read whole for each connection, and held while its caller read, many callers
        # of a 200,000-record log made the gateway hold as many copies of it.
        at = await seek(gw.api.ops, run_id, start, longer_than=HEAD_RECORDS)
        if at is not None:
            return _sse(request, gw, _paged(gw, run_id, start, at))
    cached = await gw.run_logs.log(run_id)  # 404 now, before the stream starts
    # What is kept now (the kept lists only grow, so this slice stays what it is).
    count = len(cached.records)
    kept = [
        (ev.record_type(record), data)
        for record, data in zip(
            cached.records[start:count], cached.encoded[start:count], strict=True
        )
    ]
    after, finished = cached.last_seq, cached.finished

    async def events() -> AsyncIterator[bytes]:
        position = start
        for kind, data in kept:
            yield f"id: {position}\nevent: {kind}\ndata: ".encode() + data + b"\n\n"
            position += 1
        async for chunk in _following(gw, run_id, after, finished, count, start):
            yield chunk

    return _sse(request, gw, events())


def _event(position: int, record: ev.AnyRecord) -> bytes:
    data = msgspec.json.encode(views.record_view(record))
    return f"id: {position}\nevent: {ev.record_type(record)}\ndata: ".encode() + data + b"\n\n"


async def _paged(gw: Gateway, run_id: str, start: int, at: tuple[int, int]) -> AsyncIterator[bytes]:
    """The records from place ``start`` (0-based) on, read a page of messages at a time
    from ``at`` (the stream sequence of the message holding it, and that message's first
    place, from 1), then each new one until the run ends."""
    seq, first = at
    position, after, finished = first - 1, seq - 1, False
    while True:
        found = await gw.api.ops.log.read_checked(run_id, after=after, limit=_PAGE)
        for _, payload in found.messages:
            for record in ev.decode_batch(payload):
                finished = finished or isinstance(record, _ENDINGS)
                if position >= start:
                    yield _event(position, record)
                position += 1
        done = len(found.messages) + len(found.foreign) < _PAGE
        after = found.last
        if done:
            break
    async for chunk in _following(gw, run_id, after, finished, position, start):
        yield chunk


async def _following(
    gw: Gateway, run_id: str, after: int, finished: bool, position: int, start: int
) -> AsyncIterator[bytes]:
    """Each record appended after stream sequence ``after`` (``position`` the place of the
    first), from place ``start`` on, then ``end`` once the run ends."""
    queue: asyncio.Queue[ev.AnyRecord | None] = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        try:
            if not finished:
                async for _, payload in gw.api.ops.watcher.follow(run_id, after=after):
                    for record in ev.decode_batch(payload):
                        await queue.put(record)
        finally:
            await queue.put(None)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                record = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if record is None:
                yield b"event: end\ndata: {}\n\n"
                return
            if position >= start:
                yield _event(position, record)
            position += 1
    finally:
        await cancel_and_wait(task)
