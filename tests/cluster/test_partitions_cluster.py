"""Partitioned run logs on a real three-node JetStream cluster, with three orchestrators.

Six partitions (R3 streams) whose leaders are spread over the nodes, three ``interlock
serve`` processes each relaying its share, and one echo agent. While runs go on, one
orchestrator is killed (SIGKILL) and started again, the partition count is raised from
six to nine, and one NATS node is killed and started again: every acknowledged trigger
event must give exactly one completed run, each log written as by one writer.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from test_cluster import (  # the three-node cluster and its helpers
    AGENT,
    CHAIN,
    REPO,
    Cluster,
    Proc,
    check_log,
    cluster,
    connect,
    free_ports,
    http_get,
    jetstream_ready,
    publish_acked,
    settle,
    spawn,
    until,
)

from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.ownership import owners
from interlock.runtime.partitioning import partitions, set_partitions
from interlock.runtime.taskqueue import TaskQueue
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.partitions import partition_of, read_map
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

__all__ = ["cluster"]

RUNS = int(os.environ.get("INTERLOCK_PARTITION_RUNS", "300"))
SERVE = [sys.executable, "-m", "interlock", "serve", "--replicas", "3", "--ack-wait", "4"]

# A three-node cluster and three orchestrators: run alone, after the others (`serial`).
pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]


def _serve(name: str, tmp_path: Path, env: dict[str, str], port: int) -> Proc:
    argv = [*SERVE, "--log-level", "warning", "--metrics-port", str(port)]
    return spawn(name, argv, tmp_path, env)


async def _ready(proc: Proc, port: int) -> None:
    async def ready() -> bool:
        assert proc.popen.poll() is None, proc.tail()
        status, _ = await http_get(port, "/readyz")
        return bool(status == 200)

    await until(ready, f"{proc.name} ready", within=30)


async def _requests_taken_already_are_passed_over(js: JetStreamContext, subjects: Subjects) -> None:
    """Taking timed-out or cancelled requests out of the task queue goes on past one an
    agent took already: a replicated stream's leader refuses its delete otherwise than one
    server does ("no message found" as a 500, "sequence N not found")."""
    subject, stream = subjects.capability("nobody"), subjects.tasks_stream
    gone, kept = [
        (await js.publish(subject, b"{}", headers={"Nats-Msg-Id": f"{a}.1"})).seq
        for a in ("gone", "kept")
    ]
    await js.delete_msg(stream, gone)
    queue = TaskQueue(js, subjects)
    queue.dispatched("gone", 1, gone)
    queue.dispatched("kept", 1, kept)
    assert await queue.remove("nobody", {"gone": 1, "kept": 1}, exact=True) == 1
    with pytest.raises(NotFoundError):
        await js.get_msg(stream, kept)


async def test_partitions_spread_move_and_grow_while_nodes_and_replicas_die(
    cluster: Cluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    subjects = Subjects(prefix="ilp")
    await jetstream_ready(cluster.urls)
    nc = await connect(cluster.urls)
    procs: list[Proc] = []
    try:
        js = nc.jetstream()
        await provision(js, subjects, replicas=3, partitions=6)
        client = InterlockClient(nc, subjects)
        agent_def = (REPO / "agents/interlock_agents/manifests/echo.yaml").read_text()
        applied = await client.apply([("echo", agent_def), ("chain", CHAIN)])
        assert applied.compiled.ok, [str(d) for d in applied.compiled.diagnostics]
        definition, _ = await client.registry.latest("chain")

        async def spread() -> bool:
            _, infos = await partitions(nc, subjects)
            return len({i.leader for i in infos if i.leader}) >= 2

        await until(spread, "partition leaders on two nodes or more", within=30)

        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INTERLOCK_"))}
        env["INTERLOCK_URL"] = ",".join(cluster.urls)
        env["INTERLOCK_PREFIX"] = subjects.prefix
        ports = free_ports(4)
        procs = [_serve(f"orchestrator-{i + 1}", tmp_path, env, ports[i]) for i in range(3)]
        procs.append(spawn("agent-echo", [*AGENT, "--metrics-port", str(ports[3])], tmp_path, env))
        for proc, port in zip(procs, ports, strict=True):
            await _ready(proc, port)

        async def owned(count: int, replicas: int) -> bool:
            held = await owners(nc, subjects)
            return len(held) == count and len(set(held.values())) == replicas

        await until(lambda: owned(6, 3), "every partition owned, by all three", within=30)
        ready_at = time.monotonic()

        events = [
            CloudEvent(id=f"e{i}", source="/load", type="com.example.chain", data={"n": i})
            for i in range(RUNS)
        ]
        victim_node = cluster.nodes[2]
        moved_in = 0.0
        for i, event in enumerate(events):
            if i == RUNS // 6:
                procs[0].popen.kill()  # an orchestrator dies (SIGKILL)
                procs[0].popen.wait(5)
                killed_at = time.monotonic()
            if i == RUNS // 3:
                await until(lambda: owned(6, 2), "the dead replica's partitions moved", 20)
                moved_in = time.monotonic() - killed_at
                procs[0] = _serve("orchestrator-1b", tmp_path, env, ports[0])
            if i == RUNS // 2:
                raised, changed = await set_partitions(nc, subjects, 9)
                assert changed
                assert [x.count for x in raised.layouts] == [6, 9]
            if i == 2 * RUNS // 3:
                victim_node.popen.kill()  # a NATS node dies (SIGKILL)
                victim_node.popen.wait(5)
            if i == 5 * RUNS // 6:
                cluster.nodes[2] = victim_node = spawn(
                    victim_node.name,
                    list(victim_node.popen.args),
                    tmp_path,
                    {**os.environ, "NATS_SERVER_NAME": victim_node.name},
                )
            await publish_acked(nc, subjects, event)
        run_ids = [derive_run_id(definition, "/load", e.id) for e in events]
        await settle(js, subjects, procs, run_ids, f"{RUNS} runs completed")
        loaded_at = time.monotonic()

        found, _ = await read_map(nc, subjects)
        assert found.streams == 9
        # A read asked of a partition's leader rides over that leader handing over (the
        # request that reaches it as it steps down gets no answer): a replica's start
        # asks leaders to spread over the nodes, and the stream of a run is read at once.
        stream, _ = await client.log.where(run_ids[0])
        stepdown = await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=5)
        assert b'"success":true' in stepdown.data, stepdown.data
        records, _ = await client.log.read(run_ids[0], consistent=True)
        check_log(records)
        await _requests_taken_already_are_passed_over(js, subjects)
        late = 0
        for run_id in run_ids:
            where = await client.log.where(run_id)
            # Each run is in its partition under the layout it started with.
            assert where[0] in {
                subjects.runs_stream_of(partition_of(run_id, 6)),
                subjects.runs_stream_of(partition_of(run_id, 9)),
            }
            late += partition_of(run_id, 9) >= 6 and where[0] == subjects.runs_stream_of(
                partition_of(run_id, 9)
            )
            records, _ = await client.log.read(run_id, consistent=True)
            check_log(records)
            assert records[-1].data.outputs == {"n": int(records[0].data.inputs["n"])}  # type: ignore[union-attr]
        assert late > 0  # some runs started after the resize went to the new partitions
        try:
            await until(lambda: owned(9, 3), "nine partitions owned by the three replicas", 30)
        except AssertionError:
            print("owners:", await owners(nc, subjects))
            for proc in procs:
                print(proc.tail(20))
            raise
        _, infos = await partitions(nc, subjects)
        leaders = Counter(i.leader for i in infos)
        logs = "".join(p.tail(10_000) for p in procs)
        print(
            f"\npartitioned cluster: ready in {ready_at - started:.1f}s, {RUNS} runs in "
            f"{loaded_at - ready_at:.1f}s across a replica kill (its partitions moved in "
            f"{moved_in:.1f}s), a resize 6 -> 9 and a node kill; total "
            f"{time.monotonic() - started:.1f}s; leaders {dict(leaders)}; replicas found gone "
            f"{logs.count('is gone (no subscription)')}, lease renewals refused "
            f"{logs.count('lease was taken by another')}"
        )
    finally:
        for proc in procs:
            proc.stop()
        await nc.close()
