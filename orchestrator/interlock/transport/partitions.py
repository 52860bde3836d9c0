"""Run-log partitions: which of an installation's run-log streams holds a run's log.

A run's partition is ``fnv1a32(run_id) % P``: what the server's own subject mapping
function ``{{partition(P,1)}}`` gives for a subject whose wildcard is the run id, so a
mapping ``<prefix>.runs.*`` -> ``<prefix>.runs.{{partition(P,1)}}.{{wildcard(1)}}`` would
put each run where Interlock does. Interlock computes it itself instead of relying on a
server mapping: a mapping cannot change for the runs already under way when P changes, and
the partition count changes on a live installation.

The partition map is one key (``map``) of the partitions bucket. It holds the live layouts,
each a version with its count: the newest places new runs, and a run stays for good in the
partition it started in, so every run in flight is at one of the live layouts' partitions.
A layout none of whose runs is in flight any more is retired (:mod:`interlock.runtime.layouts`):
it moves to the map's retired layouts, kept while a run it placed (ended) is still stored,
so that run's log stays readable. Where a run is is therefore one of its candidates, one
per layout (most often the same one), the live layouts' first: with a single layout, no
lookup at all; with several, the first candidate whose stream holds the run's subject (an
exact read, answered by each stream's leader), remembered.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import OrderedDict
from typing import Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from interlock.core.vocabulary import InterlockError
from interlock.transport.leaders import balance_leaders
from interlock.transport.natsclient import js_api
from interlock.transport.sharing import SharedCall
from interlock.transport.subjects import Subjects

__all__ = [
    "MAP_KEY",
    "BadPartitionCount",
    "DamagedPartitionMap",
    "Layout",
    "PartitionMap",
    "PartitionMapConflict",
    "Placement",
    "balance_leaders",
    "check_count",
    "first_map",
    "partition_of",
    "read_map",
    "write_map",
]

log = logging.getLogger("interlock.partitions")

MAP_KEY: Final = "map"
MAX_PARTITIONS: Final = 256
"""The most partitions an installation may have (each is a stream with its own Raft group,
consumer and leader)."""
_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193
_TIMEOUT: Final = 5.0
_LOCATED_KEPT: Final = 100_000
_WRONG_LAST_SEQUENCE: Final = 10071
PLACE_FRESH_S: Final = 5.0
"""A process places a new run by a map it read at most this long before (read again
first when older), so a layout stops placing runs everywhere within this of its change."""
MISS_FRESH_S: Final = 1.0
"""A wait for a run that is not there yet does not read the map again at its first miss
when this process's copy is one layout read less than this long before (see
:meth:`Placement.lately_single`)."""


@functools.lru_cache(maxsize=65_536)
def partition_of(run_id: str, count: int) -> int:
    """The partition of ``run_id`` among ``count``: FNV-1a (32 bits) of the id modulo the
    count, as the server's ``partition(count, 1)`` mapping function computes it."""
    h = _FNV_OFFSET
    for byte in run_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h % count


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """One version of the partition map: how many partitions new runs were spread over."""

    version: int
    count: int
    since: str = ""
    """When it was set (RFC 3339, UTC; empty for the first)."""


class PartitionMap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The live layouts, oldest first (the last places new runs; every run in flight is
    in one of their partitions), and the retired ones (no run of theirs in flight; kept
    while a run they placed is stored)."""

    layouts: tuple[Layout, ...] = (Layout(version=1, count=1),)
    retired: tuple[Layout, ...] = ()
    """Oldest first. A reader looks in their partitions after the live layouts'."""
    made: int = 0
    """The run-log streams made so far (partitions 0 to this, exclusive): they stay, so
    that a layout retired and forgotten never narrows what exists."""

    @property
    def current(self) -> Layout:
        return self.layouts[-1]

    @property
    def single(self) -> bool:
        """Whether there is one layout and no other: every run is where it hashes to."""
        return len(self.layouts) == 1 and not self.retired

    @property
    def streams(self) -> int:
        """How many run-log streams there are (partitions 0 to this, exclusive)."""
        return max(self.made, *(x.count for x in (*self.layouts, *self.retired)))

    @property
    def relayed(self) -> int:
        """The partitions runs in flight may be in (0 to this, exclusive): those the
        orchestrators relay. The others' runs have all ended."""
        return max(layout.count for layout in self.layouts)

    def place(self, run_id: str) -> int:
        """The partition a run started now goes to."""
        return partition_of(run_id, self.current.count)

    def candidates(self, run_id: str) -> tuple[int, ...]:
        """The partitions a run may be in: the current layout's first, then each older
        live one's, newest first, then each retired one's, each once."""
        every = (*self.retired, *self.layouts)
        found = dict.fromkeys(partition_of(run_id, x.count) for x in reversed(every))
        return tuple(found)

    def live_candidates(self, run_id: str) -> tuple[int, ...]:
        """The partitions a run in flight may be in: the live layouts' (newest first)."""
        found = dict.fromkeys(partition_of(run_id, x.count) for x in reversed(self.layouts))
        return tuple(found)

    def resized(self, count: int, since: str) -> PartitionMap:
        """This map with a new layout of ``count`` partitions (the same map when the
        current layout has that count already)."""
        check_count(count)
        if count == self.current.count:
            return self
        version = max(x.version for x in (*self.layouts, *self.retired)) + 1
        layout = Layout(version=version, count=count, since=since)
        return msgspec.structs.replace(
            self, layouts=(*self.layouts, layout), made=max(self.streams, count)
        )


def first_map(count: int, *, stored: bool) -> PartitionMap:
    """The map an installation is provisioned with: ``count`` partitions from the start,
    or, when runs are ``stored`` already (in the one stream before partitions), the one
    partition they were placed by followed by ``count``."""
    check_count(count)
    if stored and count != 1:
        return PartitionMap().resized(count, "")
    return PartitionMap(layouts=(Layout(version=1, count=count),))


class PartitionMapConflict(InterlockError):
    """The partition map changed since it was read: read it again and decide again."""


class BadPartitionCount(ValueError, InterlockError):
    """A partition count out of range."""


def check_count(count: int) -> int:
    if not 1 <= count <= MAX_PARTITIONS:
        raise BadPartitionCount(f"a partition count is from 1 to {MAX_PARTITIONS}; {count} is not")
    return count


class DamagedPartitionMap(InterlockError):
    """The partition map's value is not what Interlock writes there."""


_MAP_FIELDS: Final = frozenset(PartitionMap.__struct_fields__)
_ONE = PartitionMap().layouts


def _decode_map(data: bytes) -> PartitionMap:
    """The map a value holds. Every field of the map has a default, so a JSON object of
    other fields would decode as the map of one partition: a JetStream acknowledgement or
    API answer written onto the key (a reply subject a user of the account named) is
    refused instead, as anything naming none of the map's fields (``{}``, the map of one
    partition, is what the map with every default encodes to)."""
    found = msgspec.json.decode(data)
    if not isinstance(found, dict) or (found and not _MAP_FIELDS & found.keys()):
        raise msgspec.ValidationError("not a partition map (none of its fields)")
    return msgspec.convert(found, PartitionMap)


def _map_subject(subjects: Subjects) -> str:
    return f"$KV.{subjects.partitions_bucket}.{MAP_KEY}"


async def read_map(nc: Client, subjects: Subjects) -> tuple[PartitionMap, int]:
    """The installation's partition map and its revision (0: never set, so one partition,
    as an installation provisioned before partitions, or without a partitions bucket)."""
    bucket = subjects.partitions_bucket
    api = f"{js_api(nc)}.DIRECT.GET.KV_{bucket}.{_map_subject(subjects)}"
    try:
        msg = await nc.request(api, b"", timeout=_TIMEOUT)
    except NoRespondersError:
        return PartitionMap(), 0
    headers = msg.headers or {}
    status = headers.get("Status")
    if status in ("404", "503") or headers.get("KV-Operation") in ("DEL", "PURGE"):
        return PartitionMap(), 0
    if status:
        raise InterlockError(f"reading the partition map ({bucket}/{MAP_KEY}): status {status}")
    try:
        found = _decode_map(msg.data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise DamagedPartitionMap(
            f"the partition map ({bucket}/{MAP_KEY}) is damaged: {exc}"
        ) from exc
    if not found.layouts:
        raise DamagedPartitionMap(f"the partition map ({bucket}/{MAP_KEY}) has no layout")
    return found, int(headers.get("Nats-Sequence", "0") or 0)


async def write_map(nc: Client, subjects: Subjects, new: PartitionMap, revision: int) -> int:
    """Store ``new`` if the map is still at ``revision`` (0: never set); its new revision.

    Raises:
        PartitionMapConflict: someone changed the map since ``revision``.
    """
    headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
    try:
        reply = await nc.request(
            _map_subject(subjects), msgspec.json.encode(new), timeout=_TIMEOUT, headers=headers
        )
    except NoRespondersError:
        raise InterlockError(
            f"no partitions bucket {subjects.partitions_bucket}: provision first"
        ) from None
    ack = json.loads(reply.data)
    error = ack.get("error")
    if error:
        if error.get("err_code") == _WRONG_LAST_SEQUENCE:
            raise PartitionMapConflict("the partition map changed meanwhile; try again")
        raise InterlockError(f"writing the partition map: {error.get('description', error)}")
    return int(ack["seq"])


class Placement:
    """Where runs' logs are, for one process: the partition map, read once and again when
    a run is not where it knows to look, and the runs it located.
    """

    def __init__(self, nc: Client, subjects: Subjects, found: PartitionMap | None = None) -> None:
        """``found``: the map to use (else it is read on first use)."""
        self._nc = nc
        self.subjects = subjects
        self.map = found or PartitionMap()
        self.revision = 0
        self._loaded = found is not None
        self._loading = asyncio.Lock()
        self._read_from = 0.0
        """When the newest read of the map that came back was asked (monotonic)."""
        self._reload = SharedCall(self.load)
        """The read of the map under way, else a new one: all who wait share it."""
        self._located: OrderedDict[str, int] = OrderedDict()

    def stream(self, partition: int) -> str:
        return self.subjects.runs_stream_of(partition)

    def subject(self, run_id: str, partition: int) -> str:
        return self.subjects.run_in(run_id, partition)

    async def load(self) -> PartitionMap:
        """The map, read now (and kept)."""
        async with self._loading:
            asked = time.monotonic()
            try:
                found, revision = await read_map(self._nc, self.subjects)
            except DamagedPartitionMap as exc:
                if not self._loaded:
                    raise
                self._keep(str(exc))
            else:
                if revision or not self.revision:
                    self.map, self.revision = found, revision
                # Nothing of Interlock's removes the map once written.
                else:
                    self._keep("the partition map was removed")
            self._loaded = True
            self._read_from = max(self._read_from, asked)
        return self.map

    def _keep(self, why: str) -> None:
        """Go on with the map read last, which a damaged or removed value does not
        replace (that would place and look for runs by one partition)."""
        log.warning(
            "%s; going on with the map read before (revision %d), to write back with a put "
            "of this value to the key: %s",
            why,
            self.revision,
            msgspec.json.encode(self.map).decode(),
        )

    async def _read_since(self, since: float) -> None:
        """Until the map was read by a request sent after ``since`` (one read at a time,
        shared by all who wait for it: many misses at once cost one read)."""
        while self._read_from < since:
            await self._reload()

    async def current(self) -> PartitionMap:
        """The map as known here (read first if it never was: one read, however many ask
        for it at once, as the first appends of a process do)."""
        while not self._loaded:
            await self._reload()
        return self.map

    def located(self, run_id: str) -> bool:
        """Whether this process found or saw where ``run_id`` is."""
        return run_id in self._located

    def known(self, run_id: str) -> int:
        """The partition ``run_id`` is in as far as this process knows without asking: where
        it was found or seen, else its current layout's partition."""
        found = self._located.get(run_id)
        return self.map.place(run_id) if found is None else found

    def seen(self, run_id: str, partition: int) -> None:
        """Remember that ``run_id`` is in ``partition`` (read from its stream, or started
        there)."""
        if self.map.single and partition == self.map.place(run_id):
            return
        self._located[run_id] = partition
        if len(self._located) > _LOCATED_KEPT:
            self._located.popitem(last=False)

    async def locate(self, run_id: str) -> int:
        """The partition to read ``run_id``'s log in: where it was found, or its only
        candidate (no read), or the first candidate holding it (its current layout's
        partition when none does: a run not started yet)."""
        if self._loaded and self.map.layouts == _ONE and not self.map.retired:
            return 0  # one stream, as before partitions: nothing to compute
        known = self._located.get(run_id)
        if known is not None:
            return known
        current = await self.current()
        candidates = current.candidates(run_id)
        if len(candidates) == 1:
            return candidates[0]
        found = await self._look(run_id, candidates)
        return candidates[0] if found is None else found

    async def relocate(self, run_id: str, partition: int) -> int | None:
        """Another partition holding ``run_id``, which was not found in ``partition``:
        read the map again (a layout set since it was read here may have placed the run;
        misses at the same time share one read) and look in the candidates (None: no
        other holds it)."""
        if self._located.get(run_id) == partition:
            del self._located[run_id]
        await self._read_since(time.monotonic())
        others = tuple(c for c in self.map.candidates(run_id) if c != partition)
        return await self._look(run_id, others)

    def lately_single(self) -> bool:
        """Whether this process's copy of the map is one layout (none retired) read less
        than :data:`MISS_FRESH_S` ago: a run not found then is most likely not started yet,
        so a wait for it need not read the map again before its next look."""
        return (
            self._loaded
            and self.map.layouts == _ONE
            and not self.map.retired
            and time.monotonic() - self._read_from < MISS_FRESH_S
        )

    async def place_new(self, run_id: str) -> int:
        """Where a run with this id starts: where a run with it is already (so that
        starting it again finds it), else in the current layout's partition (by a map
        read at most :data:`PLACE_FRESH_S` ago)."""
        now = time.monotonic()
        if now - self._read_from > PLACE_FRESH_S:
            await self._read_since(now - PLACE_FRESH_S)
        current = self.map
        if current.layouts == _ONE and not current.retired:
            return 0
        candidates = current.candidates(run_id)
        found = await self._look(run_id, candidates[1:]) if len(candidates) > 1 else None
        if found is None:
            found = candidates[0]
            self.seen(run_id, found)
        return found

    async def _look(self, run_id: str, partitions: tuple[int, ...]) -> int | None:
        """The first of ``partitions`` whose stream holds the run (remembered)."""
        for partition in partitions:
            if await self._holds(partition, run_id):
                self.seen(run_id, partition)
                return partition
        return None

    async def _holds(self, partition: int, run_id: str) -> bool:
        api = f"{js_api(self._nc)}.STREAM.MSG.GET.{self.stream(partition)}"
        body = json.dumps({"last_by_subj": self.subject(run_id, partition)}).encode()
        try:
            reply = json.loads((await self._nc.request(api, body, timeout=_TIMEOUT)).data)
        except (NoRespondersError, NatsTimeoutError) as exc:
            raise InterlockError(
                f"looking for run {run_id} in partition {partition}: {exc}"
            ) from exc
        error = reply.get("error")
        if error is None:
            return True
        if error.get("code") == 404:
            return False
        raise InterlockError(f"looking for run {run_id} in partition {partition}: {error}")
