"""What may change the outcome of a pass retiring partition layouts, read cheaply.

A pass of :func:`interlock.runtime.layouts.retire_layouts` lists every stored run. It
leaves a :class:`Watch`: the map's revision it judged, the runs in flight that kept a
layout live (once a layout stops placing runs, no new run needs it: only these can end),
the moment a layout kept for its grace may go, and per retired layout the number of stored
runs only it places (only deleting runs lowers it: each deletion is in the audit stream,
read from where the pass left it; a run still stored whose deletion is among the last
:data:`RECENT` recorded before the pass listed is being deleted, its purge to follow, and
is not counted). The next pass checks those (a map read, one audit
stream info, an exact read of each run in flight until one still is, one read per run
deleted since) and lists again only when the map changed, a grace ran out, a relay had
messages left, the runs in flight that kept a layout have all ended, a retired layout's
count reached zero, or runs were deleted and the count is :data:`RECOUNT_S` old. The watch
only says when to look; the listing decides, so a watch that is wrong (a run deleted by
other means than retention or ``interlock runs delete``) delays a change to the map,
never makes a wrong one, and each process's first pass lists.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.transport.errors import JetStreamAPIError
from interlock.transport.natsclient import js_api
from interlock.transport.partitions import Layout, PartitionMap, partition_of, read_map
from interlock.transport.provision import jetstream_api
from interlock.transport.subjects import Subjects

__all__ = [
    "READS_AT_ONCE",
    "RECENT",
    "RECOUNT_S",
    "Watch",
    "last_deleted",
    "only_by",
    "run_ended",
]

RECOUNT_S = 3600.0
"""How long after a pass listed the stored runs, runs having been deleted since, the next
lists them again, whatever its watch says (see :class:`Watch`)."""
RECENT = 256
"""The deletions recorded just before a pass lists that it reads, to leave out of its counts
the runs being deleted as it lists (their purge follows their audit record)."""
_TIMEOUT = 5.0
READS_AT_ONCE = 64
_TERMINAL = tuple(t.encode() for t in ev.TERMINAL_TYPES)


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
    listed: datetime | None = None
    """When the pass listed the stored runs."""
    lowered: bool = False
    """Deletions lowered a count of :attr:`ended` since (see :data:`RECOUNT_S`)."""
    deleting: set[str] = field(default_factory=set)
    """The runs of the last :data:`RECENT` deletions recorded before the pass listed: one
    still stored then was being deleted (recorded, not yet purged), and is not counted."""

    async def recent(self, nc: Client, subjects: Subjects) -> None:
        """Read :attr:`deleting`: the deletions recorded just before :attr:`deleted`."""
        self.deleting = set(
            await _deleted_runs(nc, subjects, max(0, self.deleted - RECENT), self.deleted)
        )

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
        if not self.ended:
            return ""
        why = await self._deletions(nc, subjects, found)
        recount = self.listed is not None and now - self.listed >= timedelta(seconds=RECOUNT_S)
        if not why and self.lowered and recount:
            return f"runs were deleted since they were counted, {RECOUNT_S / 3600:g} h ago"
        return why

    async def _deletions(self, nc: Client, subjects: Subjects, found: PartitionMap) -> str:
        last = await last_deleted(nc, subjects)
        deleted, self.deleted = await _deleted_runs(nc, subjects, self.deleted, last), last
        every = (*found.layouts, *found.retired)
        for layout in found.retired:
            if layout.version not in self.ended:
                continue
            others = [x for x in every if x is not layout]
            lowered = sum(
                only_by(run_id, partition_of(run_id, layout.count), layout, others)
                for run_id in deleted
            )
            self.ended[layout.version] -= lowered
            self.lowered = self.lowered or lowered > 0
            if self.ended[layout.version] <= 0:
                return f"the runs only layout {layout.version} places were deleted"
        return ""


def only_by(run_id: str, p: int, layout: Layout, others: list[Layout]) -> bool:
    """Whether ``layout`` places the run in partition ``p`` and none of ``others`` does."""
    return partition_of(run_id, layout.count) == p and all(
        partition_of(run_id, x.count) != p for x in others
    )


async def _still_in_flight(
    nc: Client, subjects: Subjects, runs: list[tuple[int, str]]
) -> list[tuple[int, str]]:
    """``runs`` without those at its head that have ended: read a few at a time, up to
    the first few found in flight (what has ended since, and a few reads more)."""
    gate = asyncio.Semaphore(READS_AT_ONCE)
    for i in range(0, len(runs), READS_AT_ONCE):
        some = runs[i : i + READS_AT_ONCE]
        results = await asyncio.gather(*(run_ended(nc, subjects, gate, p, r) for p, r in some))
        if not all(results):
            left = [run for run, done in zip(some, results, strict=True) if not done]
            return left + runs[i + READS_AT_ONCE :]
    return []


async def run_ended(
    nc: Client, subjects: Subjects, gate: asyncio.Semaphore, p: int, run_id: str
) -> bool:
    """Whether the run's log ends with a run's end (or is gone)."""
    stream = subjects.runs_stream_of(p)
    subject = f"{js_api(nc)}.DIRECT.GET.{stream}.{subjects.run_in(run_id, p)}"
    async with gate:
        msg = await nc.request(subject, b"", timeout=_TIMEOUT)
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


async def last_deleted(nc: Client, subjects: Subjects) -> int:
    """The audit stream's last sequence (0: none, or no audit stream)."""
    try:
        info = await jetstream_api(nc, f"STREAM.INFO.{subjects.audit_stream}")
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
            what = f"STREAM.MSG.GET.{subjects.audit_stream}"
            got = (await jetstream_api(nc, what, body))["message"]
        except JetStreamAPIError as exc:
            if exc.code == 404:
                break  # no more
            raise
        if int(got["seq"]) > last:
            break
        deleted.append(subjects.run_id_of(got["subject"]))
        seq = int(got["seq"]) + 1
    return deleted
