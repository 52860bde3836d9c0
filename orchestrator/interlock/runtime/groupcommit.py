"""Group commit of run-log appends: several runs' appends in one atomic batch when the
server is backed up, each still guarded by its own expected subject sequence.

With every write fsynced (``sync_interval: always``) the server syncs one stream's writes
one after another, so the run logs' stream caps the runs per second. An atomic batch
(ADR-50) is synced once at its commit, but each batch costs a fixed 13 to 17 ms of staging
here (``python -m bench batch``): it pays only when tens of appends are ready at once. So:

- up to ``min_batch`` appends go out one by one, at once, as without grouping: a lightly
  loaded orchestrator never waits for a batch to fill;
- beyond that (``min_batch`` appends awaiting their acknowledgement: the server is behind)
  new appends queue, and as soon as ``min_batch`` are queued they go as one atomic batch,
  at most ``max_open`` batches at a time (the server takes 50 per stream);
- a batch the server refuses (one append's check failed, which refuses them all and does
  not say which) or does not acknowledge is sent again one append at a time, so each gets
  its own answer: a conflict fails only the append that lost, the others are stored.

Nothing is acknowledged before the server stored it: an append returns its own stream
sequence (a batch's messages take consecutive sequences, the commit's ack gives the last),
or raises what a single append raises. Off by default: with the default ``sync_interval``
a single append costs a fraction of a millisecond and a batch would cost more than it
saves. ``interlock serve --group-commit N`` (``INTERLOCK_GROUP_COMMIT``) turns it on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from interlock.transport.appends import MAX_BATCH
from interlock.transport.jetstream import jetstream

EXPECTED: str = "Nats-Expected-Last-Subject-Sequence"
MAX_OPEN = 4
"""Batches awaiting their commit's acknowledgement at once (the server's limit: 50 per
stream, shared with every other writer of the stream)."""


class _Ack(msgspec.Struct):
    seq: int = 0
    count: int = 0
    error: dict[str, object] | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


@dataclass(slots=True)
class _Append:
    subject: str
    headers: dict[str, str]
    data: bytes
    expected: int
    future: asyncio.Future[int] = field(repr=False)


Single = Callable[[str, dict[str, str], bytes, int], Awaitable[int]]
"""Appends one message (subject, headers, data, expected last subject sequence); returns
its stream sequence or raises (``AppendConflict`` when the check fails)."""


@dataclass
class GroupStats:
    """What the grouping did (for benchmarks and metrics)."""

    singles: int = 0
    batches: int = 0
    batched: int = 0
    """Appends stored by a batch."""
    retried: int = 0
    """Appends of refused or unacknowledged batches, sent again one by one."""


class GroupCommit:
    """Sends appends one by one while few await their acknowledgement, in atomic batches
    of at least ``min_batch`` when more do (see the module's description)."""

    def __init__(
        self,
        nc: Client,
        single: Single,
        min_batch: int,
        *,
        max_open: int = MAX_OPEN,
        ack_wait: float = 5.0,
    ) -> None:
        if min_batch < 2:
            raise ValueError(f"a group commit batches at least 2 appends, not {min_batch}")
        self._nc = nc
        self._single = single
        self.min_batch = min(min_batch, MAX_BATCH)
        self._max_open = max_open
        self._ack_wait = ack_wait
        self._queue: deque[_Append] = deque()
        self._singles = 0
        self._open = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def append(
        self, subject: str, headers: dict[str, str], data: bytes, expected: int
    ) -> int:
        """Store one message if ``subject``'s last sequence is ``expected``; its sequence."""
        if not self._queue and self._singles < self.min_batch:
            return await self._one(subject, headers, data, expected)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Append(subject, headers, data, expected, future))
        self._schedule()
        return await future

    async def _one(self, subject: str, headers: dict[str, str], data: bytes, expected: int) -> int:
        self._singles += 1
        self.stats.singles += 1
        try:
            return await self._single(subject, headers, data, expected)
        finally:
            self._singles -= 1
            if self._queue:
                self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while len(self._queue) >= self.min_batch and self._open < self._max_open:
            batch = self._take()
            if len(batch) < self.min_batch:  # mostly one run's appends: not worth a batch
                self._queue.extendleft(reversed(batch))
                break
            self._spawn(self._batch(batch))
        # What is left (too few for a batch, or no batch can open): one by one, as long as
        # fewer than min_batch are out.
        while self._queue and self._singles < self.min_batch:
            self._spawn(self._forward(self._queue.popleft()))

    def _take(self) -> list[_Append]:
        """Up to MAX_BATCH queued appends, one per subject (the server refuses a batch
        that checks a subject it also writes earlier in the batch); the others stay first
        in the queue."""
        batch: list[_Append] = []
        seen: set[str] = set()
        later: list[_Append] = []
        while self._queue and len(batch) < MAX_BATCH:
            item = self._queue.popleft()
            if item.subject in seen:
                later.append(item)
            else:
                seen.add(item.subject)
                batch.append(item)
        self._queue.extendleft(reversed(later))
        return batch

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, item: _Append) -> None:
        try:
            seq = await self._one(item.subject, item.headers, item.data, item.expected)
        except Exception as exc:  # noqa: BLE001 - the append's own error, handed to its caller
            if not item.future.done():
                item.future.set_exception(exc)
            return
        if not item.future.done():
            item.future.set_result(seq)

    async def _batch(self, items: list[_Append]) -> None:
        self._open += 1
        try:
            last = await self._commit(items)
        except _Refused:
            self.stats.retried += len(items)
            last = None
        finally:
            self._open -= 1
            if self._queue:
                self._schedule()
        if last is None:
            # Each on its own: the one whose check failed gets its conflict, the rest are
            # stored (or, if the batch was stored after all and its ack lost, each gets
            # the conflict a re-read resolves).
            await asyncio.gather(*(self._forward(item) for item in items))
            return
        self.stats.batches += 1
        self.stats.batched += len(items)
        first = last - len(items) + 1
        for offset, item in enumerate(items):
            if not item.future.done():
                item.future.set_result(first + offset)

    async def _commit(self, items: list[_Append]) -> int:
        """Publish ``items`` as one atomic batch; the commit's sequence.

        Raises:
            _Refused: the server refused the batch, or did not acknowledge it in time.
        """
        batch_id = uuid.uuid4().hex
        last = len(items) - 1
        for index, item in enumerate(items):
            headers = dict(item.headers)
            headers[EXPECTED] = str(item.expected)
            headers["Nats-Batch-Id"] = batch_id
            headers["Nats-Batch-Sequence"] = str(index + 1)
            if index < last:
                await self._nc.publish(item.subject, item.data, headers=headers)
                continue
            headers["Nats-Batch-Commit"] = "1"
            try:
                reply = await jetstream(self._nc).request_ack(
                    item.subject, item.data, headers=headers, ack_wait=self._ack_wait
                )
            except (NoRespondersError, NatsTimeoutError) as exc:
                raise _Refused from exc
            ack = _decode_ack(reply.data)
            if ack.error or ack.count != len(items):
                raise _Refused
            return ack.seq
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Wait for what is in hand (new appends are not refused)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class _Refused(Exception):
    """A batch was refused or not acknowledged: its appends go again one by one."""
