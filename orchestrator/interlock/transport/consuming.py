"""What every consumer of Interlock's streams does the same way: make sure of its durable
consumer through a JetStream outage, and write a dead letter for a message it cannot handle.
(Reading consumers: :mod:`interlock.transport.pulling`.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from interlock.core.vocabulary import InterlockError
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.pulling import BatchReader

_log = logging.getLogger("interlock.consuming")

STREAM_NOT_FOUND = 10059
"""JetStream's error code for a missing stream (a missing consumer has another)."""


class ConsumerMismatch(RuntimeError, InterlockError):
    """A durable consumer of that name exists with another filter subject."""


async def ensure_consumer(
    js: JetStreamContext,
    stream: str,
    config: ConsumerConfig,
    *,
    update: bool = False,
    log: logging.Logger | None = None,
) -> ConsumerInfo:
    """Make sure the durable pull consumer ``config`` describes exists on ``stream``.

    Missing: it is created (two processes creating it at once both end up bound to the one
    that won). Present: with ``update``, its settings are brought up to date (a consumer
    whose ack policy is not explicit cannot change in place: it is recreated from its ack
    floor, so nothing acknowledged comes again and nothing unacknowledged is skipped);
    without, it is used as it is, as long as it filters the same subject.

    Raises:
        ConsumerMismatch: without ``update``, the consumer filters another subject.
        nats.js.errors.NotFoundError: the stream does not exist (``err_code`` is
            :data:`STREAM_NOT_FOUND`).
    """
    durable = config.durable_name
    assert durable is not None, "a durable consumer needs a name"
    try:
        info: ConsumerInfo | None = await js.consumer_info(stream, durable)
    except NotFoundError as exc:
        if exc.err_code == STREAM_NOT_FOUND:
            raise
        info = None
    if info is not None and update and info.config.ack_policy != AckPolicy.EXPLICIT:
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        (log or _log).warning(
            "%s: recreating the consumer with explicit acks from %d", durable, floor
        )
        await js.delete_consumer(stream, durable)
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = floor + 1
        info = None
    if info is None:
        try:
            return await js.add_consumer(stream, config)
        except BadRequestError:
            # Another process created it at the same time, with another configuration.
            info = await js.consumer_info(stream, durable)
    if update:
        if abs((info.config.ack_wait or 0) - (config.ack_wait or 0)) > 0.001:
            return await js.add_consumer(stream, config)
        return info
    if info.config.filter_subject != config.filter_subject:
        raise ConsumerMismatch(
            f"consumer {durable} on {stream} filters {info.config.filter_subject!r}, not "
            f"{config.filter_subject!r}"
        )
    return info


async def until_done(
    attempt: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
    name: str,
    log: logging.Logger,
) -> None:
    """Run ``attempt`` until it succeeds, backing off while JetStream cannot answer (a
    leader election, a server restart): a consumer loop must not end because it started
    at a bad time. Once ``stopping`` is set, a failure is raised instead."""
    wait = 0.5
    while True:
        try:
            await attempt()
        except Exception as exc:
            if stopping.is_set():
                raise
            log.warning("%s: cannot subscribe yet (%s); retrying in %.1fs", name, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 10.0)
        else:
            return


_DEAD_LETTER_LOWER = "interlock-dead-letter-"


def dead_letter_headers(msg: Msg, reason: str, detail: str) -> dict[str, str]:
    """The headers of a dead letter about ``msg`` (the orchestrator's and the workers' alike).

    Without the message's own JetStream headers: its ``Nats-Msg-Id`` would make the
    dead-letter stream drop a second letter about the same message, and others
    (``Nats-Expected-*``, ``Nats-Rollup``, ``Nats-TTL``) would act on the dead-letter
    stream. The caller adds its own ``Nats-Msg-Id``. Nor its own ``Interlock-Dead-Letter-``
    headers, in any case: a sender could make its letter look truncated (and so not
    redrivable) or name another subject for its redrive.
    """
    headers = {
        k: v
        for k, v in (msg.headers or {}).items()
        if not k.startswith("Nats-") and not k.lower().startswith(_DEAD_LETTER_LOWER)
    }
    headers["Interlock-Dead-Letter-Reason"] = reason
    headers["Interlock-Dead-Letter-Detail"] = detail[:1000]
    headers["Interlock-Dead-Letter-Subject"] = msg.subject
    return headers


def dead_letter_id(msg: Msg, reason: str, detail: str | None = None) -> str | None:
    """The ``Nats-Msg-Id`` of a dead letter about ``msg``, so that a redelivered message
    is dead-lettered once: its stream and its sequence there, then the ``reason`` (the
    agents' letters, as docs/agents-any-language.md has every agent write them) or, given
    the ``detail``, a digest of both and of the instant the stream stored the message
    (the orchestrator's). That instant is the same at every delivery, and its sender is
    not told it: agents write the dead-letter stream too, and a digest of the reason and
    detail alone let one send a letter under the id of the orchestrator's letter about its
    refused answer first, which dropped it. None for a message with no JetStream metadata
    (a core message): no dedupe id, nothing else lost."""
    try:
        where = f"{msg.metadata.stream}.{msg.metadata.sequence.stream}"
    except Exception:  # noqa: BLE001
        return None
    if detail is None:
        return f"{where}.{reason}"
    stored = _stored_ns(msg.reply)
    digest = hashlib.sha256(f"{reason}\n{detail}\n{stored}".encode()).hexdigest()[:16]
    return f"{where}.{digest}"


def _stored_ns(reply: str) -> str:
    """The nanosecond a delivered message was stored, as its acknowledgement subject names
    it (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>``,
    or with the domain and account hash before the stream, as nats-py reads it)."""
    tokens = reply.split(".")
    return tokens[7] if len(tokens) == 9 else tokens[Msg.Ack.Timestamp]


def dead_letter(
    msg: Msg,
    reason: str,
    detail: str,
    max_payload: int,
    *,
    digest: bool = False,
    extra: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], bytes]:
    """The headers and data of a dead letter about ``msg``: :func:`dead_letter_headers`,
    then ``extra`` (who wrote it), then the ``Nats-Msg-Id`` of :func:`dead_letter_id`
    (``digest``: the orchestrator's form), and what :func:`dead_letter_data` keeps of the
    message for a server whose payload limit is ``max_payload``."""
    headers = dead_letter_headers(msg, reason, detail)
    if extra:
        headers.update(extra)
    msg_id = dead_letter_id(msg, reason, detail if digest else None)
    if msg_id is not None:  # a redelivered message: one letter
        headers["Nats-Msg-Id"] = msg_id
    return headers, dead_letter_data(msg.data, headers, max_payload)


DEAD_LETTER_RETRY_S = 30.0
"""How soon a message whose dead letter could not be stored is delivered again."""


async def dead_letter_and_settle(
    msg: Msg,
    store: Callable[[], Awaitable[object]],
    *,
    term: bool = False,
    retry_s: float = DEAD_LETTER_RETRY_S,
) -> bool:
    """Settle ``msg`` after ``store()`` dead-letters it: acked (``term``: terminated) once
    its dead letter is stored; when it cannot be stored (``store`` raises; it says why),
    handed back for another try in ``retry_s`` seconds, never dropped, since it is stored
    nowhere else yet. Both best effort: a message left unsettled comes again after its
    ack wait. True once the dead letter is stored."""
    try:
        await store()
    # Not stored anywhere else yet: keep it, and try again later.
    except Exception:  # noqa: BLE001
        with contextlib.suppress(Exception):
            await msg.nak(delay=retry_s)
        return False
    with contextlib.suppress(Exception):
        await (msg.term() if term else msg.ack())
    return True


DEAD_LETTER_KEPT = 16 * 1024
"""Bytes of a message kept in its dead letter when the whole would not fit in one."""
_HEADER_ROOM = 8 * 1024


def dead_letter_data(data: bytes, headers: dict[str, str], max_payload: int) -> bytes:
    """What a dead letter keeps of a message's ``data``: all of it when it fits in one
    NATS message beside the dead-letter headers, else its first ``DEAD_LETTER_KEPT`` bytes,
    with ``Interlock-Dead-Letter-Truncated`` (the original size) added to ``headers``.

    A message near the server's payload limit would otherwise make the dead letter itself
    too large to publish, and its consumer would keep it (and retry it) forever."""
    room = max_payload - _HEADER_ROOM - sum(len(k) + len(v) + 4 for k, v in headers.items())
    if len(data) <= room:
        return data
    headers["Interlock-Dead-Letter-Truncated"] = str(len(data))
    return data[:DEAD_LETTER_KEPT]


async def durable_reader(
    nc: Client,
    js: JetStreamContext,
    *,
    stream: str,
    subject: str,
    durable: str,
    size: int,
    max_ack_pending: int,
    ack_wait: float,
    stopping: asyncio.Event,
    log: logging.Logger,
) -> BatchReader:
    """A durable pull consumer, made sure of (now, and again whenever the pull finds it
    gone), read in batches of up to ``size``.

    Every message is acked on its own (explicit ack policy): with "ack all", one process
    acking a later message would ack those another process (since killed) had taken and
    not yet handled, and they would be lost.
    """

    async def ensure() -> None:
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=subject,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
            deliver_policy=DeliverPolicy.ALL,
        )

        async def attempt() -> None:
            await ensure_consumer(js, stream, config, update=True, log=log)

        await until_done(attempt, stopping, durable, log)

    await ensure()
    return BatchReader(
        nc, stream=stream, consumer=durable, filter_subject=subject, size=size, ensure=ensure
    )


@contextlib.asynccontextmanager
async def in_progress(msgs: Sequence[Msg], every: float) -> AsyncIterator[None]:
    """While a batch is handled, tell JetStream it is, every ``every`` seconds (a slow
    batch is not redelivered)."""

    async def progress() -> None:
        while True:
            await asyncio.sleep(every)
            for msg in msgs:
                try:
                    await msg.in_progress()
                # A missed progress ack costs a redelivery.
                except Exception:  # noqa: BLE001
                    _log.debug("progress ack failed", exc_info=True)

    ticker = asyncio.create_task(progress())
    try:
        yield
    finally:
        ticker.cancel()


class Overlap:
    """Handles a batch's messages together, and lets the consumer loop fetch the next batch
    while the slow ones of the last are still being handled.

    A message still in hand ``after`` seconds (a costly evaluation waiting for its thread,
    say) goes on by itself, with its own progress acks, and settles its message when done;
    at most ``limit`` such messages at a time (beyond, the batch waits for its own, as any
    batch did), so what is held stays bounded. One hostile message then holds up only its
    own run, not every message published after it.
    """

    def __init__(self, *, limit: int, after: float, every: float) -> None:
        self.limit = limit
        self.after = after
        self.every = every
        self.slow = 0
        """Messages of earlier batches still in hand."""
        self._finishing: set[asyncio.Task[None]] = set()

    async def handle(self, msgs: Sequence[Msg], handle: Callable[[Msg], Awaitable[None]]) -> None:
        """``handle(msg)`` for each message (it settles the message and never raises);
        returns once they are done, or once the slow ones are left to finish by themselves."""
        tasks = {asyncio.ensure_future(handle(m)): m for m in msgs}
        try:
            _, slow = await asyncio.wait(tasks, timeout=self.after)
            if slow and self.slow + len(slow) > self.limit:
                await asyncio.wait(slow)
                return
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        if not slow:
            return
        self.slow += len(slow)
        finishing = asyncio.create_task(self._finish(slow, [tasks[t] for t in slow]))
        self._finishing.add(finishing)
        finishing.add_done_callback(self._finishing.discard)

    async def _finish(self, slow: set[asyncio.Task[None]], msgs: Sequence[Msg]) -> None:
        try:
            async with in_progress(msgs, self.every):
                await asyncio.wait(slow)
        except asyncio.CancelledError:
            for task in slow:
                task.cancel()
            raise
        finally:
            self.slow -= len(slow)

    async def close(self) -> None:
        """Stop what is still in hand (its messages come again after their ack wait)."""
        await cancel_and_wait(*self._finishing)
