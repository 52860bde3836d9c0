"""A page of a long run log read where it lies, not from the log's start.

Every record of a run's log is named ``<run id>:<n>``, ``n`` its place in the log (from 1),
and a run's messages are in the order of their records. So the message holding record
``offset`` is found by a binary search over the stream's sequences between the log's first
and last messages: each probe one direct get of the run's first message at or after a
sequence (``next_by_subj``), checked as every read of a log is, whose first record's
name says where it stands. A page past the first thousand records of a 200,000-record log
costs some thirty small reads and the page's own messages, where the gateway read the
whole log (hundreds of MB at the history limits) for every such page of a log too long to
keep, which any caller with a reader's token could ask for again and again.

Nothing here is trusted over the records themselves: a page whose records are not the
places the search said (a log written before records were named so, a message that
decodes other than expected) is answered by the whole read instead (None from
:func:`page_at`).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from interlock.client.errors import no_stream_is_no_run
from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.logstore import LogRead

__all__ = ["log_length", "page_at", "page_json", "seek"]


class _Named(msgspec.Struct):
    id: str = ""


_names = msgspec.json.Decoder(list[_Named]).decode
_ENDINGS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunContinued)
_PROBE = 1
"""Messages one probe reads (foreign ones are skipped: the first authentic one counts)."""


def page_json(encoded: list[bytes], next_offset: int | None, finished: bool) -> bytes:
    """The JSON of a log page (``LogPage``) from its records' JSON."""
    return b"".join(
        (
            b'{"records":[',
            b",".join(encoded),
            b'],"next_offset":',
            b"null" if next_offset is None else str(next_offset).encode(),
            b',"finished":',
            b"true" if finished else b"false",
            b"}",
        )
    )


def _place(name: str) -> int | None:
    """The place (from 1) a record's name says, None when it says none."""
    _, _, tail = name.rpartition(":")
    return int(tail) if tail.isdigit() else None


def _span(payload: bytes) -> tuple[int, int] | None:
    """(first, last) places of a message's records, from their names alone."""
    try:
        names = _names(payload)
    except msgspec.DecodeError:
        return None
    if not names:
        return None
    first, last = _place(names[0].id), _place(names[-1].id)
    if first is None or last is None or last - first != len(names) - 1:
        return None
    return first, last


class _Reads:
    """The messages a page's reads returned (what the search costs shows here)."""

    def __init__(self, ops: InterlockClient, run_id: str) -> None:
        self.ops, self.run_id, self.count = ops, run_id, 0

    async def after(self, seq: int, limit: int) -> LogRead:
        found = await self.ops.log.read_checked(self.run_id, after=seq, limit=limit)
        self.count += len(found.messages) + len(found.foreign)
        return found

    async def at_or_after(self, seq: int) -> tuple[int, bytes] | None:
        """The run's first authentic message at or after stream sequence ``seq``."""
        after = seq - 1
        while True:
            found = await self.after(after, _PROBE)
            if found.messages:
                return found.messages[0]
            if not found.foreign:
                return None
            after = found.last

    async def last(self) -> tuple[int, bytes] | None:
        """The run's last authentic message (None: no such run)."""
        last = await self.ops.log.last_seq(self.run_id)
        if not last:
            return None
        found = await self.at_or_after(last)
        if found is not None:
            return found
        raw = await self.ops.log.read_raw(self.run_id)  # the last one is foreign: read back
        self.count += len(raw)
        return raw[-1] if raw else None


async def log_length(ops: InterlockClient, run_id: str) -> int | None:
    """How many records the run's log holds, from its last message alone (None: the log
    does not say, or there is no such run)."""
    async with no_stream_is_no_run(run_id):
        last = await _Reads(ops, run_id).last()
    span = None if last is None else _span(last[1])
    return None if span is None else span[1]


async def page_at(
    ops: InterlockClient, run_id: str, offset: int, limit: int
) -> tuple[bytes | None, int]:
    """The JSON of ``GET /runs/{id}/log?offset=&limit=`` read from where record ``offset``
    lies (None when the log's records do not say their places: read it whole), and the
    messages read for it."""
    reads = _Reads(ops, run_id)
    async with no_stream_is_no_run(run_id):
        page = await _page(reads, offset, limit)
    return page, reads.count


async def seek(
    ops: InterlockClient, run_id: str, offset: int, *, longer_than: int = 0
) -> tuple[int, int] | None:
    """Where place ``offset + 1`` of a log longer than ``longer_than`` records lies: (the
    stream sequence of the message holding it, that message's first place), the log's
    last message when it is shorter; None for a shorter log, one whose records do not
    say their places, or no run."""
    reads = _Reads(ops, run_id)
    async with no_stream_is_no_run(run_id):
        found = await _search(reads, offset)
    if found is None or found.total <= longer_than:
        return None
    return found.seq, found.first


@dataclass(frozen=True, slots=True)
class _Found:
    seq: int
    """The last message whose first record is at or before the place looked for."""
    first: int
    """Its first record's place."""
    total: int
    last: bytes
    """The log's last message."""


async def _search(reads: _Reads, offset: int) -> _Found | None:
    """Where place ``offset + 1`` lies (a binary search of the run's messages)."""
    first, last = await reads.at_or_after(1), await reads.last()
    if first is None or last is None:
        return None
    head, tail = _span(first[1]), _span(last[1])
    if head is None or tail is None or head[0] != 1:
        return None
    lo, hi, at = first[0], last[0], 1
    while lo < hi:  # the last message whose first record is at or before ``offset + 1``
        mid = (lo + hi + 1) // 2
        probe = await reads.at_or_after(mid)
        if probe is None or probe[0] > hi:
            hi = mid - 1
            continue
        span = _span(probe[1])
        if span is None:
            return None
        if span[0] <= offset + 1:
            lo, at = probe[0], span[0]
        else:
            hi = mid - 1
    if lo == last[0]:
        at = tail[0]
    return _Found(lo, at, tail[1], last[1])


async def _page(reads: _Reads, offset: int, limit: int) -> bytes | None:
    found = await _search(reads, offset)
    if found is None:
        return None
    finished = any(isinstance(r, _ENDINGS) for r in ev.decode_batch(found.last))
    total = found.total
    if offset >= total:
        return page_json([], None, finished)
    records = await _from(reads, found.seq, offset + limit + 1)
    start = _place(records[0].id) if records else None
    if start is None or start > offset + 1:
        return None
    if any(_place(r.id) != start + k for k, r in enumerate(records)):
        return None
    skip = offset + 1 - start
    page = records[skip : skip + limit]
    end = offset + len(page)
    return page_json([ev.encode(r) for r in page], end if end < total else None, finished)


async def _from(reads: _Reads, seq: int, until: int) -> list[ev.AnyRecord]:
    """The records of the run's messages from stream sequence ``seq`` on, up to the one
    holding place ``until`` (or the log's end): read a few messages at a time, more each
    round, so a page costs about its own messages however many records each holds."""
    records: list[ev.AnyRecord] = []
    after, batch = seq - 1, 8
    while True:
        found = await reads.after(after, batch)
        records += [r for _, payload in found.messages for r in ev.decode_batch(payload)]
        done = records and (_place(records[-1].id) or until) >= until
        if done or found.last == after or len(found.messages) + len(found.foreign) < batch:
            return records
        after, batch = found.last, min(batch * 2, 1000)
