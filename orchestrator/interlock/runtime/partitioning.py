"""Changing and showing the run-log partitions of a live installation.

``set_partitions`` adds a layout to the partition map (:mod:`interlock.transport.partitions`):
the streams of the new partitions are made first (as replicated as the first partition's),
then the map is written with a compare-and-set, so no process ever places a run in a
partition without a stream. Runs under way stay where they started; new runs go by the new
layout as soon as each process reads the map (the orchestrators within
:data:`relay.MAP_CHECK_S`, any process within :data:`PLACE_FRESH_S` before it places a run,
and when it misses one). Lowering the count keeps every stream: the runs of the partitions
no longer used for new runs finish there, then the old layout is retired
(:mod:`interlock.runtime.layouts`) and those partitions are no longer relayed; their logs
stay readable.

``balance_leaders`` (:mod:`interlock.transport.leaders`) asks the partitions' stream
leaders to step down only where they are not spread over the nodes, the fewest of them,
so that appends to different partitions go through different nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.aio.client import Client

from interlock.transport.clock import utc_now
from interlock.transport.errors import JetStreamAPIError
from interlock.transport.natsclient import js_api
from interlock.transport.partitions import (
    PartitionMap,
    PartitionMapConflict,
    balance_leaders,
    check_count,
    read_map,
    write_map,
)
from interlock.transport.provision import jetstream_api, provision_streams
from interlock.transport.streamconfigs import desired_configs
from interlock.transport.subjects import Subjects

_TIMEOUT = 5.0
_ATTEMPTS = 5


@dataclass(slots=True)
class PartitionInfo:
    """One partition as the server and the map see it."""

    partition: int
    stream: str
    placing: bool
    """Whether new runs go to it (the current layout counts it)."""
    relayed: bool = True
    """Whether runs in flight may be in it (a live layout counts it): the orchestrators
    relay it. Else it is retired: its stream keeps ended runs' logs, read only."""
    leader: str = ""
    peers: list[str] = field(default_factory=list)
    messages: int = 0
    owner: str = ""
    """The orchestrator replica that decides its runs (empty: none holds it now)."""


async def set_partitions(nc: Client, subjects: Subjects, count: int) -> tuple[PartitionMap, bool]:
    """Make ``count`` the partitions new runs are spread over; (the map, whether it
    changed). Raises :class:`BadPartitionCount` for a count out of range."""
    check_count(count)
    for _ in range(_ATTEMPTS):
        found, revision = await read_map(nc, subjects)
        wanted = found.resized(count, utc_now())
        if wanted is found:
            return found, False
        replicas = await _replicas(nc, subjects)
        configs = desired_configs(subjects, replicas=replicas, streams=wanted.streams)
        runs = {subjects.runs_stream_of(p) for p in range(wanted.streams)}
        await provision_streams(nc, js_api(nc), subjects, [c for c in configs if c["name"] in runs])
        try:
            await write_map(nc, subjects, wanted, revision)
        except PartitionMapConflict:
            continue
        await balance_leaders(nc, subjects, wanted.streams)
        return wanted, True
    raise PartitionMapConflict("the partition map kept changing; try again")


async def _replicas(nc: Client, subjects: Subjects) -> int:
    info = await jetstream_api(nc, f"STREAM.INFO.{subjects.runs_stream}")
    return int(info.get("config", {}).get("num_replicas", 1))


async def partitions(nc: Client, subjects: Subjects) -> tuple[PartitionMap, list[PartitionInfo]]:
    """The map and every partition's stream: leader, peers, messages and owner."""
    from interlock.runtime.ownership import owners

    found, _ = await read_map(nc, subjects)
    held = await owners(nc, subjects)
    out: list[PartitionInfo] = []
    for p in range(found.streams):
        stream = subjects.runs_stream_of(p)
        info = PartitionInfo(
            p, stream, p < found.current.count, p < found.relayed, owner=held.get(p, "")
        )
        try:
            got = await jetstream_api(nc, f"STREAM.INFO.{stream}")
        except JetStreamAPIError:
            out.append(info)
            continue
        cluster = got.get("cluster") or {}
        info.leader = cluster.get("leader", "")
        info.peers = sorted([info.leader, *(r["name"] for r in cluster.get("replicas", []))])
        info.messages = int(got.get("state", {}).get("messages", 0))
        out.append(info)
    return found, out
