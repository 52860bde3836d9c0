"""The orchestrator's consumer loops and what they do with each message.

A loop reads a durable pull consumer in batches (:mod:`interlock.transport.pulling`),
telling JetStream a slow batch is still in hand, and hands each message to its handler:
handled and acked, retried later with a growing delay, deferred (a delivery, not a
failure), or dead-lettered with its reason once another delivery could not help or it has
failed :data:`MAX_DELIVERIES` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core.ids import InvalidRunId
from interlock.core.objects import ObjectError
from interlock.runtime.fairness import Deferred
from interlock.runtime.logstore import RecordsTooLarge
from interlock.runtime.observe import Observers
from interlock.transport.consuming import (
    Overlap,
    dead_letter,
    dead_letter_and_settle,
    durable_reader,
    in_progress,
)
from interlock.transport.jetstream import JetStream
from interlock.transport.natsclient import ack_nowait
from interlock.transport.pulling import BatchReader, deliveries, stream_sequence
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

MAX_DELIVERIES = 10
"""A message that fails this often is dead-lettered instead of retried forever."""
ACK_WAIT = 10.0
"""Default ack wait of the orchestrator's consumers: how long the messages a killed
orchestrator had taken wait before another process gets them. Slow batches send progress
acks, so this bounds recovery after a crash, not the time a batch may take."""
FETCH_BATCH = 128
SLOW_AFTER_S = 0.2
"""A message still in hand this long after its batch was fetched is left to finish by
itself while the next batch is fetched (a costly evaluation waiting for its thread)."""
SLOW_HELD = 2 * FETCH_BATCH
"""Messages of earlier batches a consumer loop may hold in hand so (beyond, it waits)."""
DEFERRALS_KEPT = 20_000
"""Deferred events whose deferrals are remembered (an event deferred by another replica,
or forgotten here, counts its deferrals as deliveries)."""


FINAL = (RecordsTooLarge, InvalidRunId, ObjectError)
"""What a handler raises for a message another delivery would fail on the same way."""


def final_reason(exc: Exception) -> str:
    """The dead-letter reason of a :data:`FINAL` failure."""
    if isinstance(exc, RecordsTooLarge):
        return "too-large"
    return exc.reason if isinstance(exc, ObjectError) else "bad-run-id"


class MessageHandling:
    """The consumer loops of one orchestrator process: reading, settling, dead-lettering."""

    def __init__(
        self,
        nc: Client,
        js: JetStream,
        subjects: Subjects,
        *,
        observers: Observers,
        counters: Counter[str],
        ack_wait: float,
        stopping: asyncio.Event,
    ) -> None:
        self.nc, self.js, self.subjects = nc, js, subjects
        self.observers, self.counters = observers, counters
        self.ack_wait = ack_wait
        """Seconds before a message taken by a process that died is handed out again."""
        self.stopping = stopping
        """Set when the orchestrator stops: the loops end."""
        self._deferrals: OrderedDict[tuple[str, int], int] = OrderedDict()
        """Times each message was deferred, by consumer and stream sequence (the latest)."""

    async def consume(
        self,
        stream: str,
        subject: str,
        durable: str,
        handler: Callable[[Msg], Awaitable[None]],
        *,
        before: Callable[[], None] | None = None,
    ) -> None:
        """``before``: called as each fetched batch is handed over, before its messages."""
        reader = await self.reader(stream, subject, durable, FETCH_BATCH, 10_000)
        # aclosing: the reader stops (and hands back what it holds) in this task, at once,
        # however the loop ends, not whenever the generator happens to be collected.
        overlap = Overlap(limit=SLOW_HELD, after=SLOW_AFTER_S, every=self.ack_wait / 3)

        async def guarded(msg: Msg) -> None:
            await self.guarded(handler, msg, durable)

        try:
            async with contextlib.aclosing(reader.batches(self.stopping)) as batches:
                async for msgs in batches:
                    async with self.working(msgs):
                        if before is not None:
                            before()
                        await overlap.handle(msgs, guarded)
        finally:
            await overlap.close()

    async def reader(
        self, stream: str, subject: str, durable: str, size: int, max_ack_pending: int
    ) -> BatchReader:
        """The durable consumer, made sure of, read in batches of up to ``size``."""
        return await durable_reader(
            self.nc,
            self.js,
            stream=stream,
            subject=subject,
            durable=durable,
            size=size,
            max_ack_pending=max_ack_pending,
            ack_wait=self.ack_wait,
            stopping=self.stopping,
            log=log,
        )

    def working(self, msgs: Sequence[Msg]) -> contextlib.AbstractAsyncContextManager[None]:
        """While a batch is handled, tell JetStream it is (a slow batch is not redelivered)."""
        return in_progress(msgs, self.ack_wait / 3)

    async def guarded(
        self, handler: Callable[[Msg], Awaitable[None]], msg: Msg, where: str
    ) -> None:
        """One message: handled and acked, retried later, or dead-lettered. Never raises."""
        # A deferral is a delivery to JetStream, not a failure: neither a redelivery to
        # count nor a step towards the dead letter.
        key = (where, stream_sequence(msg))
        delivered = deliveries(msg) - self._deferrals.get(key, 0)
        if delivered > 1:
            self.observers.redelivered(where)
        try:
            await handler(msg)
            if not ack_nowait(msg):
                await msg.ack()
            self._deferrals.pop(key, None)
        except Deferred as deferred:
            self.counters["events_deferred"] += 1
            self.observers.deferred()
            self._deferrals[key] = self._deferrals.pop(key, 0) + 1
            if len(self._deferrals) > DEFERRALS_KEPT:
                self._deferrals.popitem(last=False)
            # Best effort: a message left unsettled comes again after its ack wait.
            with contextlib.suppress(Exception):
                await msg.nak(delay=deferred.delay)
        except FINAL as exc:
            # Another delivery would fail the same way: dead-letter it at once.
            reason = final_reason(exc)
            log.warning("%s: dead-lettering (%s): %s", where, reason, exc)
            await dead_letter_and_settle(msg, partial(self.dead_letter, msg, reason, str(exc)))
        # A consumer loop outlives any one message.
        except Exception as exc:  # noqa: BLE001
            if delivered >= MAX_DELIVERIES:
                # The reason is the message: no traceback.
                log.error("%s: dead-lettering after %d attempts: %s", where, delivered, exc)  # noqa: TRY400
                failed = partial(self.dead_letter, msg, "processing-failed", str(exc))
                await dead_letter_and_settle(msg, failed)
            else:
                log.warning("%s: will retry (%d): %s", where, delivered, exc)
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    # About two minutes in all before giving up: longer than a JetStream
                    # leader election (4-7 s) or a server restart.
                    await msg.nak(delay=min(0.5 * 2**delivered, 30.0))

    async def dead_letter(self, msg: Msg, reason: str, detail: str) -> None:
        headers, data = dead_letter(msg, reason, detail, self.nc.max_payload, digest=True)
        self.counters[f"dead_lettered:{reason}"] += 1
        self.observers.dead_lettered(reason)
        try:
            await self.js.publish(self.subjects.dead_letter(reason), data, headers=headers)
        except Exception as exc:
            # Raised on: the message is acked only once its dead letter is stored.
            # The reason is the message: no traceback.
            log.error("could not dead-letter a message (%s): %s", reason, exc)  # noqa: TRY400
            raise
