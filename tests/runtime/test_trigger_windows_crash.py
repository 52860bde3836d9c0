"""Debounced, batched and rate-limited triggers under crashes and replicas, on a real
nats-server: an ``interlock serve`` killed with SIGKILL in the middle of a window loses no
event and starts no run twice; two orchestrators taking one key's events at once cut a
batch exactly, and never give one start of a rate twice."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

from interlock.client.queues import list_queues
from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.client import InterlockClient
from interlock.runtime.service import Orchestrator
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.runtime import (
    STARTUP_TIMEOUT,
    TIMEOUT,
    cli_env,
    connect,
    eventually,
    interlock_bg,
    run_cli,
)


def workflow(name: str, trigger: str) -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: {name}}}
spec:
  triggers:
    - event: com.example.{name}
      {trigger}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {{event: go, goto: done}}
    done:
      type: terminal
"""


async def emit(client: InterlockClient, kind: str, ids: list[str], key: str = "k") -> None:
    for event_id in ids:
        await client.emit(
            CloudEvent(id=event_id, source="/s", type=f"com.example.{kind}", data={"key": key})
        )


async def windows_of(client: InterlockClient, workflow: str) -> list[ev.TriggerWindow]:
    """The window of each run of ``workflow`` started so far."""
    out = []
    for row in await client.list_runs():
        if row["workflow"] != workflow:
            continue
        records, _ = await client.runs.log.read(row["run_id"])
        first = records[0]
        assert isinstance(first, ev.RunStarted)
        assert first.data.window is not None
        out.append(first.data.window)
    return out


async def held(client: InterlockClient, limit: str, count: int) -> bool:
    return any(q.limit == limit and q.queued == count for q in await list_queues(client))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def test_sigkill_mid_window_loses_no_event_and_starts_no_run_twice(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    env = cli_env(nats_url, subjects.prefix)
    manifest = tmp_path / "flows.yaml"
    manifest.write_text(
        workflow("pushed", "debounce: {key: data.key, period: 6s, max_wait: 60s}")
        + "---\n"
        + workflow("rows", "batch: {key: data.key, max_events: 100, max_wait: 3s}")
    )
    assert run_cli("apply", str(manifest), env=env).returncode == 0
    nc = await connect(nats_url)
    client = InterlockClient(nc, subjects)
    serve = interlock_bg("serve", "--metrics-port", "0", env=env)
    later = None
    try:
        serve.wait_for("orchestrator started", STARTUP_TIMEOUT)
        first = [f"p{n}" for n in range(10)]
        rows = [f"r{n}" for n in range(10)]
        await emit(client, "pushed", first)
        await emit(client, "rows", rows)
        await eventually(
            lambda: held(client, "default/pushed#trigger1@debounce", 10), what="10 pushes held"
        )
        await eventually(
            lambda: held(client, "default/rows#trigger1@batch", 10), what="10 rows held"
        )
        serve.kill()  # SIGKILL: no goodbye, mid-period
        second = [f"p{n}" for n in range(10, 20)]
        more_rows = [f"r{n}" for n in range(10, 20)]
        await emit(client, "pushed", second)
        await emit(client, "rows", more_rows)
        port = free_port()
        later = interlock_bg("serve", "--metrics-port", str(port), env=env)
        later.wait_for("orchestrator started", STARTUP_TIMEOUT)

        async def settled() -> list[ev.TriggerWindow] | None:
            pushed = await windows_of(client, "pushed")
            batched = await windows_of(client, "rows")
            taken = sorted(e for w in batched for e in w.events)
            return [*pushed, *batched] if pushed and len(taken) == 20 else None

        await eventually(settled, within=TIMEOUT, what="both windows' runs")
        await asyncio.sleep(1)  # the time another run would need to appear: none does
        [pushed] = await windows_of(client, "pushed")
        assert pushed.events == first + second
        assert pushed.closed_by == "period"
        batched = await windows_of(client, "rows")
        taken = [e for w in batched for e in w.events]
        assert sorted(taken) == sorted(rows + more_rows)  # each once, none lost
        assert len(taken) == len(set(taken))
        assert await list_queues(client) == []
        scraped = metrics(port)
        assert 'interlock_trigger_window_events_total{kind="debounce"}' in scraped
        assert 'key="' not in scraped  # no key is a label
    finally:
        if later is not None:
            assert later.stop() == 0, later.output
        serve.stop()
        await nc.close()


async def test_two_orchestrators_cut_one_keys_batches_exactly(
    nats_url: str, subjects: Subjects
) -> None:
    ncs = [await connect(nats_url) for _ in range(3)]
    replicas = [Orchestrator(nc, subjects) for nc in ncs[:2]]
    for replica in replicas:
        await replica.start()
    client = InterlockClient(ncs[2], subjects)
    try:
        await client.apply(
            [
                (
                    "rows.yaml",
                    workflow("rows", "batch: {key: data.key, max_events: 10, max_wait: 1h}"),
                )
            ]
        )
        sent = [f"e{n}" for n in range(40)]
        await emit(client, "rows", sent)

        async def four() -> list[ev.TriggerWindow] | None:
            found = await windows_of(client, "rows")
            return found if len(found) == 4 else None

        batches = await eventually(four, within=TIMEOUT, what="four batches")
        assert [w.count for w in batches] == [10] * 4
        taken = [e for w in batches for e in w.events]
        assert sorted(taken) == sorted(sent)
        assert {w.closed_by for w in batches} == {"max_events"}
    finally:
        for replica in replicas:
            await replica.stop()
        for nc in ncs:
            await nc.close()


async def test_two_orchestrators_never_give_a_rates_start_twice(
    nats_url: str, subjects: Subjects
) -> None:
    ncs = [await connect(nats_url) for _ in range(3)]
    replicas = [Orchestrator(nc, subjects) for nc in ncs[:2]]
    for replica in replicas:
        await replica.start()
    client = InterlockClient(ncs[2], subjects)
    try:
        await client.apply([("calls.yaml", workflow("calls", "rate: {limit: 5, per: 1h}"))])
        await emit(client, "calls", [f"c{n}" for n in range(12)])

        async def all_started() -> list[list[ev.AnyRecord]] | None:
            runs = await client.list_runs()
            if len(runs) < 12:
                return None
            return [(await client.runs.log.read(r["run_id"]))[0] for r in runs]

        logs = await eventually(all_started, within=TIMEOUT, what="twelve runs")
        entered = [log for log in logs if any(isinstance(r, ev.StateEntered) for r in log)]
        holds = [
            r.data.rate for log in logs for r in log if isinstance(r, ev.RunQueued) and r.data.rate
        ]
        assert len(entered) == 5  # the hour's five
        assert len(holds) == 7
        # No hour holds more than five starts: the sixth waiting run is an hour after the first.
        untils = sorted(parse_time(h.until) for h in holds)
        assert (untils[5] - untils[0]).total_seconds() >= 3600
    finally:
        for replica in replicas:
            await replica.stop()
        for nc in ncs:
            await nc.close()
