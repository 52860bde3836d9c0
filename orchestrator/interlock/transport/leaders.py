"""Spreading the run-log partitions' stream leaders over a cluster's nodes.

Every append to a partition goes through its stream's leader, so partitions led by one
node while another leads none put their appends on one node. A stream's leader hands over
only when asked (a step-down, which pauses the stream's appends for a moment), so it is
asked only where the spread is off: a node leads two partitions more than another node
the stream could be led by. Then the fewest step-downs bring every such pair within one
of each other, each to the node the rule of :func:`moves` names. Leaders already spread
are never asked, so each start of a process (every replica of a rolling restart
provisions) leaves appends alone.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from interlock.core.vocabulary import InterlockError
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

__all__ = ["Led", "balance_leaders", "moves"]

_TIMEOUT: Final = 5.0


@dataclass(frozen=True, slots=True)
class Led:
    """One partition's stream as the cluster reports it: its leader and every peer
    (the leader included)."""

    partition: int
    leader: str
    peers: tuple[str, ...]


def moves(streams: list[Led]) -> list[tuple[int, str]]:
    """(partition, node to lead it) for each step-down that spreading the leaders takes
        (empty when they are spread: no node leads two more than a node one of its streams
        could move to). Streams without a leader or without other peers are left (a leader
    of one still counts for its node).

        Each move takes a partition from the node that leads the most to a peer of its stream
        that leads the fewest; among candidates, the partition whose turn is that peer first
        (partition ``p`` on the ``p % n``-th of its ``n`` peers sorted by name), then the
        lowest partition. Each move lowers the spread, so there are at most as many as
        partitions."""
    movable = [s for s in streams if s.leader and len(s.peers) > 1]
    leader = {s.partition: s.leader for s in streams if s.leader}  # all count: R1 ones too
    planned: dict[int, str] = {}
    for _ in range(len(movable)):
        count = Counter(leader.values())  # a node that leads none counts 0
        best: tuple[int, bool, int, str] | None = None
        for s in movable:
            here = leader[s.partition]
            ordered = sorted(s.peers)
            turn = ordered[s.partition % len(ordered)]
            for peer in ordered:
                gap = count[here] - count[peer]
                if gap < 2:
                    continue
                key = (-gap, peer != turn, s.partition, peer)
                if best is None or key < best:
                    best = key
        if best is None:
            break
        _, _, partition, peer = best
        leader[partition] = planned[partition] = peer
    return sorted(planned.items())


async def led(nc: Client, subjects: Subjects, streams: int) -> list[Led]:
    """Each partition's leader and peers, as its stream's leader reports them (a
    partition whose stream does not answer is left out)."""
    out: list[Led] = []
    for p in range(streams):
        try:
            got = await _js_api(nc, f"STREAM.INFO.{subjects.runs_stream_of(p)}")
        except InterlockError:
            continue
        cluster = got.get("cluster") or {}
        leader = cluster.get("leader", "")
        replicas = [r["name"] for r in cluster.get("replicas", [])]
        out.append(Led(p, leader, tuple(sorted([leader, *replicas]) if leader else replicas)))
    return out


async def balance_leaders(nc: Client, subjects: Subjects, streams: int) -> int:
    """Ask the leaders of the partitions that :func:`moves` names to hand over, each to
    its node; how many were asked (none when the leaders are spread; best effort: a
    stream that refuses is left)."""
    asked = 0
    for partition, node in moves(await led(nc, subjects, streams)):
        body = {"placement": {"preferred": node}}
        try:
            await _js_api(nc, f"STREAM.LEADER.STEPDOWN.{subjects.runs_stream_of(partition)}", body)
            asked += 1
        except InterlockError:
            continue
    return asked


async def _js_api(nc: Client, what: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = json.dumps(body).encode() if body is not None else b""
    try:
        reply = json.loads(
            (await nc.request(f"{js_api(nc)}.{what}", payload, timeout=_TIMEOUT)).data
        )
    except (NoRespondersError, NatsTimeoutError) as exc:
        raise InterlockError(f"{what}: {exc}") from exc
    error = reply.get("error")
    if error:
        raise InterlockError(f"{what}: {error.get('description', error)}")
    found: dict[str, Any] = reply
    return found
