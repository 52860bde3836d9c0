"""Run logs as the gateway serves them: each read once, then only what was appended.

A run's log is one JetStream subject; reading it costs one message per decision (a
5,000-record run is 2,500 messages, half a second and more of parsing on a busy machine).
The console asks for a long run's description, its log pages and its explanation at once,
and asks again as the run moves, so reading the whole log for each answer made a long run's
page cost seconds. The gateway instead keeps the logs it read recently in memory, with the
state folded from them, and before each answer reads only the messages after the last one
it has (one direct get, answered "nothing new" at once when the run did not move): an
answer is never older than the log was when it was asked for, as with a full read.

Memory is bounded: at most ``max_records`` records are kept over all runs, the least
recently used run's log dropped first; a log longer than that is read and served but not
kept. The records are kept as the bytes the log page sends (their CloudEvent JSON), so a
page of records is the bytes of its records joined, with no re-encoding.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from interlock import views
from interlock.client import UnknownRun
from interlock.client.catalog import definition_of
from interlock.client.errors import no_stream_is_no_run
from interlock.core import events as ev
from interlock.core.ids import check_run_id
from interlock.core.state import RunState, fold
from interlock.runtime.client import InterlockClient

MAX_RECORDS = 200_000
"""Records kept over all runs by default (a few hundred MB at most for large records)."""


@dataclass
class CachedLog:
    """One run's log as far as it was read: its records, their JSON, the folded state."""

    run_id: str
    last_seq: int = 0
    """The stream sequence of the last message read (0: none yet)."""
    records: list[ev.AnyRecord] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)
    """Each record as its CloudEvent JSON, as ``GET /runs/{id}/log`` sends it."""
    state: RunState = field(default_factory=RunState)
    described: tuple[int, views.RunDescription] | None = None
    """The description at ``last_seq`` (recomputed once the log moved)."""

    @property
    def finished(self) -> bool:
        return self.state.finished

    def page(self, offset: int, limit: int) -> bytes:
        """The JSON of ``GET /runs/{id}/log?offset=&limit=`` from the records kept."""
        end = offset + limit
        more = end < len(self.encoded)
        return b"".join(
            (
                b'{"records":[',
                b",".join(self.encoded[offset:end]),
                b'],"next_offset":',
                str(end).encode() if more else b"null",
                b',"finished":',
                b"true" if self.finished else b"false",
                b"}",
            )
        )


@dataclass
class _Lock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class RunLogs:
    """The logs the gateway read recently, brought up to date on each use."""

    def __init__(self, ops: InterlockClient, *, max_records: int = MAX_RECORDS) -> None:
        self._ops = ops
        self._max = max_records
        self._kept: OrderedDict[str, CachedLog] = OrderedDict()
        self._locks: dict[str, _Lock] = {}
        self.reads = 0
        """Messages read from the stream so far (what the cache saves shows here)."""

    @property
    def kept_records(self) -> int:
        return sum(len(c.records) for c in self._kept.values())

    async def log(self, run_id: str) -> CachedLog:
        """The run's log up to date: what was kept, and the messages appended since.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        # One reader per run at a time: a page's description and log asked for together
        # read the log once, the second only what the first did not see.
        held = self._locks.setdefault(run_id, _Lock())
        held.users += 1
        try:
            async with held.lock:
                cached = self._kept.pop(run_id, None) or CachedLog(run_id)
                async with no_stream_is_no_run(run_id):
                    raw = await self._ops.log.read_raw(run_id, after=cached.last_seq)
                if not raw and not cached.records:
                    raise UnknownRun(run_id)
                if raw:
                    self.reads += len(raw)
                    added = [r for _, payload in raw for r in ev.decode_batch(payload)]
                    cached.records.extend(added)
                    cached.encoded.extend(ev.encode(r) for r in added)
                    cached.state = fold(added, cached.state)
                    cached.last_seq = raw[-1][0]
                self._keep(cached)
                return cached
        finally:
            held.users -= 1
            if not held.users:
                self._locks.pop(run_id, None)

    def _keep(self, cached: CachedLog) -> None:
        if len(cached.records) > self._max:
            return
        self._kept[cached.run_id] = cached
        total = self.kept_records
        while total > self._max and self._kept:
            _, dropped = self._kept.popitem(last=False)
            total -= len(dropped.records)

    async def describe(self, run_id: str) -> views.RunDescription:
        """``GET /runs/{id}``: as ``Client.describe``, from the kept log and its state."""
        cached = await self.log(run_id)
        if cached.described is not None and cached.described[0] == cached.last_seq:
            return cached.described[1]
        definition = await definition_of(self._ops, cached.state)
        described = views.describe_run(cached.records, definition, state=cached.state)
        cached.described = (cached.last_seq, described)
        return described
