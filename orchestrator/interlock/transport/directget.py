"""Reading a stream's messages by batched direct gets: no consumer is made, so a read
leaves nothing behind on the server (the stream needs ``allow_direct``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sized
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core.vocabulary import InterlockError
from interlock.transport.natsclient import js_api

_BATCH = 1000
_T = TypeVar("_T")
_TIMEOUT = 5.0


class LogReadError(InterlockError):
    """The server did not answer a read of a stream (a run log, a bucket) as expected."""


async def read_subject(
    nc: Client, stream: str, subject: str, after: int = 0, *, limit: int | None = None
) -> list[tuple[int, bytes]]:
    """(stream sequence, payload) of every message of ``subject`` after sequence ``after``
    (the first ``limit`` of them when given), by batched direct gets (the stream needs
    ``allow_direct``). See :func:`read_messages`."""
    return await _read(nc, stream, subject, after, limit, named=False)  # type: ignore[return-value]


async def read_entries(
    nc: Client, stream: str, subject: str, after: int = 0, *, limit: int | None = None
) -> list[tuple[int, dict[str, str], bytes]]:
    """(stream sequence, headers, payload) of every message of ``subject`` after sequence
    ``after`` (the first ``limit`` of them when given): :func:`read_subject` with each
    message's headers as stored (and the server's ``Nats-*`` ones of the direct get)."""
    return await _read(nc, stream, subject, after, limit, named=None)  # type: ignore[return-value]


async def read_messages(
    nc: Client, stream: str, subjects: str, after: int = 0
) -> list[tuple[int, str, bytes]]:
    """(stream sequence, subject, payload) of every message on ``subjects`` (a filter:
    wildcards allowed) after sequence ``after``, in stream order, by batched direct gets.
    No consumer is made: a read leaves nothing behind on the server."""
    return await _read(nc, stream, subjects, after, None, named=True)  # type: ignore[return-value]


async def _read(
    nc: Client, stream: str, subject: str, after: int, limit: int | None, *, named: bool | None
) -> list[tuple[int, bytes]] | list[tuple[int, str, bytes]]:
    """The messages of ``subject`` after ``after``, each with its subject when ``named``
    (``None``: with its headers instead).

    A batch's messages are collected by the subscription's callback as they arrive and the
    reader wakes once per batch, when the server's end-of-batch notice (or "no message")
    comes: waking for each message (``next_msg``) cost twice as long on a 2,500-message
    log. A batch that makes no progress for ``_TIMEOUT`` seconds fails the read.
    """
    api = f"{js_api(nc)}.DIRECT.GET.{stream}"
    out: list = []  # type: ignore[type-arg]
    start = after + 1
    loop = asyncio.get_running_loop()
    # Resolved at the end of the batch asked for last: True when the log has no more.
    ended: asyncio.Future[bool] = loop.create_future()

    async def collect(msg: Msg) -> None:
        if ended.done():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "404":
            ended.set_result(True)
        elif status == "204":
            ended.set_result(False)
        elif status:
            ended.set_exception(LogReadError(f"reading {subject}: status {status}"))
        elif (seq := headers.get("Nats-Sequence")) is None:
            ended.set_exception(LogReadError(f"reading {subject}: a message without a sequence"))
        elif named is None:
            out.append((int(seq), headers, msg.data))
        elif named:
            out.append((int(seq), headers.get("Nats-Subject", ""), msg.data))
        else:
            out.append((int(seq), msg.data))

    sub = await nc.subscribe(nc.new_inbox(), cb=collect)
    try:
        while True:
            batch = _BATCH if limit is None else min(_BATCH, limit - len(out))
            if batch <= 0:
                return out
            before = len(out)
            ended = loop.create_future()
            request = {"seq": start, "next_by_subj": subject, "batch": batch}
            await nc.publish(api, json.dumps(request).encode(), reply=sub.subject)
            await _batch_end(ended, out)
            if ended.result() or len(out) - before < batch:
                return out
            start = out[-1][0] + 1
    finally:
        if not ended.done():
            ended.cancel()
        await sub.unsubscribe()


async def _batch_end(ended: asyncio.Future[Any], found: Sized) -> None:
    """Wait for a batched direct get's end marker: as long as messages keep coming (``found``
    grows), however long the batch takes; a wait of ``_TIMEOUT`` with none raises
    :class:`nats.errors.TimeoutError`."""
    while True:
        seen = len(found)
        done, _ = await asyncio.wait((ended,), timeout=_TIMEOUT)
        if done:
            return
        if len(found) == seen:
            ended.cancel()
            raise nats.errors.TimeoutError


SCAN_BYTES = 4 * 1024 * 1024
"""Bytes of messages one batch of :func:`scan_headers` asks for at most."""


async def scan_headers(
    nc: Client, stream: str, subject: str, after: int = 0, *, max_bytes: int = SCAN_BYTES
) -> AsyncIterator[list[tuple[int, dict[str, str]]]]:
    """(stream sequence, headers) of every message of ``subject`` after ``after``, a
    batch at a time, by batched direct gets (the stream needs ``allow_direct``): each
    batch asks for at most ``max_bytes``, and only the headers are kept, so a scan of a
    stream of any size holds one batch's headers at a time.

    The replica that answers may be behind the stream's leader (a replicated stream's
    followers answer direct gets once nearly caught up): what the leader stored after the
    last message a scan saw is for the caller to read from the leader.
    """
    async for batch in _scan(nc, stream, subject, after, max_bytes, lambda s, h, _: (s, h)):
        yield batch


async def scan_messages(
    nc: Client, stream: str, subject: str, after: int = 0, *, max_bytes: int = SCAN_BYTES
) -> AsyncIterator[list[tuple[int, str, bytes]]]:
    """(stream sequence, subject, payload) of every message of ``subject`` after
    ``after``, a batch of at most ``max_bytes`` at a time (see :func:`scan_headers`): what
    reads a bucket whose values a party's data fills (trigger windows, slots) holds one
    batch at a time, where :func:`read_messages` holds them all."""

    def keep(seq: int, headers: dict[str, str], data: bytes) -> tuple[int, str, bytes]:
        return seq, headers.get("Nats-Subject", ""), data

    async for batch in _scan(nc, stream, subject, after, max_bytes, keep):
        yield batch


async def _scan(
    nc: Client,
    stream: str,
    subject: str,
    after: int,
    max_bytes: int,
    keep: Callable[[int, dict[str, str], bytes], _T],
) -> AsyncIterator[list[_T]]:
    api = f"{js_api(nc)}.DIRECT.GET.{stream}"
    loop = asyncio.get_running_loop()
    found: list[_T] = []
    # Resolved at the end of each batch: the sequence to go on after, None at the end.
    ended: asyncio.Future[int | None] = loop.create_future()

    async def collect(msg: Msg) -> None:
        if ended.done():
            return
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "404":
            ended.set_result(None)
        elif status == "204":
            pending = headers.get("Nats-Num-Pending", "0")
            last = int(headers.get("Nats-Last-Sequence", "0") or 0)
            ended.set_result(None if pending == "0" or not last else last)
        elif status:
            ended.set_exception(LogReadError(f"scanning {subject}: status {status}"))
        elif (seq := headers.get("Nats-Sequence")) is None:
            ended.set_exception(LogReadError(f"scanning {subject}: a message without a sequence"))
        else:
            found.append(keep(int(seq), headers, msg.data))

    sub = await nc.subscribe(nc.new_inbox(), cb=collect)
    try:
        start: int | None = after
        while start is not None:
            ended = loop.create_future()
            request = {
                "seq": start + 1,
                "next_by_subj": subject,
                "batch": _BATCH,
                "max_bytes": max_bytes,
            }
            await nc.publish(api, json.dumps(request).encode(), reply=sub.subject)
            await _batch_end(ended, found)
            start = ended.result()
            batch, found = found, []
            if batch:
                yield batch
    finally:
        if not ended.done():
            ended.cancel()
        await sub.unsubscribe()
