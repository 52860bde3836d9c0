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

A description (``GET /runs/{id}``) of a run whose log is not kept is read as the client
reads one: from the run's snapshot and the records after it (a long run's description costs
what follows its snapshot, not its whole log). When no snapshot was used the whole log was
read, and it is kept as the pages read it; a long run's state alone is kept (at most
``STATES_KEPT`` of them), brought up to date from what was appended, as a kept log is.

The first read of a long log costs its whole length (a few tenths of a second for 2,500
messages on a busy machine), but a page near its start needs only its first messages: a
log page of a run not kept yet, within the first ``HEAD_RECORDS`` records, is answered from
a bounded read of the log's head (each message holds at least one record, so
``offset + limit + 1`` messages are enough to fill the page and know whether more follow)
and the log's last message (whether the run ended). Such a page does not start a read of
the whole log: the console asks for the workflow version its diagram draws right after
the first page, and that answer would wait behind the read's messages on the gateway's
connection. The first answer that needs the whole log (the description, asked for next)
reads it. A page further into a log not kept is read where it lies (``logrange.py``: a
binary search by the records' places), never by a read of the whole log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from interlock import views
from interlock.client import UnknownRun
from interlock.client.catalog import outline_of_run
from interlock.client.errors import no_stream_is_no_run
from interlock.client.queues import with_places
from interlock.client.reading import loaded_description
from interlock.core import events as ev
from interlock.core.ids import check_run_id
from interlock.core.objects import ObjectError, is_marker, parse_ref
from interlock.core.state import RunState, fold
from interlock.gateway.logrange import log_length, page_at, page_json
from interlock.gateway.problems import Problem
from interlock.runtime.client import InterlockClient
from interlock.runtime.foreign import Foreign
from interlock.runtime.logstore import RunLog
from interlock.runtime.payloads import on_slots
from interlock.transport.directget import LogReadError
from interlock.transport.natsclient import js_api

MAX_RECORDS = 200_000
"""Records kept over all runs by default (a few hundred MB at most for large records)."""
HEAD_RECORDS = 1000
"""A page of a log not kept yet that ends within this many records is read from its head."""
STATES_KEPT = 1000
REDRIVE_MAX_RECORDS = 20_000
"""The longest log the gateway explains or replays (each re-decides every step of it)."""
REDRIVE_MAX_BYTES = 256 * 1024 * 1024
"""The most bytes of payloads kept by reference an explanation or a replay loads."""
REDRIVES_AT_ONCE = 2
"""Explanations and replays re-deciding at once (the others wait their turn)."""
"""Long runs described from their snapshot whose state is kept (not their records)."""
_TIMEOUT = 5.0
_ENDINGS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)


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
    foreign: list[Foreign] = field(default_factory=list)
    """The messages of its log skipped as foreign (``describe`` warns of each)."""
    described: tuple[int, views.RunDescription] | None = None
    """The description at ``last_seq`` (recomputed once the log moved)."""

    @property
    def finished(self) -> bool:
        return self.state.finished

    def page(self, offset: int, limit: int) -> bytes:
        """The JSON of ``GET /runs/{id}/log?offset=&limit=`` from the records kept."""
        end = offset + limit
        more = end < len(self.encoded)
        return page_json(self.encoded[offset:end], end if more else None, self.finished)


@dataclass
class _Described:
    """A run described from its snapshot: its state, and the records read after it (at
    least its last message's: whether and when it ended), not its whole log."""

    last_seq: int
    state: RunState
    records: list[ev.AnyRecord]
    foreign: list[Foreign]
    described: tuple[int, views.RunDescription] | None = None


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
        self._states: OrderedDict[str, _Described] = OrderedDict()
        self._locks: dict[str, _Lock] = {}
        self.reads = 0
        """Messages read from the stream into the kept logs so far (what the cache saves
        shows here)."""
        self.head_reads = 0
        """Messages read for pages answered from a log's head."""
        self._redrives = asyncio.Semaphore(REDRIVES_AT_ONCE)
        self.range_reads = 0
        """Messages read for pages of logs not kept found where they lie (logrange.py)."""

    @property
    def run_log(self) -> RunLog:
        """The run logs these are read from (every message checked)."""
        return self._ops.log

    @property
    def kept_records(self) -> int:
        return sum(len(c.records) for c in self._kept.values())

    def keeps(self, run_id: str) -> bool:
        """Whether the run's log is kept here (its next answers read what was appended)."""
        return run_id in self._kept

    def forget(self) -> None:
        """Drop every kept log (the next answers read their logs again, as after a start)."""
        self._kept.clear()
        self._states.clear()

    @contextlib.asynccontextmanager
    async def _holding(self, run_id: str) -> AsyncIterator[None]:
        """One reader per run at a time: a page's description and log asked for together
        read the log once, the second only what the first did not see."""
        held = self._locks.setdefault(run_id, _Lock())
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:
                self._locks.pop(run_id, None)

    async def log(self, run_id: str) -> CachedLog:
        """The run's log up to date: what was kept, and the messages appended since.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        async with self._holding(run_id):
            return await self._log(run_id)

    async def _log(self, run_id: str) -> CachedLog:
        cached = self._kept.get(run_id) or CachedLog(run_id)
        async with no_stream_is_no_run(run_id):
            found = await self._ops.log.read_checked(run_id, after=cached.last_seq)
        raw = found.messages
        if not raw and not cached.records:
            raise self._ops.watcher.told.unknown(run_id)
        cached.foreign.extend(found.foreign)
        cached.last_seq = found.last
        if raw:
            self.reads += len(raw)
            added = [r for _, payload in raw for r in ev.decode_batch(payload)]
            cached.records.extend(added)
            cached.encoded.extend(ev.encode(r) for r in added)
            cached.state = fold(added, cached.state)
        self._keep(cached)
        return cached

    async def _state(self, run_id: str) -> CachedLog | _Described:
        """The run as its description needs it, up to date: its kept log, or its kept
        state, or read from its snapshot and the records after it."""
        if run_id in self._kept:
            return await self._log(run_id)
        known = self._states.pop(run_id, None)
        if known is not None:
            found = await self._ops.log.read_checked(run_id, after=known.last_seq)
            known.foreign.extend(found.foreign)
            known.last_seq = found.last
            if found.messages:
                added = [r for _, payload in found.messages for r in ev.decode_batch(payload)]
                known.records, known.state = added, fold(added, known.state)
        else:
            try:
                async with no_stream_is_no_run(run_id):
                    read = await self._ops.read_state(run_id)
            except UnknownRun:
                raise self._ops.watcher.told.unknown(run_id) from None
            if not read.covered:
                # No snapshot used: the whole log was read; kept as the pages read it.
                self.reads += read.messages - len(read.foreign)
                cached = CachedLog(run_id, read.last, read.records, state=read.state)
                cached.encoded = [ev.encode(r) for r in read.records]
                cached.foreign = list(read.foreign)
                self._keep(cached)
                return cached
            known = _Described(read.last, read.state, read.records, list(read.foreign))
        self._states[run_id] = known
        while len(self._states) > STATES_KEPT:
            self._states.popitem(last=False)
        return known

    def _keep(self, cached: CachedLog) -> None:
        if len(cached.records) > self._max:
            self._kept.pop(cached.run_id, None)
            return
        self._kept[cached.run_id] = cached
        self._kept.move_to_end(cached.run_id)
        total = self.kept_records
        while total > self._max and self._kept:
            _, dropped = self._kept.popitem(last=False)
            total -= len(dropped.records)

    @contextlib.asynccontextmanager
    async def redrive(self, run_id: str) -> AsyncIterator[CachedLog]:
        """The run's log for ``GET /runs/{id}/explain`` and ``/replay``, which re-decide
        every step of it: refused (422 ``log-too-long``, before the log is read) past
        :data:`REDRIVE_MAX_RECORDS`, and at most :data:`REDRIVES_AT_ONCE` at a time (held
        while the caller re-decides), so that no caller makes the gateway spend minutes
        of CPU and memory on a log of 200,000 records, or on many at once."""
        check_run_id(run_id)
        length = await log_length(self._ops, run_id)
        if length is not None and length > REDRIVE_MAX_RECORDS:
            raise Problem(
                422,
                "log-too-long",
                f"run {run_id}: its log holds {length} records; the gateway explains and "
                f"replays logs of at most {REDRIVE_MAX_RECORDS} (`interlock explain "
                f"{run_id} --at N` and `interlock replay` read it where they run)",
                records=length,
                max_records=REDRIVE_MAX_RECORDS,
            )
        async with self._redrives:
            cached = await self.log(run_id)
            size = await _referenced(self._ops, cached.records)
            if size > REDRIVE_MAX_BYTES:
                raise Problem(
                    422,
                    "payloads-too-large",
                    f"run {run_id}: its log names {size:,} bytes of payloads kept by "
                    f"reference, which explaining or replaying it loads; the gateway loads "
                    f"at most {REDRIVE_MAX_BYTES:,} (the CLI loads them where it runs)",
                    bytes=size,
                    max_bytes=REDRIVE_MAX_BYTES,
                )
            yield cached

    async def describe(self, run_id: str) -> views.RunDescription:
        """``GET /runs/{id}``: as ``Client.describe``, from the kept log or state (see the
        module's notes)."""
        check_run_id(run_id)
        async with self._holding(run_id):
            cached = await self._state(run_id)
        if cached.described is not None and cached.described[0] == cached.last_seq:
            # A queued run's place in line changes with no record of its own: read again.
            return await with_places(self._ops, cached.described[1], cached.state)
        outline = await outline_of_run(self._ops, cached.state)
        described = views.describe_run(
            cached.records,
            outline,
            state=cached.state,
            warnings=[f.warning() for f in cached.foreign],
        )
        described = await loaded_description(self._ops, described)  # payloads, whole
        cached.described = (cached.last_seq, described)
        return await with_places(self._ops, described, cached.state)

    async def page(self, run_id: str, offset: int, limit: int) -> bytes:
        """``GET /runs/{id}/log?offset=&limit=``: from the kept log, or, for a page near
        the start of a log not kept yet, from a bounded read of its head.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        if run_id not in self._kept and offset + limit <= HEAD_RECORDS:
            return await self._head_page(run_id, offset, limit)
        if run_id not in self._kept:
            # Read where the page lies, not the whole log (logrange.py).
            page, read = await page_at(self._ops, run_id, offset, limit)
            self.range_reads += read
            if page is not None:
                return page
        return (await self.log(run_id)).page(offset, limit)

    async def _head_page(self, run_id: str, offset: int, limit: int) -> bytes:
        ops = self._ops
        stream, subject = await ops.log.where(run_id)
        wanted = offset + limit
        async with no_stream_is_no_run(run_id):
            found = await ops.log.read_checked(run_id, limit=wanted + 1)
        raw = found.messages
        if not raw:
            raise self._ops.watcher.told.unknown(run_id)
        self.head_reads += len(raw) + len(found.foreign)
        records = [r for _, payload in raw for r in ev.decode_batch(payload)]
        # Read to the end when fewer messages than asked for came (foreign ones count).
        whole = len(raw) + len(found.foreign) <= wanted
        last = raw[-1][1] if whole else await self._last_message(run_id, stream, subject)
        finished = last is not None and any(isinstance(r, _ENDINGS) for r in ev.decode_batch(last))
        more = len(records) > wanted or not whole
        return page_json(
            [ev.encode(r) for r in records[offset:wanted]], wanted if more else None, finished
        )

    async def _last_message(self, run_id: str, stream: str, subject: str) -> bytes | None:
        """The payload of the run's last authenticated message (None: it has none)."""
        api = f"{js_api(self._ops.nc)}.DIRECT.GET.{stream}"
        body = json.dumps({"last_by_subj": subject}).encode()
        msg = await self._ops.nc.request(api, body, timeout=_TIMEOUT)
        status = (msg.headers or {}).get("Status")
        if status == "404":
            return None
        if status:
            raise LogReadError(f"reading the last message of {subject}: status {status}")
        return await self._ops.log.last_record(run_id, msg.headers, msg.data)


async def _referenced(ops: InterlockClient, records: list[ev.AnyRecord]) -> int:
    """The bytes of the distinct objects ``records`` reference (what loading them reads)."""
    seen: dict[tuple[str, str], int] = {}

    async def note(value: Any, bucket: str, where: str) -> Any:
        if is_marker(value):
            with contextlib.suppress(ObjectError):
                ref = parse_ref(value, where)
                seen[ref.bucket, ref.name] = ref.size
        return value

    for record in records:
        await on_slots(ops.subjects, record, note)
    return sum(seen.values())
