"""A real three-node NATS JetStream cluster, R3 streams, two orchestrator processes.

The cluster comes from deploy/nats/cluster.conf (ports and the store directory rewritten
to free local ones). Two ``interlock serve --replicas 3`` processes and one echo agent
process run workflows while one NATS node is killed (SIGKILL); every acknowledged trigger
event must give exactly one completed run. Then pairs of competing events race the two
orchestrators on the same runs: the optimistic append lets exactly one transition leave
each state visit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import KeyNotFoundError
from prometheus_client.parser import text_string_to_metric_families

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.state import fold
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import nats_server_binary
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

REPO = Path(__file__).resolve().parents[2]
CLUSTER_CONF = REPO / "deploy" / "nats" / "cluster.conf"
RUNS = 100
RACES = 30
WAIT = 30.0
SERVE = [sys.executable, "-m", "interlock", "serve", "--replicas", "3", "--log-level", "warning"]
AGENT = [sys.executable, "-m", "interlock", "agent", "run", "echo", "--concurrency", "32"]

# Three nats-servers and two orchestrators on 127.0.0.1: run alone, after the others
# (`serial`), not beside another module's processes on a 2-core machine.
pytestmark = [pytest.mark.timeout(150), pytest.mark.serial]

CHAIN = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: chain
    spec:
      inputs:
        n: {type: integer, required: true}
      triggers:
        - event: com.example.chain
      initial_state: one
      states:
        one:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 1}
          on:
            - {event: task.completed, goto: two}
        two:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 2}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            n: "$.states.two.output.n"
    """
)

GATE = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: gate
    spec:
      initial_state: closed
      states:
        closed:
          type: human_in_the_loop
          on:
            - event: gate.open
              goto: open
              set:
                by: "{{ data.by }}"
        open:
          type: terminal
          outputs:
            by: "{{ context.by }}"
    """
)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def node_config(template: str, index: int, client: int, routes: list[int], store: Path) -> str:
    """deploy's node configuration with local ports and a temporary store directory."""
    replacements = {
        "listen: 0.0.0.0:4222": f"listen: 127.0.0.1:{client}",
        "http: 0.0.0.0:8222": "",
        "listen: 0.0.0.0:6222": f"listen: 127.0.0.1:{routes[index]}",
        "store_dir: /data/jetstream": f'store_dir: "{store}"',
        "max_file_store: 20GB": "max_file_store: 1GB",
    }
    replacements.update(
        {f"nats://nats-{i + 1}:6222": f"nats://127.0.0.1:{port}" for i, port in enumerate(routes)}
    )
    text = template
    for old, new in replacements.items():
        assert old in text, f"{CLUSTER_CONF} no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    return text


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 30) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.name} ---\n" + "\n".join(lines[-n:])


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> Proc:
    log = log_dir / f"{name}.log"
    handle = log.open("wb")
    popen = subprocess.Popen(
        argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    handle.close()
    return Proc(name, popen, log)


@dataclass
class Cluster:
    nodes: list[Proc]
    urls: list[str]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    template = CLUSTER_CONF.read_text()
    ports = free_ports(6)
    clients, routes = ports[:3], ports[3:]
    binary = nats_server_binary()
    nodes = []
    try:
        for i in range(3):
            conf = tmp_path / f"nats-{i + 1}.conf"
            conf.write_text(node_config(template, i, clients[i], routes, tmp_path / f"js-{i + 1}"))
            env = {**os.environ, "NATS_SERVER_NAME": f"nats-{i + 1}"}
            nodes.append(spawn(f"nats-{i + 1}", [binary, "-c", str(conf)], tmp_path, env))
        yield Cluster(nodes, [f"nats://127.0.0.1:{p}" for p in clients])
    finally:
        for node in nodes:
            node.stop(5)


async def connect(urls: list[str]) -> Client:
    return await nats.connect(
        servers=urls,
        connect_timeout=2,
        reconnect_time_wait=0.2,
        max_reconnect_attempts=-1,
        allow_reconnect=True,
    )


async def until(probe: Any, what: str, within: float = WAIT, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = await probe()
            if value:
                return value
        # A probe during chaos: record and go on.
        except Exception as exc:  # noqa: BLE001
            last = exc
        await asyncio.sleep(interval)
    raise AssertionError(f"not reached in {within}s: {what} (last error: {last})")


async def jetstream_ready(urls: list[str]) -> None:
    """Every node answers and the cluster has a JetStream meta leader."""

    async def ready() -> bool:
        for url in urls:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0)
            try:
                await nc.jetstream().account_info()
            finally:
                await nc.close()
        return True

    await until(ready, "JetStream cluster ready", within=30)


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def metric_sum(ports: list[int], sample: str, **labels: str) -> float:
    """The sum over processes of a sample's values whose labels include ``labels``."""
    total = 0.0
    for port in ports:
        _, text = await http_get(port, "/metrics")
        for family in text_string_to_metric_families(text):
            total += sum(
                s.value
                for s in family.samples
                if s.name == sample and labels.items() <= s.labels.items()
            )
    return total


@contextlib.asynccontextmanager
async def processes(
    cluster: Cluster, subjects: Subjects, tmp_path: Path, orchestrators: int
) -> AsyncIterator[tuple[list[Proc], list[int]]]:
    """Orchestrators and one echo agent, as operators run them; their metrics ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INTERLOCK_"))}
    env["INTERLOCK_URL"] = ",".join(cluster.urls)
    env["INTERLOCK_PREFIX"] = subjects.prefix
    ports = free_ports(orchestrators + 1)
    procs = [
        spawn(
            f"orchestrator-{i + 1}",
            [*SERVE, "--metrics-port", str(ports[i])],
            tmp_path,
            env,
        )
        for i in range(orchestrators)
    ]
    procs.append(
        spawn(
            "agent-echo",
            [*AGENT, "--metrics-port", str(ports[-1])],
            tmp_path,
            env,
        )
    )
    try:
        for proc, port in zip(procs, ports, strict=True):

            async def ready(proc: Proc = proc, port: int = port) -> bool:
                assert proc.popen.poll() is None, proc.tail()
                status, _ = await http_get(port, "/readyz")
                return status == 200

            await until(ready, f"{proc.name} ready", within=30)
        yield procs, ports
    except BaseException:
        for proc in procs:
            print(proc.tail())
        raise
    finally:
        for proc in procs:
            proc.stop()


async def pulling(js: Any, subjects: Subjects, orchestrators: int) -> bool:
    """Each orchestrator's consumers and the agent's have pull requests waiting.

    "Ready" only says connected with the streams present; the consumers are bound just
    after. The node is killed once the whole pipeline runs.
    """
    wanted = {
        (subjects.events_stream, "ingress"): orchestrators,
        (subjects.results_stream, "results"): orchestrators,
        (subjects.runs_stream, "relay"): orchestrators,
        (subjects.tasks_stream, "cap_echo"): 1,
    }
    for (stream, durable), waiting in wanted.items():
        info = await js.consumer_info(stream, durable)
        if (info.num_waiting or 0) < waiting:
            return False
    return True


async def publish_acked(nc: Client, subjects: Subjects, event: CloudEvent) -> None:
    """Publish until JetStream acknowledges (the same Nats-Msg-Id dedupes retries)."""
    headers, payload = encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    js = nc.jetstream(timeout=2)

    async def attempt() -> bool:
        await js.publish(subjects.event(event.type), payload, headers=headers)
        return True

    await until(attempt, f"ack of {event.id}", within=30, interval=0.2)


async def dead_letters(js: Any, subjects: Subjects) -> list[dict[str, str]]:
    """The headers of every message on the dead-letter stream."""
    sub = await js.subscribe(subjects.dead_letters_all, ordered_consumer=True)
    found: list[dict[str, str]] = []
    with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
        while True:
            msg = await sub.next_msg(timeout=1.0)
            found.append(dict(msg.headers or {}))
            if msg.metadata.num_pending == 0:
                break
    await sub.unsubscribe()
    return found


async def completed(js: Any, subjects: Subjects, run_ids: list[str]) -> int:
    """How many of the runs the run index says completed."""
    index = await js.key_value(subjects.runs_bucket)
    done = 0
    for run_id in run_ids:
        with contextlib.suppress(KeyNotFoundError):  # not started yet
            entry = await index.get(run_id)
            done += b'"completed"' in (entry.value or b"")
    return done


async def settle(
    js: Any, subjects: Subjects, procs: list[Proc], run_ids: list[str], what: str
) -> None:
    """Wait until every run completed, as long as runs keep completing: it fails once none
    has for ``WAIT`` seconds (a fixed deadline for all of them, chosen on a quiet machine,
    is too tight on a loaded one while the work still moves); then it prints where things
    stand (the runs, the processes' last lines, the dead letters).

    A failover is no excuse: a message whose handling fails while a stream has no leader is
    retried for about two minutes before it is dead-lettered, far longer than a leader
    election (4-7 s), so a message dead-lettered during the test is a failure like any other.
    """
    best = -1
    deadline = time.monotonic() + WAIT
    last: Exception | None = None
    try:
        while True:
            try:
                done = await completed(js, subjects, run_ids)
            # A probe during chaos: record and go on.
            except Exception as exc:  # noqa: BLE001
                last, done = exc, best
            if done == len(run_ids):
                return
            if done > best:
                best, deadline = done, time.monotonic() + WAIT
            if time.monotonic() > deadline:
                raise AssertionError(  # noqa: TRY301
                    f"{what}: {best} of {len(run_ids)} after none completed for {WAIT}s "
                    f"(last error: {last})"
                )
            await asyncio.sleep(0.25)
    except AssertionError:
        print(await diagnose(js, subjects, run_ids))
        for proc in procs:
            print(proc.tail(15))
        for headers in await dead_letters(js, subjects):
            print("dead letter:", headers.get("Interlock-Dead-Letter-Detail", headers))
        raise


async def read_log(js: Any, subjects: Subjects, run_id: str) -> list[ev.AnyRecord]:
    """A run's log from the stream leader (a direct get may be answered by a replica
    that has not caught up yet). Asked again while the cluster elects a leader after the
    node loss (each request times out after 5 s; an election takes 4 to 7, more on a
    loaded machine), for at most ``LEADER_WAIT`` seconds."""
    deadline = time.monotonic() + LEADER_WAIT
    while True:
        try:
            return await _read_log_once(js, subjects, run_id)
        except NatsTimeoutError:
            if time.monotonic() > deadline:
                raise


LEADER_WAIT = 30.0


async def _read_log_once(js: Any, subjects: Subjects, run_id: str) -> list[ev.AnyRecord]:
    sub = await js.subscribe(subjects.run(run_id), ordered_consumer=True)
    records: list[ev.AnyRecord] = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5.0)
            records += ev.decode_batch(msg.data)
            if msg.metadata.num_pending == 0:
                return records
    finally:
        await sub.unsubscribe()


async def diagnose(js: Any, subjects: Subjects, run_ids: list[str]) -> str:
    """Where the work stands: consumers, and runs by status (printed when a wait fails)."""
    lines = []
    for stream in (
        subjects.events_stream,
        subjects.results_stream,
        subjects.runs_stream,
        subjects.tasks_stream,
    ):
        for info in await js.consumers_info(stream):
            lines.append(
                f"{stream}/{info.name}: pending {info.num_pending} ack-pending "
                f"{info.num_ack_pending} redelivered {info.num_redelivered} "
                f"waiting {info.num_waiting}"
            )
        state = (await js.stream_info(stream)).state
        lines.append(f"{stream}: {state.messages} messages")
    letters: Counter[str] = Counter(
        f"{h.get('Interlock-Dead-Letter-Subject', '')[:24]}: "
        f"{h.get('Interlock-Dead-Letter-Detail', '')[:90]}"
        for h in await dead_letters(js, subjects)
    )
    lines += [f"dead letter {n} x {s}" for s, n in letters.most_common(10)]
    index = await js.key_value(subjects.runs_bucket)
    statuses: Counter[str] = Counter()
    for run_id in run_ids:
        try:
            entry = json.loads((await index.get(run_id)).value or b"{}")
            statuses[f"{entry.get('status')} in {entry.get('state')}"] += 1
        # A probe during chaos: record and go on.
        except Exception as exc:  # noqa: BLE001
            statuses[type(exc).__name__] += 1
    lines += [f"{n} x {s}" for s, n in statuses.most_common(8)]
    return "\n".join(lines)


def visits(records: list[ev.AnyRecord]) -> Counter[tuple[int, str]]:
    """transition.fired records per state visit (the seq of its state.entered record)."""
    out: Counter[tuple[int, str]] = Counter()
    current = (0, "")
    for record in records:
        if isinstance(record, ev.StateEntered):
            current = (int(record.id.rsplit(":", 1)[1]), record.data.state)
        elif isinstance(record, ev.TransitionFired):
            assert record.data.from_state == current[1]
            out[current] += 1
    return out


def check_log(records: list[ev.AnyRecord]) -> None:
    """One writer's history: positions 1..n, one transition per visit, one completion."""
    seqs = [int(r.id.rsplit(":", 1)[1]) for r in records]
    assert seqs == list(range(1, len(records) + 1)), seqs
    assert all(count == 1 for count in visits(records).values()), visits(records)
    # Each attempt of an action is requested once (a timeout during the failover may add
    # an attempt), and answered at most once.
    requested = Counter(
        (r.data.action_id, r.data.attempt) for r in records if isinstance(r, ev.ActionRequested)
    )
    assert all(count == 1 for count in requested.values()), requested
    answered = Counter(r.data.action_id for r in records if isinstance(r, ev.ActionCompleted))
    assert all(count == 1 for count in answered.values()), answered
    kinds = Counter(ev.record_type(r) for r in records)
    assert kinds[ev.PREFIX + "run.completed"] == 1, kinds
    assert not kinds[ev.PREFIX + "run.failed"], records[-1]


@pytest.mark.parametrize("orchestrators", [1, 2])
async def test_cluster_survives_a_node_loss_and_replicas_never_double_apply(
    cluster: Cluster, tmp_path: Path, orchestrators: int
) -> None:
    started = time.monotonic()
    subjects = Subjects(prefix="ilc")
    await jetstream_ready(cluster.urls)
    nc = await connect(cluster.urls)
    try:
        js = nc.jetstream()
        await provision(js, subjects, replicas=3)
        info = await js.stream_info(subjects.runs_stream)
        assert info.config.num_replicas == 3
        client = InterlockClient(nc, subjects)
        agent_def = (REPO / "agents/interlock_agents/manifests/echo.yaml").read_text()
        applied = await client.apply([("echo", agent_def), ("chain", CHAIN), ("gate", GATE)])
        assert applied.compiled.ok, [str(d) for d in applied.compiled.diagnostics]
        definition, _ = await client.registry.latest("chain")

        async with processes(cluster, subjects, tmp_path, orchestrators) as (procs, ports):
            await until(
                lambda: pulling(js, subjects, orchestrators), "every consumer pulling", within=20
            )
            ready_at = time.monotonic()
            # -- runs while a node dies ------------------------------------------------
            victim = cluster.nodes[1]
            events = [
                CloudEvent(id=f"e{i}", source="/load", type="com.example.chain", data={"n": i})
                for i in range(RUNS)
            ]
            for i, event in enumerate(events):
                if i == RUNS // 3:
                    victim.kill()  # SIGKILL: no goodbye to the cluster
                await publish_acked(nc, subjects, event)
            run_ids = [derive_run_id(definition, "/load", e.id) for e in events]
            await settle(js, subjects, procs, run_ids, f"{RUNS} runs completed")
            loaded_at = time.monotonic()
            for run_id in run_ids:
                records = await read_log(js, subjects, run_id)
                check_log(records)
                assert records[-1].data.outputs == {"n": int(records[0].data.inputs["n"])}  # type: ignore[union-attr]

            # -- two orchestrators, the same runs, competing events --------------------
            gates = [await client.start("gate", {}) for _ in range(RACES)]
            opener = nc.jetstream(timeout=5)
            sends = []
            for run_id in gates:
                for who in ("alice", "bob"):  # two events, both able to open the gate
                    event = CloudEvent(
                        id=f"{run_id}-{who}",
                        source="/people",
                        type="gate.open",
                        data={"by": who},
                        extensions={"runid": run_id},
                    )
                    headers, payload = encode_binary(event)
                    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
                    sends.append(
                        opener.publish(
                            subjects.addressed(run_id, "gate.open"), payload, headers=headers
                        )
                    )
            await asyncio.gather(*sends)
            await settle(js, subjects, procs, gates, f"{RACES} gates opened")
            for run_id in gates:
                records = await read_log(js, subjects, run_id)
                state = fold(records)
                assert state.status == "completed"
                check_log(records)
                opened = [r for r in records if isinstance(r, ev.TransitionFired)]
                assert len(opened) == 1
                assert state.outputs == {"by": opened[0].data.set["by"]}

            # Each run is counted once by the replica that relayed its end; a relay message
            # delivered again (an acknowledgement lost with the dead node) may count twice,
            # and never more often than the relay saw redeliveries.
            seen: list[tuple[float, float]] = []

            async def counted() -> bool:
                done = await metric_sum(ports[:-1], "interlock_runs_completed_total")
                again = await metric_sum(
                    ports[:-1], "interlock_redeliveries_total", consumer="relay"
                )
                seen.append((done, again))
                return RUNS + RACES <= done <= RUNS + RACES + again

            try:
                await until(counted, "both replicas' counters add up", within=10)
            except AssertionError as exc:
                if not seen:  # no scrape answered (each waits 5 s for a process's /metrics)
                    raise
                done, again = seen[-1]
                raise AssertionError(
                    f"{exc}: {done:g} counted, {RUNS + RACES} ran, {again:g} relay redeliveries"
                ) from exc
            dispatched = [
                await metric_sum([p], "interlock_actions_dispatched_total") for p in ports[:-1]
            ]
            conflicts = await metric_sum(ports[:-1], "interlock_append_conflicts_total")
            redeliveries = await metric_sum(ports[:-1], "interlock_redeliveries_total")
            assert sum(dispatched) >= 2 * RUNS
            print(
                f"\ncluster: ready in {ready_at - started:.1f}s, {RUNS} runs across a node loss "
                f"in {loaded_at - ready_at:.1f}s, total {time.monotonic() - started:.1f}s; "
                f"dispatches per replica {dispatched}, append conflicts {conflicts:g}, "
                f"redeliveries {redeliveries:g}"
            )
    finally:
        await nc.close()


async def test_provisioning_never_scales_streams_down(cluster: Cluster) -> None:
    await jetstream_ready(cluster.urls)
    subjects = Subjects(prefix=f"s{os.getpid()}")
    nc = await connect(cluster.urls)
    try:
        js = nc.jetstream()

        async def provisioned_r3() -> bool:
            await provision(js, subjects, replicas=3)
            return True

        await until(provisioned_r3, "R3 streams created", within=30)
        await provision(js, subjects)  # a process started without INTERLOCK_REPLICAS
        info = await js.stream_info(subjects.runs_stream)
        assert info.config.num_replicas == 3
    finally:
        await nc.close()
