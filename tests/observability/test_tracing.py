"""One trace per run, across the orchestrator and the agent, joined by ``traceparent``."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from interlock.core.engine import derive_run_id
from interlock.sdk import Outcome
from interlock.sdk.tracing import WorkerTracer
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from interlock.transport.tracing import (
    format_traceparent,
    parse_traceparent,
    trace_id_for,
    tracer_provider_from_env,
)
from support.observability import (
    TIMEOUT,
    answer,
    connect,
    eventually,
    instrumented_stack,
    memory_provider,
    plain_agent,
)

TRIGGER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
TRIGGER_SPAN = 0xB7AD6B7169203331


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_of(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def test_span_tree_of_a_run_across_orchestrator_and_agent(
    nats_url: str, subjects: Subjects
) -> None:
    orch_provider, orch_spans = memory_provider("interlock-orchestrator")
    agent_provider, agent_spans = memory_provider("interlock-agent-plain")
    agent_tracer = WorkerTracer(agent_provider, "plain", subjects)
    answering = await connect(nats_url)
    seen_headers: list[dict[str, str]] = []

    async def handle(request: CloudEvent, msg: Msg) -> None:
        # What the SDK worker does around a handler, hook by hook.
        seen_headers.append(dict(msg.headers or {}))
        agent_tracer.task_received("echo", request, msg.headers)
        agent_tracer.task_started("echo", request.extensions["actionid"])
        data: Any = request.data
        await answer(answering, subjects, request, {"score": 7} if "score" in data else data)
        agent_tracer.task_finished(
            "echo", request.extensions["actionid"], Outcome.COMPLETED, None, 0.001
        )

    try:
        async with (
            instrumented_stack(nats_url, subjects, provider=orch_provider) as stack,
            plain_agent(nats_url, subjects, "echo", handle),
        ):
            trigger = CloudEvent(
                id="pr-1",
                source="/git",
                type="com.example.review",
                data={"score": 7},
                extensions={"traceparent": f"00-{TRIGGER_TRACE:032x}-{TRIGGER_SPAN:016x}-01"},
            )
            await stack.client.emit(trigger)
            definition, _ = await stack.client.registry.latest("review")
            run_id = derive_run_id(definition, "/git", "pr-1")
            state = await stack.client.wait(run_id, TIMEOUT)
            assert state.status == "completed"
            await eventually(
                lambda: any(s.name == "run review" for s in orch_spans.get_finished_spans()),
                "the run span",
            )
    finally:
        await answering.close()

    spans = list(orch_spans.get_finished_spans())
    agent = list(agent_spans.get_finished_spans())
    names = by_name(spans)
    # One trace: the trigger's.
    assert {trace_of(s) for s in spans + agent} == {TRIGGER_TRACE}

    (run,) = names["run review"]
    assert parent_id(run) == TRIGGER_SPAN
    assert run.attributes is not None
    assert run.attributes["interlock.run.id"] == run_id
    assert run.attributes["interlock.run.status"] == "completed"

    states = {s.name: s for s in spans if s.name.startswith("state ")}
    assert set(states) == {"state check", "state second", "state done"}
    assert all(parent_id(s) == span_id(run) for s in states.values())
    check = states["state check"]
    events = [e.name for e in check.events]
    assert events == ["guard.failed", "transition"]
    transition = check.events[-1].attributes
    assert transition is not None
    assert (transition["interlock.transition.from"], transition["interlock.transition.to"]) == (
        "check",
        "second",
    )

    actions = names["action echo"]
    assert len(actions) == 2
    assert sorted(parent_id(a) or 0 for a in actions) == sorted(
        span_id(states[n]) for n in ("state check", "state second")
    )
    sends = names[f"send {subjects.capability('echo')}"]
    assert len(sends) == 2
    assert {parent_id(s) for s in sends} == {span_id(a) for a in actions}
    for send in sends:
        assert send.kind is SpanKind.PRODUCER
        assert send.attributes is not None
        assert send.attributes["messaging.system"] == "nats"
        assert send.attributes["messaging.destination.name"] == subjects.capability("echo")
        assert send.attributes["messaging.operation.type"] == "send"

    # The agent's process spans are children of the producer spans, joined by the header.
    assert [h.get("traceparent") is not None for h in seen_headers] == [True, True]
    processes = by_name(agent)[f"process {subjects.capability('echo')}"]
    assert len(processes) == 2
    assert {parent_id(p) for p in processes} == {span_id(s) for s in sends}
    for process in processes:
        assert process.kind is SpanKind.CONSUMER
        assert process.attributes is not None
        assert process.attributes["messaging.operation.type"] == "process"
        assert process.attributes["interlock.run.id"] == run_id

    # Each span is emitted once.
    assert len({span_id(s) for s in spans}) == len(spans)
    # The run span covers its states; states follow one another.
    assert run.start_time is not None
    assert run.end_time is not None
    for s in states.values():
        assert s.start_time is not None
        assert s.end_time is not None
        assert run.start_time <= s.start_time <= s.end_time <= run.end_time


async def test_a_restarted_orchestrator_continues_the_same_trace(
    nats_url: str, subjects: Subjects
) -> None:
    """No span while the new process folds the log; the states it ends join the old tree."""
    first_provider, first_spans = memory_provider("orchestrator-a")
    second_provider, second_spans = memory_provider("orchestrator-b")
    held: asyncio.Queue[CloudEvent] = asyncio.Queue()
    answering = await connect(nats_url)

    async def hold(request: CloudEvent, msg: Msg) -> None:
        held.put_nowait(request)

    try:
        async with plain_agent(nats_url, subjects, "echo", hold):
            async with instrumented_stack(nats_url, subjects, provider=first_provider) as stack:
                run_id = await stack.client.start("review", {"score": 3})
                first = await asyncio.wait_for(held.get(), TIMEOUT)
            # The first orchestrator is gone; a fresh one (empty memory) takes over.
            async with instrumented_stack(nats_url, subjects, provider=second_provider) as stack:
                await answer(answering, subjects, first, {"score": 3})
                state = await stack.client.wait(run_id, TIMEOUT)
                assert state.status == "completed"
                assert state.state == "rejected"
                await eventually(
                    lambda: any(s.name == "run review" for s in second_spans.get_finished_spans()),
                    "the run span",
                )
    finally:
        await answering.close()

    before = list(first_spans.get_finished_spans())
    after = list(second_spans.get_finished_spans())
    # Started by a client (no traceparent): the trace id derives from the run id.
    assert {trace_of(s) for s in before + after} == {trace_id_for(run_id)}
    # Before the restart only the dispatch happened; nothing ended.
    assert [s.name for s in before] == [f"send {subjects.capability('echo')}"]
    names = by_name(after)
    assert set(names) == {"run review", "state check", "action echo", "state rejected"}
    (run,) = names["run review"]
    assert run.parent is None  # a root
    (check,) = names["state check"]
    (action,) = names["action echo"]
    assert parent_id(check) == span_id(run)
    assert parent_id(action) == span_id(check)
    # The producer span of the first process hangs under the action the second one ended.
    assert parent_id(before[0]) == span_id(action)
    # Start times come from the log, not from the second process's memory.
    assert check.start_time is not None
    assert before[0].start_time is not None
    assert check.start_time <= before[0].start_time


async def test_sdk_worker_spans_join_the_run(nats_url: str, subjects: Subjects) -> None:
    from interlock.sdk import TaskContext, Worker

    orch_provider, orch_spans = memory_provider("interlock-orchestrator")
    agent_provider, agent_spans = memory_provider("interlock-agent-obsagent")
    worker = Worker("obsagent", concurrency=4, grace_period=1.0)
    worker.add_observer(WorkerTracer(agent_provider, "obsagent", subjects))

    @worker.capability("echo")
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return {"score": 7} if "score" in inp else inp

    worker_nc = await connect(nats_url)
    try:
        async with instrumented_stack(nats_url, subjects, provider=orch_provider) as stack:
            task = asyncio.create_task(worker.run(worker_nc, prefix=subjects.prefix))
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            run_id = await stack.client.start("review", {"score": 7})
            assert (await stack.client.wait(run_id, TIMEOUT)).status == "completed"
            await worker.stop()
            await task
    finally:
        await worker_nc.close()
    sends = [s for s in orch_spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    processes = [s for s in agent_spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert len(processes) == 2
    assert {parent_id(p) for p in processes} == {span_id(s) for s in sends}


def test_traceparent_round_trip_and_rejects() -> None:
    ctx = parse_traceparent(f"00-{TRIGGER_TRACE:032x}-{TRIGGER_SPAN:016x}-01")
    assert ctx is not None
    assert ctx.trace_id == TRIGGER_TRACE
    assert ctx.span_id == TRIGGER_SPAN
    assert format_traceparent(ctx) == f"00-{TRIGGER_TRACE:032x}-{TRIGGER_SPAN:016x}-01"
    for bad in (None, "", "garbage", f"00-{0:032x}-{TRIGGER_SPAN:016x}-01", "ff-" + "a" * 49):
        assert parse_traceparent(bad) is None


def test_tracing_is_off_unless_configured() -> None:
    assert tracer_provider_from_env("x", environ={}) is None
    assert tracer_provider_from_env("x", environ={"OTEL_TRACES_EXPORTER": "none"}) is None
    disabled = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}
    assert tracer_provider_from_env("x", environ=disabled) is None
    provider = tracer_provider_from_env(
        "x", environ={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "svc"}
    )
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "svc"
    provider.shutdown()


def test_otlp_without_the_extra_is_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        assert tracer_provider_from_env("x", environ=env) is None
        assert "interlock[otlp]" in caplog.text
    else:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
        provider = tracer_provider_from_env("x", environ=env)
        assert provider is not None
        provider.shutdown()


def test_failed_spans_carry_error_status() -> None:
    """A failed task span is an error (status), with the error class as error.type."""
    provider, exporter = memory_provider("agent")
    tracer = WorkerTracer(provider, "w")
    request = CloudEvent(
        id="a:1",
        source="s",
        type="io.interlock.task.requested",
        extensions={"runid": "r", "actionid": "r:3"},
    )
    tracer.task_received("echo", request, {})
    tracer.task_finished("echo", "r:3", Outcome.FAILED, "agent_error", 0.1)
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "agent_error"
    assert span.parent is None
    assert Counter(s.name for s in exporter.get_finished_spans()) == {"process il.cap.echo": 1}


def _record(cls: type[Any], seq: int, data: Any, time: str, run_id: str = "r9") -> Any:
    return cls(
        specversion="1.0",
        id=f"{run_id}:{seq}",
        source="interlock://orchestrator",
        subject=run_id,
        time=time,
        datacontenttype="application/json",
        data=data,
    )


def test_each_attempt_of_a_retried_action_has_its_own_span() -> None:
    from interlock.core import events as ev
    from interlock.runtime.metrics import RunTracker
    from interlock.runtime.tracing import orchestrator_tracer

    provider, exporter = memory_provider("orchestrator")
    tracker = RunTracker(None)
    orchestrator_tracer(provider, tracker)
    t = "2026-01-01T00:00:0{}.000Z".format
    requested = ev.ActionRequestedData(action_id="r9:3", state="a", index=0, capability="c")
    error = ev.ErrorInfo(error_class="timeout", message="late", retryable=True)
    tracker.relayed(
        "r9",
        [
            _record(ev.RunStarted, 1, ev.RunStartedData(workflow="wf", spec_hash="h"), t(0)),
            _record(ev.StateEntered, 2, ev.StateEnteredData(state="a"), t(0)),
            _record(ev.ActionRequested, 3, requested, t(0)),
        ],
    )
    failed = ev.ActionFailedData(action_id="r9:3", state="a", index=0, error=error)
    tracker.relayed("r9", [_record(ev.ActionFailed, 4, failed, t(2))])
    again = ev.ActionRequestedData(action_id="r9:3", state="a", index=0, capability="c", attempt=2)
    tracker.relayed("r9", [_record(ev.ActionRequested, 5, again, t(3))])
    done = ev.ActionCompletedData(action_id="r9:3", state="a", index=0)
    tracker.relayed(
        "r9",
        [
            _record(ev.ActionCompleted, 6, done, t(4)),
            _record(ev.RunCompleted, 7, ev.RunCompletedData(state="a"), t(4)),
        ],
    )
    spans = by_name(list(exporter.get_finished_spans()))
    first, second = sorted(spans["action c"], key=lambda s: s.start_time or 0)
    assert span_id(first) != span_id(second)
    assert parent_id(first) == parent_id(second) == span_id(spans["state a"][0])
    assert first.status.status_code is StatusCode.ERROR
    assert second.status.status_code is StatusCode.UNSET
    assert first.attributes is not None
    assert second.attributes is not None
    assert (
        first.attributes["interlock.action.attempt"],
        second.attributes["interlock.action.attempt"],
    ) == (1, 2)
    assert {trace_of(s) for s in exporter.get_finished_spans()} == {trace_id_for("r9")}
