"""``/metrics``, ``/healthz`` and ``/readyz`` of a running orchestrator, and its metrics."""

from __future__ import annotations

import json
from typing import Any

from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.metrics import OrchestratorMetrics, RunTracker
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.health import HealthServer, nats_readiness
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import heartbeat_key
from support.observability import (
    TIMEOUT,
    answer,
    connect,
    http_get,
    http_request,
    instrumented_stack,
    plain_agent,
)

ORCHESTRATOR_FAMILIES = {
    "interlock_runs_started": "counter",
    "interlock_runs_completed": "counter",
    "interlock_runs_failed": "counter",
    "interlock_runs_cancelled": "counter",
    "interlock_run_duration_seconds": "histogram",
    "interlock_states_entered": "counter",
    "interlock_transitions": "counter",
    "interlock_guard_failures": "counter",
    "interlock_actions_requested": "counter",
    "interlock_actions_dispatched": "counter",
    "interlock_action_duration_seconds": "histogram",
    "interlock_dead_letters": "counter",
    "interlock_redeliveries": "counter",
    "interlock_append_conflicts": "counter",
    "interlock_events_unrouted": "counter",
    "interlock_consumer_lag_messages": "gauge",
    "interlock_consumer_ack_pending_messages": "gauge",
    "interlock_actions_in_flight": "gauge",
    "interlock_capability_workers": "gauge",
    "interlock_runs_active": "gauge",
    "interlock_runs_state_age_max_seconds": "gauge",
}


def samples(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset[Any]], float]]:
    """(family name -> type, (sample name, labels) -> value) of a Prometheus text page."""
    types: dict[str, str] = {}
    values: dict[tuple[str, frozenset[Any]], float] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return types, values


def value(values: dict[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_of_a_running_stack(nats_url: str, subjects: Subjects) -> None:
    answering = await connect(nats_url)

    async def handle(request: CloudEvent, msg: Msg) -> None:
        data: Any = request.data
        if data.get("score") == 0:
            await answer(answering, subjects, request, None, failed=True)
        else:
            await answer(answering, subjects, request, data)

    try:
        async with (
            instrumented_stack(nats_url, subjects, port=0) as stack,
            plain_agent(nats_url, subjects, "echo", handle),
        ):
            assert stack.telemetry.server is not None
            port = stack.telemetry.server.port
            js = stack.client.js
            # A live worker of echo, as its heartbeat says.
            workers = await js.key_value(subjects.workers_bucket)
            await workers.put(
                heartbeat_key("echo", "obs-1"), json.dumps({"capabilities": ["echo"]}).encode()
            )
            # One run started by a trigger (the orchestrator appends its first records), two
            # by a client.
            await stack.client.emit(
                CloudEvent(id="t1", source="/t", type="com.example.review", data={"score": 7})
            )
            definition, _ = await stack.client.registry.latest("review")
            done = [derive_run_id(definition, "/t", "t1")]
            done += [await stack.client.start("review", {"score": n}) for n in (3, 0)]
            stuck = await stack.client.start("stuck", {})
            for run_id in done:
                await stack.client.wait(run_id, TIMEOUT)
            # Not a CloudEvent: dead-lettered. A type no workflow takes: unrouted.
            await js.publish(subjects.event("garbage"), b"not json", headers={"x": "y"})
            await stack.client.emit(CloudEvent(id="u1", source="/t", type="com.example.nobody"))

            async def scraped() -> tuple[dict[str, str], dict[Any, float]]:
                status, body = await http_get(port, "/metrics")
                assert status == 200
                return samples(body)

            async def settled() -> Any:
                types, values = await scraped()
                # Every run of review relayed (the relay counts them after their logs are
                # written, the failed one possibly after the others), the rest seen.
                failed = {"workflow": "review", "error_class": "agent_error"}
                ready = (
                    value(values, "interlock_runs_completed_total", workflow="review") == 2
                    and value(values, "interlock_runs_failed_total", **failed) == 1
                    and sum(v for (n, _), v in values.items() if n.startswith("interlock_dead_"))
                    >= 1
                    and value(values, "interlock_events_unrouted_total") >= 1
                    and value(values, "interlock_actions_in_flight", capability="nobody") == 1
                    and value(values, "interlock_runs_active", workflow="stuck", state="wait") == 1
                )
                return (types, values) if ready else None

            types, values = await poll(settled)
            assert stuck
    finally:
        await answering.close()

    for name, kind in ORCHESTRATOR_FAMILIES.items():
        assert types.get(name) == kind, f"{name}: {types.get(name)}"
    # The relay counts every run, whoever started it (a trigger, or a client).
    assert value(values, "interlock_runs_started_total", workflow="review") == 3
    assert value(
        values, "interlock_runs_failed_total", workflow="review", error_class="agent_error"
    )
    assert value(values, "interlock_transitions_total", workflow="review") == 3
    assert value(values, "interlock_guard_failures_total", workflow="review", state="check") == 2
    assert value(values, "interlock_actions_dispatched_total", capability="echo") == 4
    assert value(values, "interlock_actions_dispatched_total", capability="nobody") == 1
    assert (
        value(
            values,
            "interlock_action_duration_seconds_count",
            capability="echo",
            outcome="completed",
        )
        == 3
    )
    assert (
        value(
            values, "interlock_action_duration_seconds_count", capability="echo", outcome="failed"
        )
        == 1
    )
    assert value(values, "interlock_run_duration_seconds_count", workflow="review", status="failed")
    assert value(values, "interlock_capability_workers", capability="echo") == 1
    assert value(values, "interlock_capability_workers", capability="nobody") == 0
    assert (
        value(
            values,
            "interlock_runs_state_age_max_seconds",
            workflow="stuck",
            state="wait",
            waits="work",
        )
        >= 0
    )
    lag = [k for k in values if k[0] == "interlock_consumer_lag_messages"]
    consumers = {dict(labels)["consumer"] for _, labels in lag}
    assert {"ingress", "results", "relay", "cap_echo"} <= consumers
    # No run id anywhere in a label.
    assert not any("run" in dict(labels) or "run_id" in dict(labels) for _, labels in values)


async def poll(probe: Any) -> Any:
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        got = await probe()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError("metrics did not settle")
        await asyncio.sleep(0.1)


async def test_health_endpoints(nats_url: str, subjects: Subjects) -> None:
    async with instrumented_stack(nats_url, subjects, port=0) as stack:
        assert stack.telemetry.server is not None
        port = stack.telemetry.server.port
        assert await http_get(port, "/healthz") == (200, "ok\n")
        assert await http_get(port, "/readyz") == (200, "ready\n")
        status, body = await http_get(port, "/nope")
        assert status == 404
        assert body == "not found: try /metrics, /healthz or /readyz\n"
        assert await http_request(port, "POST", "/metrics") == (405, "only GET\n")
    nc = await connect(nats_url)
    try:
        elsewhere = Subjects("neverprovisioned")
        async with HealthServer(
            0, ready=nats_readiness(nc, elsewhere), registry=CollectorRegistry()
        ) as server:
            status, body = await http_get(server.port, "/readyz")
            assert status == 503
            assert "missing streams or buckets" in body
            assert elsewhere.runs_stream in body
            assert (await http_get(server.port, "/healthz"))[0] == 200
    finally:
        await nc.close()
    async with HealthServer(
        0, ready=nats_readiness(nc, subjects), registry=CollectorRegistry()
    ) as server:
        assert await http_get(server.port, "/readyz") == (503, "not ready: not connected to NATS\n")


def record(cls: type[Any], run_id: str, seq: int, data: Any, time: str) -> Any:
    return cls(
        specversion="1.0",
        id=f"{run_id}:{seq}",
        source=ev.SOURCE,
        subject=run_id,
        time=time,
        datacontenttype="application/json",
        data=data,
    )


async def test_records_are_counted_with_their_workflow() -> None:
    """Counting needs the run's context: the terminal record names no workflow."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    tracker = RunTracker(None, [metrics])
    t0, t1, t2 = "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.500Z", "2026-01-01T00:00:04Z"
    started = record(ev.RunStarted, "r1", 1, ev.RunStartedData(workflow="wf", spec_hash="h"), t0)
    entered = record(ev.StateEntered, "r1", 2, ev.StateEnteredData(state="a"), t0)
    requested = record(
        ev.ActionRequested,
        "r1",
        3,
        ev.ActionRequestedData(action_id="r1:3", state="a", index=0, capability="c"),
        t0,
    )
    completed = record(
        ev.ActionCompleted,
        "r1",
        4,
        ev.ActionCompletedData(action_id="r1:3", state="a", index=0),
        t1,
    )
    finished = record(ev.RunCompleted, "r1", 5, ev.RunCompletedData(state="a"), t2)
    tracker.relayed("r1", [started, entered, requested])
    tracker.relayed("r1", [completed, finished])
    get = registry.get_sample_value
    assert get("interlock_runs_started_total", {"workflow": "wf"}) == 1
    assert get("interlock_runs_completed_total", {"workflow": "wf"}) == 1
    assert get("interlock_states_entered_total", {"workflow": "wf", "state": "a"}) == 1
    assert (
        get("interlock_action_duration_seconds_sum", {"capability": "c", "outcome": "completed"})
        == 1.5
    )
    assert (
        get("interlock_run_duration_seconds_sum", {"workflow": "wf", "status": "completed"}) == 4.0
    )
    assert tracker.view("r1") is None  # finished runs are not kept


async def test_a_dead_consumer_loop_fails_liveness(nats_url: str, subjects: Subjects) -> None:
    """A consumer loop that ended never comes back: the probe must ask for a restart."""
    import asyncio

    from interlock.runtime.health import consumers_alive
    from interlock.runtime.service import Orchestrator

    async def fails() -> None:
        raise RuntimeError("consumer could not be created")

    async def runs() -> None:
        await asyncio.sleep(3600)

    healthy, broken = asyncio.create_task(runs()), asyncio.create_task(fails())
    await asyncio.wait([broken])
    nc = await connect(nats_url)
    try:
        running, failed = Orchestrator(nc, subjects), Orchestrator(nc, subjects)
        running._tasks, failed._tasks = [healthy], [healthy, broken]  # as start() sets them
        ok = consumers_alive(running)
        dead = consumers_alive(failed)
        assert ok() is None
        assert "consumer could not be created" in (dead() or "")
        async with HealthServer(0, alive=dead, registry=CollectorRegistry()) as server:
            status, body = await http_get(server.port, "/healthz")
            assert status == 503
            assert "not alive: a consumer loop ended" in body
            assert (await http_get(server.port, "/readyz"))[0] == 503
            assert (await http_get(server.port, "/metrics"))[0] == 200
    finally:
        healthy.cancel()
        await nc.close()


def test_a_finished_run_read_again_by_the_relay_is_not_counted_twice() -> None:
    registry = CollectorRegistry()
    tracker = RunTracker(None, [OrchestratorMetrics(registry)])
    t0 = "2026-01-01T00:00:00.000Z"
    records = [
        record(ev.RunStarted, "r7", 1, ev.RunStartedData(workflow="wf", spec_hash="h"), t0),
        record(ev.StateEntered, "r7", 2, ev.StateEnteredData(state="done"), t0),
        record(ev.RunCompleted, "r7", 3, ev.RunCompletedData(state="done"), t0),
    ]
    tracker.relayed("r7", records)
    tracker.relayed("r7", records)  # read again after a failover
    get = registry.get_sample_value
    assert get("interlock_runs_started_total", {"workflow": "wf"}) == 1
    assert get("interlock_runs_completed_total", {"workflow": "wf"}) == 1


async def test_a_run_whose_log_cannot_be_read_is_still_counted(
    nats_url: str, subjects: Subjects
) -> None:
    """Catching up on a run another replica followed reads its log; when that read keeps
    failing (a failover that lasts), the run's end is reported without its history."""
    from interlock.runtime.logstore import RunLog

    nc = await connect(nats_url)
    await nc.close()  # every read of the log fails
    registry = CollectorRegistry()
    tracker = RunTracker(RunLog(nc, subjects), [OrchestratorMetrics(registry)], catch_up_attempts=2)
    t0 = "2026-01-01T00:00:00.000Z"
    tracker.relayed(
        "r8",
        [
            record(ev.StateEntered, "r8", 4, ev.StateEnteredData(state="done"), t0),
            record(ev.RunCompleted, "r8", 5, ev.RunCompletedData(state="done"), t0),
        ],
    )
    await tracker.drain()
    completed = [
        s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "interlock_runs_completed_total"
    ]
    assert sum(completed) == 1
