"""In-process pieces of the SDK: the public names, slots, names on the wire, registration."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import interlock.sdk
from interlock.sdk import Emit, Outcome, Worker, WorkerObserver
from interlock.sdk.execution import settled
from interlock.sdk.observe import WorkerObservers
from interlock.sdk.runner import load_worker
from interlock.sdk.schemas import AgentDefCatalog, Schema
from interlock.transport.cloudevents import decode_message
from interlock.transport.slots import SlotPool
from interlock.transport.tasks import TaskRequest, consumer_name, heartbeat_key, task_request
from support.sdk import Finished


def test_public_names_are_pinned() -> None:
    assert sorted(interlock.sdk.__all__) == [
        "AgentError",
        "Emit",
        "ErrorClass",
        "Outcome",
        "RetryableError",
        "TASK_COMPLETED",
        "TASK_FAILED",
        "TaskContext",
        "Worker",
        "WorkerObserver",
    ]
    for name in interlock.sdk.__all__:
        assert getattr(interlock.sdk, name) is not None
    assert interlock.sdk.TASK_COMPLETED == "task.completed"
    assert interlock.sdk.TASK_FAILED == "task.failed"
    assert [str(c) for c in interlock.sdk.ErrorClass] == [
        "timeout",
        "cancelled",
        "schema_error",
        "agent_error",
        "platform_error",
        "payload_too_large",
    ]
    assert interlock.sdk.RetryableError("x").retryable is True
    assert interlock.sdk.AgentError("x").retryable is False


# --- slots --------------------------------------------------------------------------------


async def test_slot_pool_never_hands_out_more_than_its_size() -> None:
    pool = SlotPool(3)
    assert await pool.acquire(5) == 3
    waiter = asyncio.ensure_future(pool.acquire(2))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert not pool.try_acquire()
    pool.release(1)
    assert await waiter == 1
    assert pool.free == 0
    pool.release(3)
    assert pool.free == 3


async def test_slot_pool_serves_waiters_in_order_and_survives_cancellation() -> None:
    pool = SlotPool(1)
    assert await pool.acquire(1) == 1
    first = asyncio.ensure_future(pool.acquire(1))
    second = asyncio.ensure_future(pool.acquire(1))
    third = asyncio.ensure_future(pool.acquire(1))
    await asyncio.sleep(0)
    first.cancel()
    pool.release(1)
    await asyncio.sleep(0)
    assert first.cancelled()
    assert second.done()
    assert not third.done()
    third.cancel()
    await asyncio.sleep(0)
    pool.release(1)
    assert pool.free == 1


def test_slot_pool_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SlotPool(0)


# --- names on the wire --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "name"),
    [
        ("summarize", "cap_summarize"),
        ("http.fetch", "cap_http_fetch"),
        ("a b/c*d>e", "cap_a_b_c_d_e"),
        ("x-y_Z9", "cap_x-y_Z9"),
    ],
)
def test_consumer_names(capability: str, name: str) -> None:
    assert consumer_name(capability) == name


def test_heartbeat_keys_are_a_capability_token_and_an_instance() -> None:
    assert heartbeat_key("review", "ab12") == "review.ab12"
    assert heartbeat_key("http.fetch", "h/1") == "http_fetch.h_1"
    assert heartbeat_key("a b:c", "x.y") == "a_b_c.x_y"
    assert heartbeat_key("echo", "") == "echo._"


# --- emit and registration ----------------------------------------------------------------


def test_emit_refuses_reserved_types() -> None:
    assert Emit("review.approved", {"score": 9}).type == "review.approved"
    with pytest.raises(ValueError, match="non-empty"):
        Emit(" ")
    with pytest.raises(ValueError, match="raise AgentError"):
        Emit("task.failed", {})
    with pytest.raises(ValueError, match="reserved"):
        Emit("io.interlock.run.completed")


def test_registration_checks_handlers_and_schemas() -> None:
    worker = Worker("w")

    @worker.capability("ok")
    async def ok(inp: dict[str, Any]) -> dict[str, Any]:
        return inp

    assert worker.capabilities == ["ok"]
    with pytest.raises(ValueError, match="already registered"):
        worker.capability("ok")(ok)
    with pytest.raises(TypeError, match="async function"):
        worker.capability("sync")(lambda inp: inp)

    async def three(a: Any, b: Any, c: Any) -> None: ...

    with pytest.raises(TypeError, match=r"\(input\) or \(input, ctx\)"):
        worker.capability("three")(three)
    with pytest.raises(ValueError, match="invalid JSON Schema"):
        worker.capability("bad", input_schema={"type": "no-such-type"})
    with pytest.raises(ValueError, match="invalid capability name"):
        worker.capability("a b")
    with pytest.raises(ValueError, match="at least 1"):
        Worker("w", concurrency=0)


async def test_run_needs_a_capability() -> None:
    with pytest.raises(ValueError, match="no capability"):
        await Worker("empty").run("nats://127.0.0.1:1")


def test_schema_problems_name_the_path() -> None:
    schema = Schema.compile(
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
        where="t",
    )
    assert schema.problem({"a": [1, 2]}) is None
    assert schema.problem({"a": [1, "x"]}) == "$.a[1]: 'x' is not of type 'integer'"


def test_agentdef_catalog_follows_puts_and_deletes() -> None:
    catalog = AgentDefCatalog()
    bucket: dict[str, bytes] = {}
    spec = {"capabilities": [{"name": "c", "input_schema": {"type": "object"}}]}
    bucket["one"] = json.dumps(spec).encode()
    catalog.replace(bucket)
    contract = catalog.get("c")
    assert contract is not None
    assert contract.input is not None
    assert contract.output is None
    assert contract.origin == "AgentDef one"
    manifest = {"kind": "AgentDef", "spec": {"capabilities": [{"name": "d"}]}}
    bucket["two"] = json.dumps(manifest).encode()
    catalog.replace(bucket)
    assert catalog.get("d") is not None
    del bucket["one"]
    catalog.replace(bucket)
    assert catalog.get("c") is None
    bucket["broken"] = b"{not json"
    bad_schema = {"capabilities": [{"name": "e", "input_schema": {"type": 5}}]}
    bucket["three"] = json.dumps(bad_schema).encode()
    catalog.replace(bucket)
    assert catalog.get("e") is None  # ignored with a warning rather than breaking the worker


def test_agentdef_catalog_replaced_by_the_whole_bucket() -> None:
    catalog = AgentDefCatalog()
    one = json.dumps({"capabilities": [{"name": "c", "input_schema": {"type": "object"}}]})
    two = json.dumps({"capabilities": [{"name": "d"}]})
    catalog.replace({"one": one.encode(), "two": two.encode()})
    first = catalog.get("c")
    assert first is not None
    assert catalog.get("d") is not None
    catalog.replace({"one": one.encode()})  # "two" deleted
    assert catalog.get("d") is None
    assert catalog.get("c") is first  # unchanged: not compiled again
    changed = json.dumps({"capabilities": [{"name": "c"}]}).encode()
    catalog.replace({"one": changed})
    contract = catalog.get("c")
    assert contract is not None
    assert contract.input is None
    catalog.replace({})
    assert catalog.get("c") is None


# --- loading workers ----------------------------------------------------------------------

module_worker = Worker("from-module")
NOT_A_WORKER = 42


def make_worker() -> Worker:
    return module_worker


def test_load_worker_by_name_or_module_attribute() -> None:
    from interlock_agents import echo

    assert load_worker("echo") is echo.worker
    assert load_worker(f"{__name__}:module_worker") is module_worker
    assert load_worker(f"{__name__}:make_worker") is module_worker
    with pytest.raises(LookupError, match="known: command, echo, http-fetch"):
        load_worker("nope")
    with pytest.raises(LookupError, match="no attribute"):
        load_worker(f"{__name__}:missing")
    with pytest.raises(LookupError, match="cannot import"):
        load_worker("no_such_module_here:worker")
    with pytest.raises(TypeError, match=r"not an interlock\.sdk\.Worker"):
        load_worker(f"{__name__}:NOT_A_WORKER")


def test_task_request_encoding_follows_the_contract() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    headers, payload = task_request(
        run_id="r1",
        seq=4,
        capability="http.fetch",
        data={"url": "http://x"},
        attempt=2,
        deadline=now + timedelta(seconds=30),
        now=now,
        traceparent="00-aa-bb-01",
    )
    assert headers["Nats-Msg-Id"] == "r1.4.2"
    event = decode_message(headers, payload)
    assert (event.type, event.id, event.source, event.subject) == (
        "io.interlock.task.requested",
        "r1.4",
        "interlock://orchestrator",
        "r1",
    )
    assert event.extensions == {
        "runid": "r1",
        "actionid": "r1.4",
        "capability": "http.fetch",
        "attempt": "2",
        "deadline": "2026-11-30T12:00:30.000Z",
        "traceparent": "00-aa-bb-01",
    }
    request = TaskRequest.from_event(event, "http.fetch")
    assert (request.run_id, request.action_id, request.attempt) == ("r1", "r1.4", 2)
    assert request.deadline == now + timedelta(seconds=30)
    assert request.event.data == {"url": "http://x"}


async def test_settled_waits_for_a_task_without_ever_cancelling_it() -> None:
    """The worker's wait for a handler: done or not within the time given, and neither a
    lapse nor a cancelled wait cancels the handler."""
    release = asyncio.Event()

    async def handler() -> str:
        await release.wait()
        return "done"

    task = asyncio.ensure_future(handler())
    assert await settled(task, 0) is False  # nothing given: not done, still running
    assert not task.done()
    waiting = asyncio.ensure_future(settled(task, None))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not task.cancelled()
    waiting = asyncio.ensure_future(settled(task, None))
    release.set()
    assert await waiting is True
    assert task.result() == "done"
    assert await settled(task, 0) is True  # already done: at once


class _Breaks(Finished):
    def task_started(self, capability: str, action_id: str | None) -> None:
        raise RuntimeError("broken")


def test_worker_observers_isolate_a_failing_observer(caplog: pytest.LogCaptureFixture) -> None:
    """A worker's observers are told through the fan-out the orchestrator's use: one that
    raises is logged and the others are still told, added before or after it."""
    first, broken, last = Finished(), _Breaks(), Finished()
    observers = WorkerObservers([first, broken])
    observers.add(last)
    observers.add(WorkerObserver())
    with caplog.at_level(logging.ERROR, logger="interlock.sdk"):
        observers.task_started("cap", "a1")
    assert "observer _Breaks failed in task_started" in caplog.text
    observers.task_finished("cap", "a1", Outcome.COMPLETED, None, 0.1)
    for observer in (first, broken, last):
        assert observer.events.get_nowait() == ("a1", Outcome.COMPLETED, None)
        assert observer.events.empty()
