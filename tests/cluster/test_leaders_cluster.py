"""Partition leaders on a three-node cluster: spread when they are not, left alone when
they are (a replica's start must not interrupt the appends of every partition)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client
from test_cluster import (  # the three-node cluster and its helpers
    Cluster,
    cluster,
    connect,
    free_ports,
    http_get,
    jetstream_ready,
    spawn,
    until,
)

from interlock.transport.leaders import led, moves
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

__all__ = ["cluster"]

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]

P = 3


async def _leaders(nc: Client, subjects: Subjects) -> dict[str, tuple[str, str]]:
    """Each partition stream's (leader, leader since): an election changes the second."""
    out = {}
    for p in range(P):
        stream = subjects.runs_stream_of(p)
        raw = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
        cluster = json.loads(raw.data)["cluster"]
        out[stream] = (cluster["leader"], cluster["leader_since"])
    return out


async def test_a_start_spreads_leaders_that_are_not_and_leaves_spread_ones(
    cluster: Cluster, tmp_path: Path
) -> None:
    subjects = Subjects(prefix="ill")
    await jetstream_ready(cluster.urls)
    nc = await connect(cluster.urls)
    serve = None
    try:
        await provision(nc.jetstream(), subjects, replicas=3, partitions=P)

        async def lead(nodes: list[str]) -> bool:
            """Partition p led by nodes[p] (asked of each leader that is not)."""
            streams = await led(nc, subjects, P)
            for s in streams:
                if s.leader and s.leader != nodes[s.partition]:
                    stream = subjects.runs_stream_of(s.partition)
                    body = b'{"placement":{"preferred":"%s"}}' % nodes[s.partition].encode()
                    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)
            return [s.leader for s in streams] == nodes

        await until(lambda: lead(["nats-1"] * P), "every partition led by nats-1", within=30)

        # A process's start (here the CLI's provisioning) finds them all on one node.
        await provision(nc.jetstream(), subjects, replicas=3)

        async def spread() -> bool:
            streams = await led(nc, subjects, P)
            return all(s.leader for s in streams) and not moves(streams)

        await until(spread, "partition leaders spread again", within=30)
        assert len({leader for leader, _ in (await _leaders(nc, subjects)).values()}) == P

        # Spread, though not each on the node of its turn (as elections leave them).
        await until(lambda: lead(["nats-2", "nats-3", "nats-1"]), "leaders rotated", within=30)
        before = await _leaders(nc, subjects)
        assert all(since for _, since in before.values()), before

        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INTERLOCK_"))}
        env.update(INTERLOCK_URL=",".join(cluster.urls), INTERLOCK_PREFIX=subjects.prefix)
        (port,) = free_ports(1)
        argv = [sys.executable, "-m", "interlock", "serve", "--replicas", "3"]
        serve = spawn("serve", [*argv, "--metrics-port", str(port)], tmp_path, env)

        async def ready() -> bool:
            assert serve is not None
            assert serve.popen.poll() is None, serve.tail()
            status, _ = await http_get(port, "/readyz")
            return bool(status == 200)

        await until(ready, "serve ready", within=30)
        # The start provisioned (before it was ready) and found them spread: no election.
        assert await _leaders(nc, subjects) == before
    finally:
        if serve is not None:
            serve.stop(5)
        await nc.close()
