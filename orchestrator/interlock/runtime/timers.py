"""Durable timers: a run's ``timer.scheduled`` records become due ``timer.fired`` events.

Two adapters of one port, tested by the same contract suite:

- :class:`JetStreamTimers` uses JetStream message scheduling (nats-server 2.12+): the
  relay publishes a message with ``Nats-Schedule: @at <time>`` to the TIMERS stream, and
  the server stores it on ``<prefix>.timers.fired.<run_id>`` when it is due. The schedule
  lives in the stream, so it survives any orchestrator restart, and a durable consumer
  delivers each fired timer at least once (the run ignores a timer it has already taken).
- :class:`ClockTimers` keeps timers in memory against a :class:`ManualClock` that tests
  advance: a 24-hour timeout is tested in milliseconds, with no sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from interlock.core.ids import is_run_id
from interlock.core.rfc3339 import format_time, parse_time
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.consuming import (
    dead_letter,
    dead_letter_and_settle,
    ensure_consumer,
    in_progress,
    until_done,
)
from interlock.transport.jetstream import jetstream
from interlock.transport.pulling import BatchReader, deliveries
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.timers")

Deliver = Callable[[str, str], Awaitable[None]]
"""Called with (run_id, timer_id) when a timer is due."""


class Timers(Protocol):
    """The timers port: durable one-shot timers, each delivered at least once when due.

    Scheduling the same ``timer_id`` twice schedules it once. Contract suite:
    ``tests/runtime/test_timers_contract.py``, run against both adapters.
    """

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        """Deliver ``(run_id, timer_id)`` at ``fire_at`` (RFC 3339), or soon after."""
        ...

    def start(self, deliver: Deliver) -> None:
        """Start delivering due timers to ``deliver``."""
        ...

    async def stop(self) -> None:
        """Stop delivering; timers not yet due stay scheduled (where durable)."""
        ...


class ManualClock:
    """A clock that moves only when told to (for tests and replays of time)."""

    def __init__(self, start: str = "2026-01-01T00:00:00Z") -> None:
        self._now = parse_time(start)

    def __call__(self) -> str:
        return format_time(self._now)

    def advance_to(self, moment: datetime) -> None:
        self._now = max(self._now, moment)

    @property
    def moment(self) -> datetime:
        return self._now


MAX_TIMER_MESSAGE = 4096
"""A fired timer's body is ``{"run_id", "timer_id"}``: a few hundred bytes."""


def read_fired(subject: str, data: bytes) -> tuple[str, str]:
    """The (run id, timer id) of a fired-timer message on ``subject``; ValueError (with
    why) for anything else: too large, not JSON, ids missing or malformed, or a run id
    other than the one its subject names."""
    if len(data) > MAX_TIMER_MESSAGE:
        raise ValueError(f"a fired timer takes {len(data):,} bytes, at most {MAX_TIMER_MESSAGE}")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"a fired timer is not JSON: {exc}") from None
    if not isinstance(body, dict):
        # Bad content, not a bad call: callers catch ValueError.
        raise ValueError("a fired timer is a JSON object")  # noqa: TRY004
    run_id, timer_id = body.get("run_id"), body.get("timer_id")
    if not is_run_id(run_id):
        raise ValueError(f"a fired timer's run_id is no run id: {run_id!r}")
    if not isinstance(timer_id, str) or not timer_id or len(timer_id) > 512:
        raise ValueError(f"a fired timer's timer_id is missing or malformed: {timer_id!r}")
    if subject.rsplit(".", 1)[-1] != run_id:
        raise ValueError(f"a fired timer for run {run_id} on the subject of another: {subject}")
    assert isinstance(run_id, str)
    return run_id, timer_id


def fired_message(nc: Client, subjects: Subjects, run_id: str, timer_id: str) -> Msg:
    """A fired timer as the message the server stores for it (to hand it over)."""
    body = json.dumps({"run_id": run_id, "timer_id": timer_id}).encode()
    return Msg(_client=nc, subject=subjects.timer_fired(run_id), data=body)


MAX_TIMER_DELIVERIES = 10
"""Deliveries of a fired timer tried before it is dead-lettered (``timer-failed``)."""


class JetStreamTimers:
    """Timers as JetStream scheduled messages."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        max_deliveries: int = MAX_TIMER_DELIVERIES,
        retry_cap: float = 30.0,
        ack_wait: float = 30.0,
    ) -> None:
        """``max_deliveries``: deliveries of a fired timer that fails before it is
        dead-lettered; ``retry_cap``: the longest wait between two (seconds);
        ``ack_wait``: how long the timers a stopped process had taken wait before another
        gets them (a batch in hand says it is, however long it takes)."""
        self._ack_wait = ack_wait
        self._nc = nc
        self._js = jetstream(nc)
        self._subjects = subjects
        self._max_deliveries = max_deliveries
        self._retry_cap = retry_cap
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        s = self._subjects
        headers = {
            "Nats-Schedule": f"@at {fire_at}",
            "Nats-Schedule-Target": s.timer_fired(run_id),
            "Nats-Msg-Id": f"timer:{timer_id}",
        }
        body = json.dumps({"run_id": run_id, "timer_id": timer_id}).encode()
        await self._js.publish(s.timer_schedule(_token(timer_id)), body, headers=headers)

    def start(self, deliver: Deliver) -> None:
        self._task = asyncio.create_task(self._consume(deliver))

    async def stop(self) -> None:
        self._stopping.set()
        # Stopping: what ended the task was logged where it happened.
        await cancel_and_wait(self._task)

    async def _consume(self, deliver: Deliver) -> None:
        s = self._subjects
        reader = BatchReader(
            self._nc,
            stream=s.timers_stream,
            consumer="timers",
            filter_subject=s.timers_fired_all,
            size=64,
            ensure=self._ensure_consumer,
        )
        await self._ensure_consumer()
        async with contextlib.aclosing(reader.batches(self._stopping)) as batches:
            async for msgs in batches:
                # Each run's timers in order, different runs' at once (one waiting for its
                # run's holder holds up no other run's).
                by_run: dict[str, list[Msg]] = {}
                for msg in msgs:
                    by_run.setdefault(msg.subject, []).append(msg)
                async with in_progress(msgs, self._ack_wait / 3):
                    await asyncio.gather(*(self._run(ms, deliver) for ms in by_run.values()))

    async def _run(self, msgs: list[Msg], deliver: Deliver) -> None:
        """One run's fired timers, in order."""
        for msg in msgs:
            try:
                run_id, timer_id = read_fired(msg.subject, msg.data)
            except ValueError as exc:
                # Another delivery would not make it readable: dead-letter it at once, so
                # junk never holds up the timers of every run.
                await self._dead_letter(msg, str(exc))
                continue
            try:
                await deliver(run_id, timer_id)
                await msg.ack()
            # The timer is retried; the loop goes on.
            except Exception as exc:  # noqa: BLE001
                await self._failed(msg, exc)

    async def _failed(self, msg: Msg, exc: Exception) -> None:
        """A fired timer whose delivery failed: tried again, later each time (1, 2, 4 s ...
        at most 30 s apart: some two minutes in all, longer than a JetStream leader
        election or a server restart), then dead-lettered (``timer-failed``), so a timer
        that cannot be handled is not retried for ever."""
        delivered = deliveries(msg)
        if delivered >= self._max_deliveries:
            detail = f"delivery failed {delivered} times, the last: {exc}"
            await self._dead_letter(msg, detail, reason="timer-failed")
            return
        log.warning("timers: delivery failed (%d), will retry: %s", delivered, exc)
        # Best effort: a message left unsettled comes again after its ack wait.
        with contextlib.suppress(Exception):
            await msg.nak(delay=min(2.0 ** (delivered - 1), self._retry_cap))

    async def _dead_letter(self, msg: Msg, detail: str, *, reason: str = "bad-timer") -> None:
        headers, data = dead_letter(msg, reason, detail, self._nc.max_payload)

        async def store() -> None:
            try:
                await self._js.publish(self._subjects.dead_letter(reason), data, headers=headers)
            except Exception as exc:
                # The reason is the message: no traceback.
                log.error("timers: could not dead-letter a message: %s", exc)  # noqa: TRY400
                raise
            log.warning("timers: dead-lettered a message on %s: %s", msg.subject, detail)

        # Kept rather than lost when the letter cannot be stored: it comes again in 5 s.
        await dead_letter_and_settle(msg, store, term=True, retry_s=5)

    async def _ensure_consumer(self) -> None:
        """Create the ``timers`` consumer if it is missing, trying again while JetStream
        cannot answer (a leader election, a server restart)."""
        s = self._subjects
        config = ConsumerConfig(
            durable_name="timers",
            filter_subject=s.timers_fired_all,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self._ack_wait,
            deliver_policy=DeliverPolicy.ALL,
        )

        async def attempt() -> None:
            await ensure_consumer(self._js, s.timers_stream, config, update=True, log=log)

        await until_done(attempt, self._stopping, "timers", log)


class ClockTimers:
    """Timers in memory, due when a :class:`ManualClock` is advanced past them."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._heap: list[tuple[datetime, int, str, str]] = []
        self._count = 0
        self._deliver: Deliver | None = None
        self._delivered: set[str] = set()

    async def schedule(self, run_id: str, timer_id: str, fire_at: str) -> None:
        if timer_id in self._delivered or any(t[3] == timer_id for t in self._heap):
            return  # scheduling is idempotent, like the JetStream adapter's message id
        self._count += 1
        heapq.heappush(self._heap, (parse_time(fire_at), self._count, run_id, timer_id))

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver

    async def stop(self) -> None:
        self._deliver = None

    @property
    def pending(self) -> int:
        return len(self._heap)

    def knows(self, timer_id: str) -> bool:
        """Whether the timer was scheduled here (due or not)."""
        return timer_id in self._delivered or any(t[3] == timer_id for t in self._heap)

    async def advance(self, seconds: float) -> int:
        """Move the clock on and deliver every timer due by then, in time order."""
        target = self.clock.moment + timedelta(seconds=seconds)
        fired = 0
        while self._heap and self._heap[0][0] <= target:
            at, _, run_id, timer_id = heapq.heappop(self._heap)
            self.clock.advance_to(at)
            self._delivered.add(timer_id)
            if self._deliver is not None:
                await self._deliver(run_id, timer_id)
            fired += 1
        self.clock.advance_to(target)
        return fired


def _token(timer_id: str) -> str:
    """A timer id as one subject token."""
    return timer_id.replace(".", "_").replace("*", "_").replace(">", "_").replace(" ", "_")
