"""One task's way through the worker, against a real nats-server: read in the read loop
that delivered it, in a context of its own; progress acks from one timer per consumer;
the queue-wait metric observed once the task is answered."""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from interlock.sdk import Outcome, Worker, WorkerObserver
from interlock.sdk.metrics import PrometheusObserver
from interlock.transport.tasks import consumer_name

current: contextvars.ContextVar[str] = contextvars.ContextVar("current")


def new_run() -> str:
    return f"run{uuid.uuid4().hex[:10]}"


class Contexts(WorkerObserver):
    """What each task's calls see of a context variable set when it is received."""

    def __init__(self) -> None:
        self.before: list[str | None] = []
        self.finished: dict[str, str | None] = {}

    def task_received(self, capability: str, event: Any, headers: Any) -> None:
        self.before.append(current.get(None))
        current.set(event.id)

    def task_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        self.finished[action_id or ""] = current.get(None)


async def test_tasks_delivered_together_each_have_a_context_of_their_own(
    wire, runner, poll
) -> None:
    """Tasks are read in the read loop that delivers them, several in one read: each in a
    context of its own, which its handler and its observers share and no other sees."""
    observer = Contexts()
    worker = Worker("contexts", concurrency=8, observers=[observer])

    @worker.capability("see")
    async def see(inp: dict[str, Any]) -> dict[str, Any]:
        seen = current.get(None)
        await asyncio.sleep(0)  # the others run meanwhile
        return {"seen": seen, "still": current.get(None)}

    runs = [new_run() for _ in range(6)]
    # Published before the worker starts: its first pull request brings them together.
    actions = [await wire.publish_task("see", {}, run_id=run_id) for run_id in runs]
    await runner.start(worker)
    for run_id, action in zip(runs, actions, strict=True):
        assert (await wire.result(run_id))[0].data == {"seen": action, "still": action}
    await poll(lambda: len(observer.finished) == len(actions))
    assert observer.before == [None] * len(actions)
    assert observer.finished == {action: action for action in actions}


# serial: a progress ack every 0.13 s keeps a task past its 0.4 s ack wait; a process
# stalled 0.3 s by another busy one on a 2-core machine lets JetStream redeliver it.
@pytest.mark.serial
async def test_progress_acks_keep_tasks_of_different_ages_and_forget_settled_ones(
    wire, runner
) -> None:
    """Long tasks started at different times, quick ones settled between them: none is
    redelivered (their progress acks come from one timer per consumer), and once every
    task is settled the worker holds nothing for progress acks."""
    worker = Worker("ages", concurrency=4, ack_wait=0.4)
    started = asyncio.Event()

    @worker.capability("long")
    async def long(inp: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(1.0)  # the work itself: more than twice the ack wait
        return {"long": inp["n"]}

    @worker.capability("quick")
    async def quick(inp: dict[str, Any]) -> dict[str, Any]:
        return {"quick": inp["n"]}

    await runner.start(worker)
    first, second = new_run(), new_run()
    await wire.publish_task("long", {"n": 1}, run_id=first)
    await started.wait()
    for n in range(3):
        run_id = new_run()
        await wire.publish_task("quick", {"n": n}, run_id=run_id)
        assert (await wire.result(run_id))[0].data == {"quick": n}
    await wire.publish_task("long", {"n": 2}, run_id=second)
    assert (await wire.result(first))[0].data == {"long": 1}
    assert (await wire.result(second))[0].data == {"long": 2}
    info = await wire.js.consumer_info(wire.subjects.tasks_stream, consumer_name("long"))
    assert (info.delivered.consumer_seq, info.num_redelivered) == (2, 0), info
    assert await wire.stored_results(first) == 1
    assert await wire.stored_results(second) == 1
    assert [len(progress) for progress in worker._serving.progress] == [0, 0]


async def test_queue_wait_is_observed_once_the_task_is_answered(wire, runner, poll) -> None:
    """The time a task waited in the queue (from its request's time to the worker taking
    it) is noted when it arrives and observed when it is settled, in the same context."""
    name = f"waits-{uuid.uuid4().hex[:6]}"
    worker = Worker(name, observers=[PrometheusObserver(name)])

    @worker.capability("wait")
    async def wait(inp: dict[str, Any]) -> dict[str, Any]:
        return {}

    labels = {"worker": name, "capability": "wait"}

    def observed(what: str) -> float | None:
        return REGISTRY.get_sample_value(f"interlock_agent_queue_wait_seconds_{what}", labels)

    await runner.start(worker)
    run_id = new_run()
    requested = datetime.now(UTC) - timedelta(seconds=100)
    await wire.publish_task("wait", {}, run_id=run_id, at=requested)
    await wire.result(run_id)
    await poll(lambda: observed("count") == 1)
    waited = observed("sum")
    assert waited is not None
    assert 100 <= waited < 100 + 60
