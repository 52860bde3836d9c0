"""The worker against a real nats-server: results, failures, deadlines, cancellation, limits."""

from __future__ import annotations

import asyncio
import contextvars
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from interlock.sdk import (
    AgentError,
    Emit,
    Outcome,
    RetryableError,
    TaskContext,
    Worker,
    WorkerObserver,
)
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name, heartbeat_key
from support.sdk import Finished

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def new_run() -> str:
    return f"run{uuid.uuid4().hex[:10]}"


class SummarizeIn(msgspec.Struct, frozen=True):
    text: str


class SummarizeOut(msgspec.Struct, frozen=True):
    summary: str
    length: int


async def consumers_settled(wire: Any, capabilities: list[str]) -> list[Any]:
    """Wait until no pull request of a worker is open on these capabilities' consumers
    (the worker asks for no more work); their infos."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        infos = [
            await wire.js.consumer_info(wire.subjects.tasks_stream, consumer_name(c))
            for c in capabilities
        ]
        if all(i.num_waiting == 0 for i in infos):
            return infos
        assert asyncio.get_running_loop().time() < deadline, f"pull requests left open: {infos}"
        await asyncio.sleep(0.02)


def error_of(event: Any) -> dict[str, Any]:
    assert event.type == "task.failed", event
    error: dict[str, Any] = event.data["error"]
    assert set(error) - {"code"} == {"class", "message", "retryable"}
    return error


# --- answers ------------------------------------------------------------------------------


async def test_typed_handler_completes_and_the_task_is_acked(wire, runner, poll) -> None:
    worker = Worker("summarizer")
    seen: list[TaskContext] = []

    @worker.capability("summarize")
    async def summarize(inp: SummarizeIn, ctx: TaskContext) -> SummarizeOut:
        seen.append(ctx)
        return SummarizeOut(summary=inp.text[:5], length=len(inp.text))

    await runner.start(worker)
    run_id = new_run()
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    action = await wire.publish_task(
        "summarize",
        {"text": "hello world"},
        run_id=run_id,
        seq=3,
        attempt=2,
        deadline=deadline,
        traceparent=TRACEPARENT,
    )
    event, headers = await wire.result(run_id)

    assert event.type == "task.completed"
    assert event.data == {"summary": "hello", "length": 11}
    assert event.id == f"{action}.2.result"
    assert event.source == "interlock://agent/summarizer"
    assert event.subject == run_id
    assert event.time is not None
    assert event.extensions == {
        "runid": run_id,
        "actionid": action,
        "attempt": "2",
        "traceparent": TRACEPARENT,
    }
    assert headers["Nats-Msg-Id"] == f"interlock://agent/summarizer:{action}.2.result"
    ctx = seen[0]
    assert (ctx.run_id, ctx.action_id, ctx.attempt, ctx.capability) == (
        run_id,
        action,
        2,
        "summarize",
    )
    assert ctx.traceparent == TRACEPARENT
    assert ctx.deadline is not None
    assert abs((ctx.deadline - deadline).total_seconds()) < 0.01
    assert ctx.delivery == 1
    await poll(lambda: no_tasks_left(wire))  # acked after the result was stored


async def no_tasks_left(wire: Any) -> bool:
    return bool(await wire.tasks_left() == 0)


async def test_dict_handler_without_context_and_emit(wire, runner) -> None:
    worker = Worker("reviewer")

    @worker.capability("echo")
    async def echo(inp: dict[str, Any]) -> dict[str, Any]:
        return inp

    @worker.capability("review")
    async def review(inp: dict[str, Any], ctx: TaskContext) -> Emit:
        return Emit("review.approved", {"score": inp["score"]})

    await runner.start(worker)
    run_a, run_b = new_run(), new_run()
    await wire.publish_task("echo", {"a": [1, 2], "b": None}, run_id=run_a)
    await wire.publish_task("review", {"score": 9}, run_id=run_b)

    echoed, _ = await wire.result(run_a)
    assert (echoed.type, echoed.data) == ("task.completed", {"a": [1, 2], "b": None})
    emitted, _ = await wire.result(run_b)
    assert (emitted.type, emitted.data) == ("review.approved", {"score": 9})
    assert "traceparent" not in emitted.extensions


async def test_handler_failures_are_classified(wire, runner) -> None:
    worker = Worker("failing")

    @worker.capability("fail")
    async def fail(inp: dict[str, Any]) -> dict[str, Any]:
        kind = inp["kind"]
        if kind == "agent":
            raise AgentError("bad diff")
        if kind == "retryable":
            raise RetryableError("upstream busy")
        if kind == "forced":
            raise AgentError("flaky", retryable=True)
        if kind == "coded":
            raise AgentError("the search tool is down", code="tool_error")
        raise ValueError("boom")

    await runner.start(worker)
    runs = {kind: new_run() for kind in ("agent", "retryable", "forced", "crash", "coded")}
    for kind, run_id in runs.items():
        await wire.publish_task("fail", {"kind": kind}, run_id=run_id)

    expected = {
        "agent": ("bad diff", False),
        "retryable": ("upstream busy", True),
        "forced": ("flaky", True),
        "crash": ("ValueError: boom", True),
    }
    for kind, (message, retryable) in expected.items():
        event, _ = await wire.result(runs[kind])
        error = error_of(event)
        assert error == {"class": "agent_error", "message": message, "retryable": retryable}
    event, _ = await wire.result(runs["coded"])
    assert error_of(event) == {
        "class": "agent_error",
        "message": "the search tool is down",
        "retryable": False,
        "code": "tool_error",
    }


# --- schemas ------------------------------------------------------------------------------


async def test_input_schema_violation_never_reaches_the_handler(wire, runner) -> None:
    worker = Worker("strict")
    calls: list[Any] = []

    @worker.capability(
        "strict",
        input_schema={
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        },
    )
    async def strict(inp: dict[str, Any]) -> dict[str, Any]:
        calls.append(inp)
        return {}

    @worker.capability("typed")
    async def typed(inp: SummarizeIn) -> dict[str, Any]:
        calls.append(inp)
        return {}

    await runner.start(worker)
    bad_schema, bad_type, not_object = new_run(), new_run(), new_run()
    await wire.publish_task("strict", {"text": 42}, run_id=bad_schema)
    await wire.publish_task("typed", {"txt": "x"}, run_id=bad_type)
    await wire.publish_task("strict", [1, 2], run_id=not_object)

    error = error_of((await wire.result(bad_schema))[0])
    assert error["class"] == "schema_error"
    assert error["retryable"] is False
    assert "$.text" in error["message"]
    assert "is not of type 'string'" in error["message"]
    error = error_of((await wire.result(bad_type))[0])
    assert error["class"] == "schema_error"
    assert "SummarizeIn" in error["message"]
    assert "text" in error["message"]
    error = error_of((await wire.result(not_object))[0])
    assert error["class"] == "schema_error"
    assert "JSON object" in error["message"]
    assert calls == []


async def test_output_schema_violation_is_a_schema_error(wire, runner) -> None:
    worker = Worker("sloppy")

    @worker.capability(
        "sloppy",
        output_schema={"type": "object", "required": ["score"]},
    )
    async def sloppy(inp: dict[str, Any]) -> Any:
        return inp["out"]

    await runner.start(worker)
    missing, not_object, emitted_bad, ok = new_run(), new_run(), new_run(), new_run()
    await wire.publish_task("sloppy", {"out": {"scor": 1}}, run_id=missing)
    await wire.publish_task("sloppy", {"out": [1]}, run_id=not_object)
    await wire.publish_task("sloppy", {"out": {"score": 1}}, run_id=ok)
    error = error_of((await wire.result(missing))[0])
    assert error["class"] == "schema_error"
    assert "'score' is a required property" in error["message"]
    error = error_of((await wire.result(not_object))[0])
    assert error["class"] == "schema_error"
    assert (await wire.result(ok))[0].data == {"score": 1}
    del emitted_bad


async def test_agentdef_in_the_agents_bucket_is_enforced(
    wire, runner, js: JetStreamContext, subjects: Subjects
) -> None:
    agents = await js.key_value(subjects.agents_bucket)
    spec = {
        "capabilities": [
            {
                "name": "summarize",
                "input_schema": {"type": "object", "required": ["text"]},
                "output_schema": {"type": "object", "required": ["summary"]},
                "timeout_seconds": 5,
                "max_retries": 1,
            }
        ]
    }
    await agents.put("summary-agent", json.dumps(spec).encode())
    worker = Worker("summary-agent")

    @worker.capability("summarize")
    async def summarize(inp: dict[str, Any]) -> dict[str, Any]:
        return {"summary": inp["text"]} if inp["text"] else {"nothing": True}

    await runner.start(worker)
    bad_in, bad_out, ok = new_run(), new_run(), new_run()
    await wire.publish_task("summarize", {"txt": "x"}, run_id=bad_in)
    await wire.publish_task("summarize", {"text": ""}, run_id=bad_out)
    await wire.publish_task("summarize", {"text": "x"}, run_id=ok)

    error = error_of((await wire.result(bad_in))[0])
    assert error["class"] == "schema_error"
    assert "AgentDef summary-agent" in error["message"]
    assert "input" in error["message"]
    error = error_of((await wire.result(bad_out))[0])
    assert error["class"] == "schema_error"
    assert "output" in error["message"]
    assert (await wire.result(ok))[0].data == {"summary": "x"}


async def test_an_agentdef_written_after_the_worker_started_is_heard(
    wire, runner, js: JetStreamContext, subjects: Subjects
) -> None:
    # The worker reads the bucket again when it hears a write to it, long before its
    # periodic read (30 s): a schema put while it runs applies to the next task, and
    # is gone with its AgentDef.
    agents = await js.key_value(subjects.agents_bucket)
    worker = Worker("later-agent")

    @worker.capability("later")
    async def later(inp: dict[str, Any]) -> dict[str, Any]:
        return inp

    await runner.start(worker)
    first = new_run()
    await wire.publish_task("later", {"txt": "x"}, run_id=first)
    assert (await wire.result(first))[0].data == {"txt": "x"}

    spec = {
        "capabilities": [
            {"name": "later", "input_schema": {"type": "object", "required": ["text"]}}
        ]
    }
    await agents.put("later-agent", json.dumps(spec).encode())
    deadline = asyncio.get_running_loop().time() + 10
    while worker._catalog.get("later") is None:
        assert asyncio.get_running_loop().time() < deadline, "the AgentDef was not heard"
        await asyncio.sleep(0.02)
    refused = new_run()
    await wire.publish_task("later", {"txt": "x"}, run_id=refused)
    error = error_of((await wire.result(refused))[0])
    assert error["class"] == "schema_error"
    assert "AgentDef later-agent" in error["message"]

    await agents.delete("later-agent")
    while worker._catalog.get("later") is not None:
        assert asyncio.get_running_loop().time() < deadline + 10, "the delete was not heard"
        await asyncio.sleep(0.02)
    again = new_run()
    await wire.publish_task("later", {"txt": "x"}, run_id=again)
    assert (await wire.result(again))[0].data == {"txt": "x"}


async def test_a_worker_of_more_capabilities_than_slots_serves_each_at_once(wire, runner) -> None:
    # Two handler slots, six capabilities: four consumers find no slot to reserve. Each
    # still keeps a pull request open (unreserved), and a task that comes takes a slot
    # from a request nothing came for, so no task waits for another consumer's request to
    # expire (60 s here; the test waits 20 s at most per answer).
    worker = Worker("wide", concurrency=2, pull_expires=60.0)
    names = [f"wide-{n}" for n in range(6)]

    def server(name: str) -> Any:
        async def serve(inp: dict[str, Any]) -> dict[str, Any]:
            return {"by": name, **inp}

        return serve

    for name in names:
        worker.capability(name)(server(name))
    await runner.start(worker)
    for name in reversed(names):  # the last consumers made are the ones left without
        run_id = new_run()
        await wire.publish_task(name, {"n": 1}, run_id=run_id)
        assert (await wire.result(run_id, wait=20.0))[0].data == {"by": name, "n": 1}
    # All at once, more than there are slots: every one answered, none twice.
    runs = {new_run(): name for name in names * 3}
    for run_id, name in runs.items():
        await wire.publish_task(name, {"n": 2}, run_id=run_id)
    for run_id, name in runs.items():
        assert (await wire.result(run_id, wait=20.0))[0].data == {"by": name, "n": 2}


# --- deadlines and cancellation -----------------------------------------------------------


async def test_deadline_cancels_the_handler_and_reports_timeout(wire, runner) -> None:
    worker = Worker("sleepy")
    cancelled = asyncio.Event()

    @worker.capability("sleep")
    async def sleep(inp: dict[str, Any]) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    await runner.start(worker)
    run_id = new_run()
    await wire.publish_task(
        "sleep", {}, run_id=run_id, deadline=datetime.now(UTC) + timedelta(milliseconds=300)
    )
    error = error_of((await wire.result(run_id))[0])
    assert error["class"] == "timeout"
    assert error["retryable"] is True
    assert cancelled.is_set()


async def test_a_task_past_its_deadline_is_not_started(wire, runner) -> None:
    worker = Worker("late")
    calls: list[Any] = []

    @worker.capability("late")
    async def late(inp: dict[str, Any]) -> dict[str, Any]:
        calls.append(inp)
        return {}

    await runner.start(worker)
    run_id = new_run()
    await wire.publish_task(
        "late", {}, run_id=run_id, deadline=datetime.now(UTC) - timedelta(seconds=1)
    )
    error = error_of((await wire.result(run_id))[0])
    assert error["class"] == "timeout"
    assert "had passed" in error["message"]
    assert calls == []


async def test_cancellation_on_the_control_subject(wire, runner) -> None:
    worker = Worker("cancellable")
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @worker.capability("wait")
    async def wait(inp: dict[str, Any]) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    await runner.start(worker)
    run_id = new_run()
    action = await wire.publish_task("wait", {}, run_id=run_id)
    await asyncio.wait_for(started.wait(), 5)
    await wire.cancel(run_id, f"{run_id}.other", capability="wait")  # another action: ignored
    await wire.cancel(run_id, action)
    error = error_of((await wire.result(run_id))[0])
    assert error == {
        "class": "cancelled",
        "message": "cancelled by the orchestrator",
        "retryable": False,
    }
    assert cancelled.is_set()


async def test_a_task_cancelled_while_queued_is_answered_without_running(
    wire, runner, poll
) -> None:
    """The notice comes while the task still waits in the work queue (the only slot is
    busy): the worker remembers it and answers the task without calling the handler."""
    finished = Finished()
    worker = Worker("queued", concurrency=1, observers=[finished])
    calls: list[str] = []
    started = asyncio.Event()

    @worker.capability("wait")
    async def wait(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        calls.append(ctx.action_id)
        started.set()
        await asyncio.Event().wait()
        return {}

    await runner.start(worker)
    busy_run, queued_run = new_run(), new_run()
    busy = await wire.publish_task("wait", {}, run_id=busy_run)
    await asyncio.wait_for(started.wait(), 5)
    queued = await wire.publish_task("wait", {}, run_id=queued_run)
    await wire.cancel(queued_run, queued)
    # Notices are handled in order: once the busy task answers its own cancel, the first
    # notice has been seen, and only then does the slot free for the queued task.
    await wire.cancel(busy_run, busy)
    assert error_of((await wire.result(busy_run))[0])["class"] == "cancelled"

    event, _ = await wire.result(queued_run)
    assert event.extensions["actionid"] == queued
    assert error_of(event) == {
        "class": "cancelled",
        "message": "cancelled by the orchestrator",
        "retryable": False,
    }
    assert calls == [busy]
    assert {await finished.next(), await finished.next()} == {
        (busy, Outcome.FAILED, "cancelled"),
        (queued, Outcome.FAILED, "cancelled"),
    }
    await poll(lambda: no_tasks_left(wire))  # acked: it is never delivered again
    assert await wire.stored_results(queued_run) == 1
    assert finished.events.empty()


async def test_a_remembered_cancel_skips_only_the_attempts_it_covers(wire, runner) -> None:
    """A notice naming an attempt skips that attempt only; one without an attempt (sent
    when an attempt times out) skips the attempts requested before it, not the retry."""
    worker = Worker("retrying")
    ran: list[tuple[str, int]] = []
    started = asyncio.Event()

    @worker.capability("work")
    async def work(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        if inp.get("block"):
            started.set()
            await asyncio.Event().wait()
        ran.append((ctx.action_id, ctx.attempt))
        return {}

    await runner.start(worker)
    sync_run = new_run()
    sync = await wire.publish_task("work", {"block": True}, run_id=sync_run)
    await asyncio.wait_for(started.wait(), 5)
    cancelled_at = datetime.now(UTC)
    runs = {name: new_run() for name in ("named", "other", "retry", "earlier")}
    action = {name: f"{run}.1" for name, run in runs.items()}
    await wire.cancel(runs["named"], action["named"], attempt=2, capability="work")
    await wire.cancel(runs["other"], action["other"], attempt=1, capability="work")
    await wire.cancel(runs["retry"], action["retry"], at=cancelled_at, capability="work")
    await wire.cancel(runs["earlier"], action["earlier"], at=cancelled_at, capability="work")
    await wire.cancel(sync_run, sync)  # handled after the notices above
    assert error_of((await wire.result(sync_run))[0])["class"] == "cancelled"

    requested = {
        "named": cancelled_at,
        "other": cancelled_at,
        "retry": cancelled_at + timedelta(seconds=2),
        "earlier": cancelled_at - timedelta(seconds=2),
    }
    for name, run_id in runs.items():
        await wire.publish_task("work", {}, run_id=run_id, attempt=2, at=requested[name])
    answers = {name: (await wire.result(run_id))[0] for name, run_id in runs.items()}
    assert {name: event.type for name, event in answers.items()} == {
        "named": "task.failed",
        "other": "task.completed",
        "retry": "task.completed",
        "earlier": "task.failed",
    }
    assert error_of(answers["named"])["class"] == "cancelled"
    assert error_of(answers["earlier"])["class"] == "cancelled"
    assert sorted(ran) == sorted([(action["other"], 2), (action["retry"], 2)])


# --- concurrency and shutdown -------------------------------------------------------------


async def test_never_more_handlers_than_the_concurrency_limit(wire, runner) -> None:
    worker = Worker("limited", concurrency=2)
    running = 0
    peak = 0
    two_running = asyncio.Event()
    gate = asyncio.Event()

    @worker.capability("work")
    async def work(inp: dict[str, Any]) -> dict[str, Any]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two_running.set()
        await gate.wait()
        running -= 1
        return {"n": inp["n"]}

    @worker.capability("other")  # a second consumer shares the same slots
    async def other(inp: dict[str, Any]) -> dict[str, Any]:
        return await work(inp)

    await runner.start(worker)
    runs = [new_run() for _ in range(6)]
    for n, run_id in enumerate(runs):
        await wire.publish_task("work" if n % 2 else "other", {"n": n}, run_id=run_id)
    await asyncio.wait_for(two_running.wait(), 5)
    # Slots are reserved before pulling: with both in use, the worker leaves no pull
    # request open (an over-eager one keeps asking, and would start a third handler).
    await consumers_settled(wire, ["work", "other"])
    assert worker.in_flight == 2
    gate.set()
    for n, run_id in enumerate(runs):
        event, _ = await wire.result(run_id)
        assert event.data == {"n": n}
    assert peak == 2


async def test_stop_waits_for_running_handlers(wire, runner, poll, nc: Client, subjects) -> None:
    worker = Worker("graceful", grace_period=10)
    started = asyncio.Event()
    gate = asyncio.Event()

    @worker.capability("job")
    async def job(inp: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await gate.wait()
        return {"done": True}

    task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
    await worker.wait_ready()
    run_id = new_run()
    await wire.publish_task("job", {}, run_id=run_id)
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.create_task(worker.stop())
    await consumers_settled(wire, ["job"])  # stop took back its pull requests, and then:
    assert not stopping.done()  # still waiting for the handler
    gate.set()
    await asyncio.wait_for(stopping, 5)
    await task
    event, _ = await wire.result(run_id)
    assert event.data == {"done": True}
    await poll(lambda: no_tasks_left(wire))


async def test_unfinished_tasks_are_handed_back_after_the_grace_period(
    wire, runner, nc: Client, subjects
) -> None:
    first = Worker("impatient", grace_period=0.1)
    started = asyncio.Event()

    @first.capability("long")
    async def long(inp: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    task = asyncio.create_task(first.run(nc, prefix=subjects.prefix))
    await first.wait_ready()
    run_id = new_run()
    await wire.publish_task("long", {"x": 1}, run_id=run_id)
    await asyncio.wait_for(started.wait(), 5)
    await first.stop()
    await task
    assert wire.pending_results(run_id) == 0  # handed back, not answered

    second = Worker("patient")
    deliveries: list[int] = []

    @second.capability("long")
    async def finish(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        deliveries.append(ctx.delivery)
        return inp

    await runner.start(second)
    event, _ = await wire.result(run_id)  # at once: the nak made it available again
    assert (event.source, event.data) == ("interlock://agent/patient", {"x": 1})
    assert deliveries == [2]


async def test_a_result_published_twice_is_stored_once(wire, runner) -> None:
    finished = Finished()
    worker = Worker("dupes", observers=[finished])

    @worker.capability("once")
    async def once(inp: dict[str, Any]) -> dict[str, Any]:
        return inp

    await runner.start(worker)
    run_id = new_run()
    action = await wire.publish_task("once", {"v": 1}, run_id=run_id)
    assert (await finished.next())[:2] == (action, Outcome.COMPLETED)
    # The same attempt delivered again (as after a crash between result and ack).
    await wire.publish_task("once", {"v": 1}, run_id=run_id, msg_id=f"{action}.1.redelivered")
    assert (await finished.next())[:2] == (action, Outcome.COMPLETED)
    assert await wire.stored_results(run_id) == 1


# --- liveness and rejects -----------------------------------------------------------------


async def test_heartbeat_is_present_while_running_and_gone_after_stop(
    wire, nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    worker = Worker("beating", concurrency=3, heartbeat_interval=0.1, instance_id="i-1")

    @worker.capability("noop")
    async def noop(inp: dict[str, Any]) -> dict[str, Any]:
        return {}

    task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
    await worker.wait_ready()
    workers = await js.key_value(subjects.workers_bucket)
    entry = await workers.get(heartbeat_key("noop", "i-1"))
    record = json.loads(entry.value or b"")
    assert record["name"] == "beating"
    assert record["instance"] == "i-1"
    assert record["capabilities"] == ["noop"]
    assert record["concurrency"] == 3
    assert record["in_flight"] == 0
    assert record["pid"] > 0
    assert record["host"]
    assert record["started_at"] <= record["heartbeat_at"]
    first_beat = entry.revision
    watcher = await workers.watch(heartbeat_key("noop", "i-1"))
    while (update := await watcher.updates(timeout=2)) is None or update.revision == first_beat:
        pass  # the periodic beat rewrites the key
    await watcher.stop()

    await worker.stop()
    await task
    with pytest.raises(KeyNotFoundError):
        await workers.get(heartbeat_key("noop", "i-1"))


async def test_consumer_is_shared_and_named_after_the_capability(
    wire, runner, js: JetStreamContext, subjects: Subjects
) -> None:
    a, b = Worker("a", ack_wait=7), Worker("b", ack_wait=9)
    for w in (a, b):
        w.capability("http.fetch")(_noop)
    await runner.start(a)
    await runner.start(b)
    infos = list(await js.consumers_info(subjects.tasks_stream))
    assert [c.name for c in infos] == [consumer_name("http.fetch")] == ["cap_http_fetch"]
    config = infos[0].config
    assert config.filter_subject == subjects.capability("http.fetch")
    assert config.ack_wait == 7  # the first worker created it; the second bound to it
    assert config.durable_name == "cap_http_fetch"


async def _noop(inp: dict[str, Any]) -> dict[str, Any]:
    return {}


async def test_a_message_that_is_not_a_task_is_dead_lettered(
    wire, runner, poll, js: JetStreamContext, subjects: Subjects
) -> None:
    finished = Finished()
    worker = Worker("picky", observers=[finished])
    worker.capability("picky")(_noop)
    await runner.start(worker)
    dlq = await js.subscribe(subjects.dead_letters_all, ordered_consumer=True)
    await js.publish(subjects.capability("picky"), b"not a cloudevent")
    assert (await finished.next())[1] == Outcome.REJECTED
    msg = await dlq.next_msg(timeout=5)
    assert msg.subject == subjects.agent_dead_letter("picky", "bad-json")
    assert msg.data == b"not a cloudevent"
    assert msg.headers is not None
    assert msg.headers["Interlock-Dead-Letter-Reason"] == "bad-json"
    assert "not valid JSON" in msg.headers["Interlock-Dead-Letter-Detail"]
    assert msg.headers["Interlock-Dead-Letter-Subject"] == subjects.capability("picky")
    assert msg.headers["Interlock-Dead-Letter-Worker"] == "picky"
    # A CloudEvent, but without a run to answer to.
    headers = {"ce-specversion": "1.0", "ce-id": "x", "ce-source": "/s", "ce-type": "t"}
    await js.publish(subjects.capability("picky"), b"{}", headers=headers)
    assert (await finished.next())[1] == Outcome.REJECTED
    msg = await dlq.next_msg(timeout=5)
    assert msg.subject == subjects.agent_dead_letter("picky", "no-run-id")
    await poll(lambda: no_tasks_left(wire))  # terminated, not redelivered


# --- a consumer that goes away ------------------------------------------------------------


async def test_a_deleted_consumer_is_recreated(
    wire, runner, js: JetStreamContext, subjects: Subjects
) -> None:
    worker = Worker("resilient", pull_expires=1.0)
    worker.capability("again")(_echo)
    await runner.start(worker)
    await js.delete_consumer(subjects.tasks_stream, consumer_name("again"))
    run_id = new_run()
    await wire.publish_task("again", {"v": 2}, run_id=run_id)
    event, _ = await wire.result(run_id)
    assert event.data == {"v": 2}


async def test_a_worker_stops_with_an_error_when_its_consumer_is_taken(
    wire, nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    worker = Worker("evicted", pull_expires=1.0)
    worker.capability("mine")(_echo)
    task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
    await worker.wait_ready()
    name = consumer_name("mine")
    await js.delete_consumer(subjects.tasks_stream, name)
    await js.add_consumer(
        subjects.tasks_stream,
        durable_name=name,
        name=name,
        filter_subject=subjects.capability("theirs"),
    )
    with pytest.raises(RuntimeError, match="two capability names map to the same consumer"):
        await asyncio.wait_for(task, 10)


async def _echo(inp: dict[str, Any]) -> dict[str, Any]:
    return inp


async def test_a_worker_runs_again_after_a_stop(wire, nc: Client, subjects: Subjects) -> None:
    worker = Worker("phoenix")
    worker.capability("rise")(_echo)
    for round_ in range(2):
        task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
        await worker.wait_ready()
        run_id = new_run()
        await wire.publish_task("rise", {"round": round_}, run_id=run_id)
        assert (await wire.result(run_id))[0].data == {"round": round_}
        await worker.stop()
        await task
    worker.request_stop()  # before run(): it returns at once
    await asyncio.wait_for(worker.run(nc, prefix=subjects.prefix), 5)


current_task_id: contextvars.ContextVar[str] = contextvars.ContextVar("current_task_id")


class ContextSetter(WorkerObserver):
    """Sets a context variable per task, as a tracing observer sets the current span."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def task_received(self, capability: str, event: Any, headers: Any) -> None:
        self.calls.append(f"received {event.id} {headers['Nats-Msg-Id']}")
        current_task_id.set(event.id)

    def task_started(self, capability: str, action_id: str | None) -> None:
        self.calls.append(f"started {action_id}")

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self.calls.append(f"finished {action_id} {outcome} {current_task_id.get()}")


async def test_observers_share_the_context_of_the_handler(wire, runner, poll) -> None:
    observer = ContextSetter()
    worker = Worker("observed", observers=[observer])

    @worker.capability("see")
    async def see(inp: dict[str, Any]) -> dict[str, Any]:
        return {"seen": current_task_id.get()}

    await runner.start(worker)
    run_id = new_run()
    action = await wire.publish_task("see", {}, run_id=run_id)
    assert (await wire.result(run_id))[0].data == {"seen": action}
    await poll(lambda: len(observer.calls) == 3)  # settled just after the result is stored
    assert observer.calls == [
        f"received {action} {action}.1",
        f"started {action}",
        f"finished {action} completed {action}",
    ]


# serial: a progress ack every 0.13 s keeps a task past its 0.4 s ack wait; a process
# stalled 0.3 s by another busy one on a 2-core machine lets JetStream redeliver it.
@pytest.mark.serial
async def test_long_tasks_outlive_ack_wait_without_redelivery(wire, runner) -> None:
    worker = Worker("marathon", concurrency=2, ack_wait=0.4)
    calls: list[int] = []

    @worker.capability("long")
    async def long(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        calls.append(ctx.delivery)
        await ctx.in_progress()
        await asyncio.sleep(1.2)  # the work itself: three times the ack wait
        return {"done": True}

    await runner.start(worker)
    run_id = new_run()
    await wire.publish_task("long", {}, run_id=run_id)
    assert (await wire.result(run_id))[0].data == {"done": True}
    # Without progress acks JetStream would have redelivered to the free slot by now; the
    # server itself says it never redelivered the task.
    assert calls == [1]
    assert await wire.stored_results(run_id) == 1
    info = await wire.js.consumer_info(wire.subjects.tasks_stream, consumer_name("long"))
    assert (info.delivered.consumer_seq, info.num_redelivered) == (1, 0), info


PULL_EXPIRES = 120.0
"""How long an idle pull request of the slot tests lasts."""
AT_ONCE = 30.0
"""What "at once" allows for there: a quarter of ``PULL_EXPIRES`` (a task that waited for
the idle pull request to expire would take all of it), room for a machine busy enough
to hold the worker up for seconds."""


async def test_an_idle_capability_does_not_hold_a_slot_another_needs(wire, runner, poll) -> None:
    """Two capabilities, two slots: while one task of ``busy`` runs, a second task of
    ``busy`` starts at once on the slot the idle ``quiet`` capability was pulling with,
    not when that pull request expires."""
    worker = Worker("sharing", concurrency=2, pull_expires=PULL_EXPIRES)
    release = asyncio.Event()
    started: list[str] = []

    @worker.capability("busy")
    async def busy(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        started.append(inp["n"])
        if inp["n"] == "first":
            await release.wait()
        return {"n": inp["n"]}

    @worker.capability("quiet")
    async def quiet(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return {}

    await runner.start(worker)
    first, second = new_run(), new_run()
    await wire.publish_task("busy", {"n": "first"}, run_id=first)
    await poll(lambda: started == ["first"])
    await wire.publish_task("busy", {"n": "second"}, run_id=second)
    # Well within the time the idle pull request would otherwise hold its slot.
    assert (await wire.result(second, wait=AT_ONCE))[0].data == {"n": "second"}
    release.set()
    assert (await wire.result(first))[0].data == {"n": "first"}
    # And the idle capability still gets its work.
    third = new_run()
    await wire.publish_task("quiet", {}, run_id=third)
    assert (await wire.result(third, wait=AT_ONCE))[0].data == {}


async def test_work_that_finds_every_slot_taken_waits_its_turn(wire, runner, poll) -> None:
    """Both slots busy with ``busy`` tasks (the second took the slot ``quiet`` was idling
    with): a ``quiet`` task that arrives meanwhile is not run beyond the concurrency; it
    is handed back and runs as soon as a slot frees."""
    worker = Worker("turns", concurrency=2, pull_expires=PULL_EXPIRES)
    release = asyncio.Event()
    running: list[str] = []
    most = 0

    @worker.capability("busy")
    async def busy(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        nonlocal most
        running.append(inp["n"])
        most = max(most, len(running))
        await release.wait()
        running.remove(inp["n"])
        return {"n": inp["n"]}

    @worker.capability("quiet")
    async def quiet(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        nonlocal most
        running.append("quiet")
        most = max(most, len(running))
        running.remove("quiet")
        return {"delivery": ctx.delivery}

    await runner.start(worker)
    runs = [new_run() for _ in range(3)]
    await wire.publish_task("busy", {"n": "a"}, run_id=runs[0])
    await poll(lambda: running == ["a"])
    await wire.publish_task("busy", {"n": "b"}, run_id=runs[1])
    await poll(lambda: running == ["a", "b"])
    await wire.publish_task("quiet", {}, run_id=runs[2])
    # No slot: the worker holds no pull request open, so nothing more reaches it; the quiet
    # task is still unanswered (and ``most`` below says it never ran beside the others).
    await consumers_settled(wire, ["busy", "quiet"])
    assert running == ["a", "b"]
    assert wire.pending_results(runs[2]) == 0
    release.set()
    answered = (await wire.result(runs[2]))[0].data
    assert answered["delivery"] in (1, 2)  # 2 when it was handed back once
    assert most == 2
    for run_id in runs[:2]:
        await wire.result(run_id)
