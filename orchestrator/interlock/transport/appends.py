"""Atomic appends to a run log.

``append_batch`` appends several records to one run subject in one atomic batch
(ADR-50: ``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit``), guarded by
``Nats-Expected-Last-Subject-Sequence`` so that concurrent writers cannot interleave;
``append_soon`` sends one such append without waiting to be able to send it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from interlock.transport.errors import AppendConflict, JetStreamAPIError
from interlock.transport.jetstream import connection, jetstream

__all__ = ["MAX_BATCH", "append_batch", "append_soon"]

MAX_BATCH: Final = 1000  # the server's limit on messages in one atomic batch

# JetStream API error code (nats-server errors.json).
_ERR_WRONG_LAST_SEQUENCE: Final = 10071
_EXPECTED_LAST_SUBJECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    batch: str = ""
    count: int = 0
    error: dict[str, Any] | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


async def append_batch(
    js_or_nc: JetStreamContext | Client,
    subject: str,
    payloads: Sequence[tuple[dict[str, str], bytes]],
    expected_last_subject_seq: int | None,
    *,
    ack_wait: float = 5.0,
) -> int:
    """Append ``payloads`` (headers, data) to ``subject``, all or nothing.

    With ``expected_last_subject_seq`` set, the append only happens if the subject's last
    message is at that stream sequence (0: the subject is empty). Several messages go as
    one atomic batch: the server stores them with consecutive sequences or not at all.

    Returns:
        The stream sequence of the last message appended.

    Raises:
        AppendConflict: the subject moved past ``expected_last_subject_seq``; nothing
            of the batch is stored.
        JetStreamAPIError: any other refusal (no stream, stream without atomic publish...).
    """
    if not payloads:
        raise ValueError("append_batch needs at least one message")
    if len(payloads) > MAX_BATCH:
        raise ValueError(f"an atomic batch holds at most {MAX_BATCH} messages")
    nc = js_or_nc if isinstance(js_or_nc, Client) else connection(js_or_nc)
    last = len(payloads) - 1
    batch_id = uuid.uuid4().hex if last else ""
    for index, (headers, data) in enumerate(payloads):
        hdrs = dict(headers)
        if index == 0 and expected_last_subject_seq is not None:
            hdrs[_EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_subject_seq)
        if batch_id:
            hdrs["Nats-Batch-Id"] = batch_id
            hdrs["Nats-Batch-Sequence"] = str(index + 1)
        if index < last:
            # Only the commit is acknowledged: one round trip for the whole batch.
            await nc.publish(subject, data, headers=hdrs)
            continue
        if batch_id:
            hdrs["Nats-Batch-Commit"] = "1"
        try:
            reply = await jetstream(nc).request_ack(subject, data, headers=hdrs, ack_wait=ack_wait)
        except NoRespondersError as exc:
            raise JetStreamAPIError(f"append to {subject!r}", {"description": _NO_STREAM}) from exc
        except NatsTimeoutError as exc:
            raise JetStreamAPIError(
                f"append to {subject!r}", {"description": f"no acknowledgement in {ack_wait:g} s"}
            ) from exc
        return _appended(subject, reply, expected_last_subject_seq)
    raise AssertionError("unreachable")


_NO_STREAM = (
    "no stream answered: none stores this subject, or its stream has no leader yet "
    "(an election after a node's loss)"
)
"""Why an append got no answer from JetStream at all (no responders)."""


def _appended(subject: str, reply: Msg, expected: int | None) -> int:
    ack = _decode_ack(reply.data)
    if ack.error:
        if ack.error.get("err_code") == _ERR_WRONG_LAST_SEQUENCE:
            raise AppendConflict(subject, expected, ack.error["description"])
        raise JetStreamAPIError(f"append to {subject!r}", ack.error)
    return ack.seq


def append_soon(
    nc: Client, subject: str, data: bytes, expected_last_subject_seq: int
) -> Callable[[], Awaitable[int]] | None:
    """:func:`append_batch` of one message, sent now in one plain call: what it returns,
    called, is awaited for the sequence (or the same errors). None, with nothing sent,
    where the publish would have to wait: the caller awaits :func:`append_batch`."""
    headers = {_EXPECTED_LAST_SUBJECT_SEQ: str(expected_last_subject_seq)}
    sent = jetstream(nc).request_ack_soon(subject, data, headers=headers)
    if sent is None:
        return None
    future = sent

    async def appended() -> int:
        try:
            reply = await future
        except NatsTimeoutError as exc:
            raise JetStreamAPIError(
                f"append to {subject!r}", {"description": "no acknowledgement in time"}
            ) from exc
        if reply.headers and reply.headers.get("Status") == "503" and not reply.data:
            raise JetStreamAPIError(f"append to {subject!r}", {"description": _NO_STREAM})
        return _appended(subject, reply, expected_last_subject_seq)

    return appended
