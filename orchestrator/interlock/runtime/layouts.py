"""Retiring partition layouts: the housekeeping of the partition map.

Every resize adds a layout to the map (:mod:`interlock.transport.partitions`), and each
layout adds a partition where a run of unknown place may be. :func:`retire_layouts` takes
them away again, in one pass over the run-log streams that writes the map with a
compare-and-set (so replicas doing it at once, or a resize meanwhile, make all but one
read the map again and decide again, and a process killed anywhere leaves the old map or
the new one, never half of it):

1. A live layout other than the current one is **retired** when (a) the layout after it
   was set at least ``grace`` seconds ago (every process places a new run by a map read at
   most :data:`PLACE_FRESH_S` before, so none places a run by it any more), (b) every run
   stored where it places the run and where no other live layout does has ended (the last
   record of its log is a run's end), and (c) the partitions that no live layout uses once
   it is gone have nothing left in their ``relay`` consumer (every effect of their runs'
   records done and acknowledged). It moves to the map's retired layouts: the runs in flight
   are all at the live layouts' partitions, and the orchestrators stop relaying the
   partitions no live layout uses (:attr:`PartitionMap.relayed`): their streams stay, read
   only, and are used again if the count is raised again.
2. A retired layout is **forgotten** (taken out of the map) when no run is stored where it
   places the run and where no other layout does: the runs it placed were all deleted
   (retention, ``interlock runs delete``). Until then a reader that does not find a run at
   the live layouts' partitions looks at the retired ones' too, so an ended run's log is
   read, exported and replayed as before.

Layouts are taken one at a time, oldest first, each against the ones left, so two layouts
that place a run in the same partition never both go while the run is there.

A pass lists every stored run, so an orchestrator's passes (:class:`Housekeeping`) list
them only when something that could change the map's outcome did. A pass leaves a
:class:`Watch`: the map's revision it judged, the runs in flight that kept a layout live
(once a layout stops placing runs, no new run needs it: only these can end), the moment a
layout kept for its grace may go, and per retired layout the number of stored runs only it
places (only deleting runs lowers it: each deletion is in the audit stream, read from where
the pass left it). The next pass checks those (a map read, one audit stream info, an exact
read of each run in flight until one still is, one read per run deleted since) and lists
again only when the map changed, a grace ran out, a relay had messages left, the runs in
flight that kept a layout have all ended, or a retired layout's count reached zero. The
watch only says when to look; the full pass decides, so a watch that is wrong (a run
deleted by other means than retention or ``interlock runs delete``) delays a change to the
map, never makes a wrong one, and each process's first pass lists.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.client import Client

from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.core.vocabulary import InterlockError
from interlock.transport.clock import utc_now
from interlock.transport.errors import JetStreamAPIError
from interlock.transport.natsclient import js_api
from interlock.transport.partitions import (
    PLACE_FRESH_S,
    Layout,
    PartitionMap,
    PartitionMapConflict,
    partition_of,
    read_map,
    write_map,
)
from interlock.transport.subjects import Subjects

__all__ = [
    "HOUSEKEEPING_S",
    "RETIRE_GRACE_S",
    "Housekeeping",
    "Retirement",
    "Watch",
    "kept_by_runs",
    "retire_layouts",
]

log = logging.getLogger("interlock.partitions")

RETIRE_GRACE_S = 60.0
"""How long after a layout stopped placing runs it may be retired (many times
:data:`PLACE_FRESH_S`: a process paused for a while still places by the map it had)."""
HOUSEKEEPING_S = 30.0
"""How often an orchestrator looks for layouts to retire (while the map has more than one);
it lists the stored runs only when its :class:`Watch` says something changed."""
_TIMEOUT = 5.0
_ATTEMPTS = 5
_READS_AT_ONCE = 64
_TERMINAL = tuple(t.encode() for t in ev.TERMINAL_TYPES)
assert PLACE_FRESH_S < RETIRE_GRACE_S


@dataclass(slots=True)
class Retirement:
    """What one pass did and why it left what it left."""

    retired: list[Layout] = field(default_factory=list)
    forgotten: list[Layout] = field(default_factory=list)
    kept: dict[int, str] = field(default_factory=dict)
    """Layout version -> why it stays (live or retired)."""
    map: PartitionMap = field(default_factory=PartitionMap)
    """The map after the pass."""
    watch: Watch | None = None
    """What the next pass looks at before it lists the stored runs (None: one layout)."""


@dataclass(slots=True)
class Watch:
    """What can make a pass after this one change the map (see the module)."""

    revision: int
    """The revision of the map the pass left."""
    deleted: int
    """The audit stream's last sequence before the pass listed the runs."""
    grace_ends: datetime | None = None
    """The earliest moment a layout kept for its grace may go."""
    busy: bool = False
    """A layout was kept for a relay with messages left."""
    in_flight: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    """Live layout version -> the runs in flight that kept it (partition, run id)."""
    ended: dict[int, int] = field(default_factory=dict)
    """Retired layout version -> the stored runs only it places (deletions lower it)."""

    def grace(self, ends: datetime) -> None:
        self.grace_ends = ends if self.grace_ends is None else min(self.grace_ends, ends)

    async def changed(self, nc: Client, subjects: Subjects, now: datetime) -> str:
        """Why a pass may change the map now (empty: it would change nothing). Brings the
        watch up to date with what it reads (runs ended, runs deleted)."""
        found, revision = await read_map(nc, subjects)
        if revision != self.revision:
            return "the partition map changed"
        if self.busy:
            return "a relay had messages left to act on"
        if self.grace_ends is not None and now >= self.grace_ends:
            return "a layout's grace ran out"
        for version, runs in self.in_flight.items():
            self.in_flight[version] = left = await _still_in_flight(nc, subjects, runs)
            if not left:
                return f"the runs in flight layout {version} kept have ended"
        if self.ended:
            return await self._deletions(nc, subjects, found)
        return ""

    async def _deletions(self, nc: Client, subjects: Subjects, found: PartitionMap) -> str:
        last = await _last_deleted(nc, subjects)
        deleted, self.deleted = await _deleted_runs(nc, subjects, self.deleted, last), last
        every = (*found.layouts, *found.retired)
        for layout in found.retired:
            if layout.version not in self.ended:
                continue
            others = [x for x in every if x is not layout]
            self.ended[layout.version] -= sum(
                _only_by(run_id, partition_of(run_id, layout.count), layout, others)
                for run_id in deleted
            )
            if self.ended[layout.version] <= 0:
                return f"the runs only layout {layout.version} places were deleted"
        return ""


async def retire_layouts(
    nc: Client, subjects: Subjects, *, grace: float = RETIRE_GRACE_S, now: str | None = None
) -> Retirement:
    """Retire the live layouts no run in flight needs and forget the retired ones no
    stored run needs (see the module); what was done. ``now``: the time (RFC 3339) the
    grace is counted to (the clock when not given)."""
    for _ in range(_ATTEMPTS):
        found, revision = await read_map(nc, subjects)
        done = Retirement(map=found)
        if found.single:
            return done
        watch = Watch(revision, await _last_deleted(nc, subjects))
        stored = await _stored_runs(nc, subjects, found.streams)
        wanted = await _decide(nc, subjects, found, stored, grace, now or utc_now(), done, watch)
        done.watch = watch
        if wanted == found:
            return done
        try:
            watch.revision = await write_map(nc, subjects, wanted, revision)
        except PartitionMapConflict:
            continue
        for layout in done.retired:
            log.info("partition layout %d (%d) retired", layout.version, layout.count)
        for layout in done.forgotten:
            log.info("partition layout %d (%d) forgotten", layout.version, layout.count)
        done.map = wanted
        return done
    raise PartitionMapConflict("the partition map kept changing; try again")


async def kept_by_runs(nc: Client, subjects: Subjects) -> dict[int, list[str]]:
    """The stored runs that keep retired layouts in the map, by the oldest retired layout
    that places each where it is: every run stored where no live layout places it. Once
    they are all deleted (archived first, where wanted), a pass forgets every retired
    layout. Changes nothing."""
    found, _ = await read_map(nc, subjects)
    if not found.retired:
        return {}
    stored = await _stored_runs(nc, subjects, found.streams)
    live = list(found.layouts)
    out: dict[int, list[str]] = {}
    seen: set[str] = set()
    for layout in found.retired:
        runs = [r for _, r in _needing(stored, layout, live) if r not in seen]
        seen.update(runs)
        if runs:
            out[layout.version] = runs
    return out


async def _decide(
    nc: Client,
    subjects: Subjects,
    found: PartitionMap,
    stored: dict[int, list[str]],
    grace: float,
    now: str,
    done: Retirement,
    watch: Watch,
) -> PartitionMap:
    live, retired = list(found.layouts), list(found.retired)
    limit = parse_time(now).replace(tzinfo=UTC) - timedelta(seconds=grace)
    for i, layout in enumerate(found.layouts[:-1]):
        after = found.layouts[i + 1].since
        if after and parse_time(after).replace(tzinfo=UTC) > limit:
            done.kept[layout.version] = f"replaced less than {grace:g} s ago"
            watch.grace(parse_time(after).replace(tzinfo=UTC) + timedelta(seconds=grace))
            continue
        others = [x for x in live if x is not layout]
        runs = _needing(stored, layout, others)
        running = await _in_flight(nc, subjects, runs)
        if running:
            p, run_id = running[0]
            done.kept[layout.version] = (
                f"{len(running)} run(s) in flight (such as {run_id} in partition {p})"
            )
            watch.in_flight[layout.version] = running
            continue
        relayed = max(x.count for x in others)
        busy = await _unrelayed(nc, subjects, range(relayed, max(x.count for x in live)))
        if busy:
            done.kept[layout.version] = busy
            watch.busy = True
            continue
        live = others
        retired.append(layout)
        done.retired.append(layout)
    for layout in list(retired):
        others = [x for x in (*live, *retired) if x is not layout]
        left = _needing(stored, layout, others)
        if not left:
            retired.remove(layout)
            done.forgotten.append(layout)
        else:
            p, run_id = left[0]
            done.kept[layout.version] = (
                f"{len(left)} ended run(s) stored by it (such as {run_id} in partition {p})"
            )
            watch.ended[layout.version] = len(left)
    retired.sort(key=lambda x: x.version)
    return msgspec.structs.replace(
        found, layouts=tuple(live), retired=tuple(retired), made=found.streams
    )


def _needing(
    stored: dict[int, list[str]], layout: Layout, others: list[Layout]
) -> list[tuple[int, str]]:
    """The stored runs only ``layout`` places where they are: (partition, run id)."""
    return [
        (p, run_id)
        for p, ids in stored.items()
        if p < layout.count
        for run_id in ids
        if _only_by(run_id, p, layout, others)
    ]


def _only_by(run_id: str, p: int, layout: Layout, others: list[Layout]) -> bool:
    """Whether ``layout`` places the run in partition ``p`` and none of ``others`` does."""
    return partition_of(run_id, layout.count) == p and all(
        partition_of(run_id, x.count) != p for x in others
    )


async def _stored_runs(nc: Client, subjects: Subjects, streams: int) -> dict[int, list[str]]:
    """Each partition's stored runs (the run ids of its stream's subjects)."""
    out: dict[int, list[str]] = {}
    for p in range(streams):
        filter_ = subjects.runs_of(p, partitioned=streams > 1)
        names = await _subjects(nc, subjects.runs_stream_of(p), filter_)
        out[p] = [subjects.run_id_of(name) for name in names]
    return out


async def _subjects(nc: Client, stream: str, filter_: str) -> list[str]:
    """Every subject of ``stream`` matching ``filter_``, paged as the server pages it.

    Raises:
        InterlockError: the pages did not add up to the total the server gave (a pass then
            retires nothing: it never judges a layout on part of its runs).
    """
    found: dict[str, None] = {}
    while True:
        body = {"subjects_filter": filter_, "offset": len(found)}
        try:
            info = await _api(nc, f"STREAM.INFO.{stream}", body)
        except JetStreamAPIError as exc:
            if exc.code == 404:
                return list(found)
            raise
        before = len(found)
        found.update(dict.fromkeys((info.get("state") or {}).get("subjects") or {}))
        total = info.get("total")
        if total is None or len(found) >= int(total):
            return list(found)
        if len(found) == before:
            raise InterlockError(
                f"listing the runs of {stream}: {len(found)} of {total} subjects read"
            )


async def _in_flight(
    nc: Client, subjects: Subjects, runs: list[tuple[int, str]]
) -> list[tuple[int, str]]:
    """The runs of ``runs`` whose log's last record is not a run's end."""
    gate = asyncio.Semaphore(_READS_AT_ONCE)
    out: list[tuple[int, str]] = []
    for i in range(0, len(runs), _READS_AT_ONCE * 16):  # bounded memory however many
        some = runs[i : i + _READS_AT_ONCE * 16]
        results = await asyncio.gather(*(_ended(nc, subjects, gate, p, r) for p, r in some))
        out += [run for run, done in zip(some, results, strict=True) if not done]
    return out


async def _still_in_flight(
    nc: Client, subjects: Subjects, runs: list[tuple[int, str]]
) -> list[tuple[int, str]]:
    """``runs`` without those at its head that have ended: read a few at a time, up to
    the first few found in flight (what has ended since, and a few reads more)."""
    gate = asyncio.Semaphore(_READS_AT_ONCE)
    for i in range(0, len(runs), _READS_AT_ONCE):
        some = runs[i : i + _READS_AT_ONCE]
        results = await asyncio.gather(*(_ended(nc, subjects, gate, p, r) for p, r in some))
        if not all(results):
            left = [run for run, done in zip(some, results, strict=True) if not done]
            return left + runs[i + _READS_AT_ONCE :]
    return []


async def _ended(
    nc: Client, subjects: Subjects, gate: asyncio.Semaphore, p: int, run_id: str
) -> bool:
    """Whether the run's log ends with a run's end (or is gone)."""
    stream = subjects.runs_stream_of(p)
    api = f"{js_api(nc)}.DIRECT.GET.{stream}.{subjects.run_in(run_id, p)}"
    async with gate:
        msg = await nc.request(api, b"", timeout=_TIMEOUT)
    status = (msg.headers or {}).get("Status")
    if status == "404":
        return True  # deleted since it was listed
    if status:
        raise JetStreamAPIError(f"DIRECT.GET.{stream}", {"code": int(status)})
    # A batch of records whose last is a run's end (a message that is not records is
    # not one: the run is taken to be in flight).
    if not any(t in msg.data for t in _TERMINAL):
        return False
    try:
        batch = ev.decode_batch(msg.data)
    except Exception:  # noqa: BLE001
        return False
    return bool(batch) and ev.record_type(batch[-1]) in ev.TERMINAL_TYPES


async def _last_deleted(nc: Client, subjects: Subjects) -> int:
    """The audit stream's last sequence (0: none, or no audit stream)."""
    try:
        info = await _api(nc, f"STREAM.INFO.{subjects.audit_stream}")
    except JetStreamAPIError as exc:
        if exc.code == 404:
            return 0
        raise
    return int((info.get("state") or {}).get("last_seq", 0))


async def _deleted_runs(nc: Client, subjects: Subjects, after: int, last: int) -> list[str]:
    """The runs whose deletion the audit stream recorded after sequence ``after``, up to
    ``last``: one read per deletion."""
    deleted: list[str] = []
    seq = after + 1
    while seq <= last:
        body = {"seq": seq, "next_by_subj": subjects.audit_deletions}
        try:
            got = (await _api(nc, f"STREAM.MSG.GET.{subjects.audit_stream}", body))["message"]
        except JetStreamAPIError as exc:
            if exc.code == 404:
                break  # no more
            raise
        if int(got["seq"]) > last:
            break
        deleted.append(subjects.run_id_of(got["subject"]))
        seq = int(got["seq"]) + 1
    return deleted


async def _unrelayed(nc: Client, subjects: Subjects, partitions: range) -> str:
    """Why the partitions about to be relayed no more cannot be yet (empty: they can)."""
    for p in partitions:
        stream = subjects.runs_stream_of(p)
        try:
            info = await _api(nc, f"CONSUMER.INFO.{stream}.relay")
        except JetStreamAPIError as exc:
            if exc.code == 404:
                continue  # never relayed: nothing to act on
            raise
        left = int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))
        if left:
            return f"partition {p}'s relay has {left} message(s) to act on"
    return ""


async def _api(nc: Client, what: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = json.dumps(body).encode() if body is not None else b""
    reply = json.loads((await nc.request(f"{js_api(nc)}.{what}", payload, timeout=_TIMEOUT)).data)
    error = reply.get("error")
    if error:
        raise JetStreamAPIError(what, error)
    result: dict[str, Any] = reply
    return result


class Housekeeping:
    """An orchestrator's passes of :func:`retire_layouts`: one at a time, in a task of its
    own (a pass over many stored runs must not hold the lease renewals up), at most every
    :data:`HOUSEKEEPING_S`, each listing the stored runs only when the last one's
    :class:`Watch` says something changed."""

    def __init__(self, every: float = HOUSEKEEPING_S, grace: float = RETIRE_GRACE_S) -> None:
        self.every, self.grace = every, grace
        self.watch: Watch | None = None
        self.passes: dict[str, int] = {"listed": 0, "checked": 0}
        """Passes that listed the stored runs, and passes that looked at the watch only."""
        self._task: asyncio.Task[None] | None = None
        self._last = -every

    def due(self) -> bool:
        running = self._task is not None and not self._task.done()
        return not running and time.monotonic() - self._last >= self.every

    def start(self, nc: Client, subjects: Subjects) -> None:
        self._last = time.monotonic()
        self._task = asyncio.create_task(self.pass_now(nc, subjects))

    async def pass_now(self, nc: Client, subjects: Subjects) -> None:
        """One pass: the watch's checks, and the stored runs listed if they say so."""
        try:
            if self.watch is not None:
                now = datetime.now(UTC)
                why = await self.watch.changed(nc, subjects, now)
                if not why:
                    self.passes["checked"] += 1
                    return
                log.debug("listing the stored runs: %s", why)
            self.watch = None  # listed again should this pass fail
            self.passes["listed"] += 1
            self.watch = (await retire_layouts(nc, subjects, grace=self.grace)).watch
        # Tried again at the next pass; the map is untouched by a pass that failed.
        except Exception as exc:  # noqa: BLE001
            log.warning("retiring partition layouts: %s", exc)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
