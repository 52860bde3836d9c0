"""Run logs spread over partitions: placement, child runs, addressing, and a live resize."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import nats
import pytest
from prometheus_client import CollectorRegistry

import interlock
from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.flow import child_run_id
from interlock.runtime.health import OrchestratorInstrumentation
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.ownership import Ownership, owners
from interlock.runtime.partitioning import partitions, set_partitions
from interlock.runtime.service import Orchestrator
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.partitions import BadPartitionCount, partition_of, read_map
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.runtime import (
    REPO,
    TIMEOUT,
    TWO_ECHOES,
    WAITER,
    cli_env,
    connect,
    run_cli,
    running_stack,
)

SUBWORKFLOW = (REPO / "examples" / "subworkflow.yaml").read_text()


async def test_a_runs_partition_is_what_the_servers_partition_mapping_gives(
    tmp_path: Path,
) -> None:
    # The server maps m.<id> onto p.<partition>.<id> with its own hash: ours must agree.
    conf = tmp_path / "mapping.conf"
    conf.write_text('mappings = { "m.*": "p.{{partition(7,1)}}.{{wildcard(1)}}" }\n')
    server = EmbeddedNats(tmp_path / "data", args=["-c", str(conf)])
    server.start()
    try:
        nc = await nats.connect(server.url)
        got: list[str] = []

        async def seen(msg: nats.aio.msg.Msg) -> None:
            got.append(msg.subject)

        await nc.subscribe("p.>", cb=seen)
        ids = [f"r{uuid.uuid4().hex[:12]}" for _ in range(100)] + ["a", "Z_9-x", "0"]
        for run_id in ids:
            await nc.publish(f"m.{run_id}", b"")
        await nc.flush()
        for _ in range(3000):
            if len(got) == len(ids):
                break
            await asyncio.sleep(0.01)
        await nc.close()
    finally:
        server.stop()
    assert sorted(got) == sorted(f"p.{partition_of(i, 7)}.{i}" for i in ids)


async def _stream_of(client: InterlockClient, run_id: str) -> str:
    return (await client.log.where(run_id))[0]


async def test_runs_and_their_children_spread_over_the_partitions_and_complete(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [SUBWORKFLOW], partitions=3) as stack:
        found, _ = await read_map(stack.client.nc, subjects)
        assert found.current.count == 3
        # Four in each partition: ids chosen, where twelve random ones and their children
        # left one of the three partitions empty about once in 5,000 tries.
        some = [f"spread-{i}" for i in range(100)]
        ids = [r for p in range(3) for r in [x for x in some if partition_of(x, 3) == p][:4]]
        runs = [
            await stack.client.start("greet-parent", {"who": f"w{i}"}, run_id=run_id)
            for i, run_id in enumerate(ids)
        ]
        states = [await stack.wait(r) for r in runs]
        assert [s.status for s in states] == ["completed"] * 12
        assert [s.outputs for s in states] == [{"greeting": f"hello w{i}"} for i in range(12)]
        streams = set()
        for run_id in runs:
            requested = next(
                r for r in await stack.records(run_id) if isinstance(r, ev.ActionRequested)
            )
            child = child_run_id(requested.data.action_id, 1)
            for one in (run_id, child):
                # Each log is in the stream its id hashes to, and only there.
                stream = subjects.runs_stream_of(partition_of(one, 3))
                assert await _stream_of(stack.client, one) == stream
                info = await stack.js.stream_info(stream, subjects_filter=">")
                assert info.state.subjects is not None
                assert sum(1 for s in info.state.subjects if s.endswith(f".{one}")) == 1
                streams.add(stream)
            assert (await stack.client.state(child)).parent.run_id == run_id  # type: ignore[union-attr]
        assert len(streams) == 3
        # The first partition keeps the one stream's name and subjects of a run's log.
        assert subjects.runs_stream in streams
        _, infos = await partitions(stack.client.nc, subjects)
        assert [i.stream for i in infos] == [subjects.runs_stream_of(p) for p in range(3)]
        assert sum(i.messages for i in infos) >= 24


async def test_a_live_resize_places_new_runs_and_runs_under_way_finish_where_they_are(
    nats_url: str, subjects: Subjects
) -> None:
    # An installation of one partition (one stream, as before partitions) is resized while
    # its orchestrator runs: its one stream's subjects narrow to make room for the others.
    async with running_stack(nats_url, subjects, [WAITER]) as stack:
        before = [await stack.client.start("waiter", {}) for _ in range(8)]
        # A client that read the map before the resize, and keeps it.
        stale = InterlockClient(await connect(nats_url), subjects)
        assert (await stale.log.placement.current()).current.count == 1
        changed, did = await set_partitions(stack.client.nc, subjects, 5)
        assert did
        assert [x.count for x in changed.layouts] == [1, 5]
        again, did = await set_partitions(stack.client.nc, subjects, 5)
        assert not did
        assert again == changed
        fresh = InterlockClient(await connect(nats_url), subjects)
        after = [await fresh.start("waiter", {}) for _ in range(10)]
        # Every run is addressed by its id (the `runid` extension) wherever it is.
        for i, run_id in enumerate(before + after):
            event = CloudEvent(
                id=f"go-{i}",
                source="test://partitions",
                type="go",
                time=utc_now(),
                extensions={"runid": run_id},
            )
            await stack.client.emit(event)
        for run_id in before + after:
            state = await asyncio.wait_for(stale.wait(run_id), TIMEOUT)
            assert state.status == "completed", run_id
        for run_id in before:
            assert await _stream_of(fresh, run_id) == subjects.runs_stream_of(
                partition_of(run_id, 1)
            )
        for run_id in after:
            assert await _stream_of(fresh, run_id) == subjects.runs_stream_of(
                partition_of(run_id, 5)
            )
        # A run under way is not started again under the new layout.
        assert not (await fresh.runs.start(*(await _waiter(fresh)), before[0], {}))[0]
        # Lowering keeps every stream: the old partitions' logs stay readable.
        lowered, _ = await set_partitions(stack.client.nc, subjects, 1)
        assert lowered.streams == 5
        assert lowered.current.count == 1
        for run_id in before + after:
            assert (await stale.state(run_id)).status == "completed"
        with pytest.raises(BadPartitionCount):
            await set_partitions(stack.client.nc, subjects, 0)
        for client in (stale, fresh):
            await client.nc.close()


async def _waiter(client: InterlockClient) -> tuple[object, int]:
    definition, version = await client.registry.latest("waiter")
    return definition, version


async def test_leases_spread_partitions_over_replicas_and_a_dead_ones_move(
    nats_url: str, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    # Three replicas' leases on six partitions, with a short TTL: each takes its share, none
    # twice; one that stops renewing (dead) loses its partitions to the others. (Two seconds:
    # a busy machine can hold a round up for one, and a lease must outlive that.)
    caplog.set_level(logging.INFO, logger="interlock.orchestrator")
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    nc = client.nc
    a, b, c = (Ownership(nc, subjects, name, ttl=2) for name in ("a", "b", "c"))
    for replica in (a, b, c):
        await replica.round(6)  # each says it is alive; a takes what it can first
    for _ in range(3):
        for replica in (a, b, c):
            await replica.round(6)
    held = [set(r.held) for r in (a, b, c)]
    assert sorted(len(h) for h in held) == [2, 2, 2]
    assert set().union(*held) == set(range(6))
    assert await owners(nc, subjects) == {p: r.me for r in (a, b, c) for p in r.held}
    # c dies: its leases (and its presence) expire, and a and b take its partitions.
    lost = set(c.held)
    began = time.monotonic()
    while set(a.held) | set(b.held) != set(range(6)):
        assert time.monotonic() - began < TIMEOUT, "the dead replica's partitions did not move"
        await asyncio.sleep(0.25)
        for replica in (a, b):
            await replica.round(6)
    assert not (set(a.held) & set(b.held))
    assert lost <= set(a.held) | set(b.held)
    # Each move is logged with the share that made it.
    taken = {r.getMessage() for r in caplog.records if "lease taken" in r.getMessage()}
    for p in lost:
        assert (
            f"partition {p}: lease taken (a fair share of 3 of 6 with 2 live replicas)" in taken
        ), taken
    # A replica whose lease was taken while it was away lets it go at its next renewal.
    await c.round(6)
    assert not (set(c.held) & (set(a.held) | set(b.held)))
    # A replica that stops releases its leases: taken at once by the others' next round.
    await b.release_all()
    await b.nc.publish(f"$KV.{subjects.partitions_bucket}.replica.b", b"")  # gone too
    for _ in range(2):
        for replica in (a, c):
            await replica.round(6)
    assert set(a.held) | set(c.held) == set(range(6))
    await nc.close()


async def test_the_cli_shows_and_sets_the_partitions(
    nats_url: str, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    provisioned = InterlockClient(await connect(nats_url), subjects)
    await provisioned.ensure_provisioned()
    await provisioned.nc.close()
    env = cli_env(nats_url, subjects.prefix)
    shown = run_cli("partitions", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [p["stream"] for p in json.loads(shown.stdout)["partitions"]] == [subjects.runs_stream]
    raised = run_cli("partitions", "set", "3", env=env)
    assert raised.returncode == 0, raised.stderr
    assert "new runs go to 3 partitions" in raised.stdout
    table = run_cli("partitions", env=env)
    assert table.returncode == 0, table.stderr
    assert subjects.runs_stream_of(2) in table.stdout
    assert "layouts: 1: 1, 2: 3" in table.stdout
    wrong = run_cli("partitions", "set", "0", env=env)
    assert wrong.returncode == 2
    assert "from 1 to 256" in wrong.stderr
    nc = await connect(nats_url)
    # A replica started with another --partitions keeps the map, and says so.
    with caplog.at_level(logging.WARNING, logger="interlock.provision"):
        await provision(nc, subjects, partitions=5)
    assert "5 partitions asked" in caplog.text
    assert "this one keeps its 3" in caplog.text
    after, _ = await read_map(nc, subjects)
    await nc.close()
    assert [x.count for x in after.layouts] == [1, 3]


class _Appends(OrchestratorObserver):
    """The answers one orchestrator appended, by run."""

    def __init__(self) -> None:
        self.answered: list[str] = []

    def appended(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        if any(isinstance(r, ev.ActionCompleted) for r in records):
            self.answered.append(run_id)


async def test_two_replicas_each_decide_the_answers_of_the_partitions_they_hold(
    nats_url: str, subjects: Subjects
) -> None:
    first, second = _Appends(), _Appends()
    async with running_stack(
        nats_url, subjects, [TWO_ECHOES], partitions=4, observers=[first]
    ) as stack:
        other = Orchestrator(await connect(nats_url), subjects, observers=[second])
        await other.start()
        try:
            mine, theirs = stack.orchestrator.relay.ownership, other.relay.ownership
            for _ in range(120):  # two rounds or three: each holds two of the four
                if len(mine.held) == len(theirs.held) == 2:
                    break
                await asyncio.sleep(0.25)
            assert set(mine.held) | set(theirs.held) == set(range(4))
            # Each replica says how many it relays.
            registry = CollectorRegistry()
            OrchestratorInstrumentation(other, port=None, registry=registry)
            assert registry.get_sample_value("interlock_partitions_held") == 2
            moves = registry.get_sample_value("interlock_partition_moves_total")
            assert moves is not None
            assert moves >= 2
            runs = [await stack.client.start("two-steps", {}) for _ in range(24)]
            for run_id in runs:
                state = await stack.wait(run_id)
                assert state.outputs == {"step": 2}
                completed = [
                    r for r in await stack.records(run_id) if isinstance(r, ev.ActionCompleted)
                ]
                assert len(completed) == 2
            # Each answer was taken by request by the replica holding the run's partition,
            # none went the slow way round (the results stream).
            for run_id in runs:
                owner = first if partition_of(run_id, 4) in mine.held else second
                assert owner.answered.count(run_id) == 2, run_id
            results = await stack.js.stream_info(subjects.results_stream)
            assert results.state.messages == 0
        finally:
            await other.stop()
            await other.nc.close()


WAITER_V2 = WAITER.replace("outputs: {ok: true}", "outputs: {ok: true, v: 2}")


async def test_forks_and_migrations_reach_runs_in_every_partition(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [WAITER], partitions=3) as stack:
        client = interlock.Client(await connect(nats_url), subjects, owns_connection=True)
        try:
            # Nine runs, then more until each partition has one (random ids: nine land in
            # two of three partitions about one time in thirteen).
            runs = [await stack.client.start("waiter", {}) for _ in range(9)]
            while len({partition_of(r, 3) for r in runs}) < 3:
                runs.append(await stack.client.start("waiter", {}))
            (applied,) = [
                a for a in await client.apply([("v2.yaml", WAITER_V2)]) if a.kind == "Workflow"
            ]
            moved = await client.migrate("waiter", applied.version)
            assert sorted(m["run_id"] for m in moved["moved"]) == sorted(runs), moved
            # A fork of each run goes to the partition its own id hashes to.
            forks = []
            for i, run_id in enumerate(runs[:3]):
                fork = await client.fork(run_id, 2, fork_id=f"fork-of-{i}")
                assert (await stack.client.log.where(fork))[0] == subjects.runs_stream_of(
                    partition_of(fork, 3)
                )
                forks.append(fork)
            for i, run_id in enumerate(runs + forks):
                event = CloudEvent(
                    id=f"go-{i}",
                    source="test://migrate",
                    type="go",
                    time=utc_now(),
                    extensions={"runid": run_id},
                )
                await stack.client.emit(event)
            for run_id in runs:
                assert (await stack.wait(run_id)).outputs == {"ok": True, "v": 2}
            for run_id in forks:
                assert (await stack.wait(run_id)).status == "completed"
        finally:
            await client.close()
