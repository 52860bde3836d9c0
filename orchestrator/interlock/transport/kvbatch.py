"""Several keys of one KV bucket written at once, each only if unchanged since it was read.

A KV bucket is a stream (``KV_<bucket>``), so an atomic batch (ADR-50, the bucket's stream
made with ``allow_atomic``) writes several of its keys all or nothing, and
``Nats-Expected-Last-Subject-Sequence`` on each message makes each write a compare-and-set
on its key's revision: the multi-key compare-and-set NATS KV has no call for.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from interlock.transport.errors import JetStreamAPIError
from interlock.transport.jetstream import jetstream
from interlock.transport.kvread import kv_prefix

_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST_SEQUENCE = 10071


class _Ack(msgspec.Struct):
    seq: int = 0
    count: int = 0
    error: dict[str, Any] | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode

Write = tuple[str, bytes | None, int]
"""A key, its new value (None: deleted), and the revision it must still have (0: none)."""


async def put_all(
    kv: KeyValue, writes: Sequence[Write], *, ack_wait: float = 5.0, gone_kept_s: int = 0
) -> int:
    """Write every key or none; the revision of the first (the others follow it, one by
    one: a batch is stored with consecutive sequences). ``gone_kept_s``: a delete's marker
    goes after that many seconds (``Nats-TTL``; 0: it stays), so that keys deleted once
    and never written again do not pile up in the bucket.

    Raises:
        KeyWrongLastSequenceError: a key was written since it was read; nothing is stored.
        JetStreamAPIError: any other refusal (a bucket without atomic batches...).
    """
    if not writes:
        return 0
    nc, prefix = kv._js._nc, kv_prefix(kv)
    batch_id = uuid.uuid4().hex
    last = len(writes) - 1
    for index, (key, value, revision) in enumerate(writes):
        headers = {_EXPECTED: str(revision)}
        if value is None:
            headers["KV-Operation"] = "DEL"
            if gone_kept_s:
                headers["Nats-TTL"] = f"{gone_kept_s}s"
        if last:
            headers["Nats-Batch-Id"] = batch_id
            headers["Nats-Batch-Sequence"] = str(index + 1)
        subject, data = f"{prefix}{key}", value or b""
        if index < last:
            # Only the commit is acknowledged: one round trip for the whole batch.
            await nc.publish(subject, data, headers=headers)
            continue
        if last:
            headers["Nats-Batch-Commit"] = "1"
        try:
            reply = await jetstream(nc).request_ack(
                subject, data, headers=headers, ack_wait=ack_wait
            )
        except (NoRespondersError, NatsTimeoutError) as exc:
            raise JetStreamAPIError(f"write of {key!r}", {"description": str(exc)}) from exc
        ack = _decode_ack(reply.data)
        if ack.error:
            if ack.error.get("err_code") == _WRONG_LAST_SEQUENCE:
                raise KeyWrongLastSequenceError(description=ack.error.get("description"))
            raise JetStreamAPIError(f"write of {key!r}", ack.error)
        return ack.seq - last
    raise AssertionError("unreachable")


async def delete_key(kv: KeyValue, key: str, *, kept_s: int, last: int = 0) -> None:
    """Delete ``key``, its marker gone after ``kept_s`` seconds (``Nats-TTL``): nats-py's
    ``delete`` leaves one for good, and its ``purge`` (which may carry a TTL) needs
    rollups, which no bucket here takes. ``last``: only if the key is still at that
    revision (else KeyWrongLastSequenceError)."""
    headers = {"KV-Operation": "DEL", "Nats-TTL": f"{kept_s}s"}
    if last:
        headers[_EXPECTED] = str(last)
    try:
        await kv._js.publish(f"{kv_prefix(kv)}{key}", b"", headers=headers)
    except APIError as exc:
        if exc.err_code == _WRONG_LAST_SEQUENCE:
            raise KeyWrongLastSequenceError(description=exc.description) from exc
        raise
