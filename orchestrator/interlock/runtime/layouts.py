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
them only when its :class:`~interlock.runtime.layoutwatch.Watch` says something that could
change the outcome did (:mod:`interlock.runtime.layoutwatch`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
from nats.aio.client import Client

from interlock.core.rfc3339 import parse_time
from interlock.core.vocabulary import InterlockError
from interlock.runtime.layoutwatch import (
    READS_AT_ONCE,
    Watch,
    last_deleted,
    only_by,
    run_ended,
)
from interlock.transport.clock import utc_now
from interlock.transport.errors import JetStreamAPIError
from interlock.transport.partitions import (
    PLACE_FRESH_S,
    Layout,
    PartitionMap,
    PartitionMapConflict,
    read_map,
    write_map,
)
from interlock.transport.provision import jetstream_api
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
_ATTEMPTS = 5
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
        now = now or utc_now()
        watch = Watch(revision, await last_deleted(nc, subjects), listed=_utc(now))
        stored = await _stored_runs(nc, subjects, found.streams)
        await watch.recent(nc, subjects)
        wanted = await _decide(nc, subjects, found, stored, grace, now, done, watch)
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
    limit = _utc(now) - timedelta(seconds=grace)
    for i, layout in enumerate(found.layouts[:-1]):
        after = found.layouts[i + 1].since
        if after and _utc(after) > limit:
            done.kept[layout.version] = f"replaced less than {grace:g} s ago"
            watch.grace(_utc(after) + timedelta(seconds=grace))
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
            watch.ended[layout.version] = sum(r not in watch.deleting for _, r in left)
    retired.sort(key=lambda x: x.version)
    return msgspec.structs.replace(
        found, layouts=tuple(live), retired=tuple(retired), made=found.streams
    )


def _utc(time: str) -> datetime:
    return parse_time(time).replace(tzinfo=UTC)


def _needing(
    stored: dict[int, list[str]], layout: Layout, others: list[Layout]
) -> list[tuple[int, str]]:
    """The stored runs only ``layout`` places where they are: (partition, run id)."""
    return [
        (p, run_id)
        for p, ids in stored.items()
        if p < layout.count
        for run_id in ids
        if only_by(run_id, p, layout, others)
    ]


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
            info = await jetstream_api(nc, f"STREAM.INFO.{stream}", body)
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
    gate = asyncio.Semaphore(READS_AT_ONCE)
    out: list[tuple[int, str]] = []
    for i in range(0, len(runs), READS_AT_ONCE * 16):  # bounded memory however many
        some = runs[i : i + READS_AT_ONCE * 16]
        results = await asyncio.gather(*(run_ended(nc, subjects, gate, p, r) for p, r in some))
        out += [run for run, done in zip(some, results, strict=True) if not done]
    return out


async def _unrelayed(nc: Client, subjects: Subjects, partitions: range) -> str:
    """Why the partitions about to be relayed no more cannot be yet (empty: they can)."""
    for p in partitions:
        stream = subjects.runs_stream_of(p)
        try:
            info = await jetstream_api(nc, f"CONSUMER.INFO.{stream}.relay")
        except JetStreamAPIError as exc:
            if exc.code == 404:
                continue  # never relayed: nothing to act on
            raise
        left = int(info.get("num_pending", 0)) + int(info.get("num_ack_pending", 0))
        if left:
            return f"partition {p}'s relay has {left} message(s) to act on"
    return ""


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
