"""Reading a KV bucket: every key's current value, or the keys under a filter, by direct
gets (no consumer)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from interlock.transport.directget import read_messages, scan_messages


def kv_prefix(kv: KeyValue) -> str:
    """The subject prefix of a key-value bucket's keys (``$KV.<bucket>.``, or its
    account's import): nats-py keeps it in a private attribute."""
    return str(kv._pre)


async def bucket_values(kv: KeyValue, pattern: str = ">") -> dict[str, bytes]:
    """Every key of a KV bucket (under ``pattern``) with its current value, read in one
    pass.

    See :func:`_fold` for how; the read ends at the bucket's newest record, looked up
    first (a workflow just applied is there when ``start`` reads the bucket next).
    """
    newest = await newest_revision(kv)
    if newest is None:
        return {}
    return await _fold(kv, pattern, newest)


SCAN_BYTES = 1 << 20
"""Bytes of records one batch of :func:`scan_bucket` asks for at most (a record larger
than that comes alone)."""


async def scan_bucket(
    kv: KeyValue, pattern: str = ">", after: int = 0
) -> AsyncIterator[tuple[int, str, bytes]]:
    """Each record of a key under ``pattern`` after revision ``after``: its revision, its
    key and its value (``b""``: deleted), in the bucket's order, read a batch of bounded
    size at a time (no consumer), so a reader holds one batch, not the bucket. A key
    written again during the scan may come twice, the later value last: a caller keeps
    what it makes of each key, the last one. In a bucket that keeps one record per key,
    the records after ``after`` are one per key changed since, however often it changed."""
    prefix = kv_prefix(kv)
    subject = f"{prefix}{pattern}"
    nc = kv._js._nc
    async for batch in scan_messages(nc, kv._stream, subject, after, max_bytes=SCAN_BYTES):
        for revision, name, value in batch:
            yield revision, name[len(prefix) :], value


async def named_bucket_values(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    """:func:`bucket_values` of the bucket named ``bucket`` without binding it first: its
    stream's info (one request, where a handle and then its status make two) gives the
    newest record, and an empty bucket needs no more. Raises ``NotFoundError`` when there
    is no such bucket."""
    stream = f"KV_{bucket}"
    state = (await js.stream_info(stream)).state
    if not state.messages:
        return {}
    return await _fold_stream(js._nc, stream, f"$KV.{bucket}.", ">", state.last_seq)


async def stored_keys(kv: KeyValue, pattern: str) -> list[str]:
    """The keys matching ``pattern`` (a key filter: ``wf.default.echo.*``) that hold a
    value, sorted."""
    return sorted(await _fold(kv, pattern, None))


async def _fold(kv: KeyValue, pattern: str, newest: int | None) -> dict[str, bytes]:
    """The keys under ``pattern`` with their values: the bucket's records, oldest first,
    read by batched direct gets (:func:`~interlock.transport.directget.read_messages`), the
    last record of each key winning; a delete or purge marker (no value) removes its key.

    No consumer is made. A watch (an ordered consumer) stays on the server for its
    inactivity threshold after it is stopped, and a stream takes at most 1,000 consumers:
    one-shot reads as watches (``GET /agents``, the console, the CLI, the metrics) left
    that many behind within minutes of polling, and then every new watch of the bucket,
    the orchestrator's own among them, was refused. A watch's "nothing pending" marker
    can also come before the records, so a read that stopped there missed keys.

    ``newest``: the bucket's newest revision; the read goes on once if a replica that
    answered had not reached it yet (a record aged out since leaves it short, and that is
    all there is).
    """
    return await _fold_stream(kv._js._nc, kv._stream, kv_prefix(kv), pattern, newest)


async def _fold_stream(
    nc: Client, stream: str, prefix: str, pattern: str, newest: int | None
) -> dict[str, bytes]:
    """:func:`_fold` of a bucket's stream and key prefix."""
    records = await read_messages(nc, stream, f"{prefix}{pattern}")
    if newest is not None and records and records[-1][0] < newest:
        records += await read_messages(nc, stream, f"{prefix}{pattern}", records[-1][0])
    values: dict[str, bytes] = {}
    for _, subject, value in records:
        key = subject[len(prefix) :]
        if value:
            values[key] = value
        else:
            values.pop(key, None)
    return values


async def newest_revision(kv: KeyValue) -> int | None:
    """The stream sequence of the bucket's newest stored record (None when it is empty).

    Every record of a bucket is on its stream's subjects, so the stream's last sequence is
    the newest record's revision; the bucket's status (a stream info request, which binding
    the bucket already makes) holds it.
    """
    state = (await kv.status()).stream_info.state
    return state.last_seq if state.messages else None


async def read_key(kv: KeyValue, key: str) -> tuple[bytes, int]:
    """A key's value and revision; no value, and the revision of its delete marker (0:
    never written), when it has none: a write must name that revision to be accepted."""
    try:
        found = await kv.get(key)
    except KeyNotFoundError as exc:
        deleted = getattr(exc, "entry", None)
        return b"", int(getattr(deleted, "revision", 0) or 0)
    return found.value or b"", found.revision or 0
