"""Answers by request: the worker sends its answer to the orchestrator's answer subject
first and acknowledges its task on a reply ``recorded`` or ``refused``; with no reply in
time, a reply ``failed`` or no responders at all, it publishes the same answer to the
results stream instead (every other test of the worker runs with no responder, so that
path is theirs too). The orchestrator's end is a responder written from the contract, on
the real server."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.sdk import Outcome, Worker
from interlock.transport.cloudevents import CloudEvent, decode_message
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import (
    ANSWER_FAILED,
    ANSWER_HEADER,
    ANSWER_REASON_HEADER,
    ANSWER_RECORDED,
    ANSWER_REFUSED,
)
from support.sdk import Finished

pytestmark = pytest.mark.timeout(60)


class Desk:
    """Takes answer requests and replies ``said`` (None: never replies)."""

    def __init__(self, nc: Client, subjects: Subjects, said: str | None) -> None:
        self.nc = nc
        self.subjects = subjects
        self.said = said
        self.got: asyncio.Queue[tuple[str, CloudEvent]] = asyncio.Queue()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.subjects.answers_all, cb=self._on)

    async def close(self) -> None:
        await self._sub.unsubscribe()

    async def _on(self, msg: Msg) -> None:
        self.got.put_nowait((msg.subject, decode_message(msg.headers, msg.data)))
        if self.said is None:
            return
        headers = {ANSWER_HEADER: self.said}
        if self.said == ANSWER_REFUSED:
            headers[ANSWER_REASON_HEADER] = "answer-token"
        await self.nc.publish(msg.reply, b"", headers=headers)

    async def next(self) -> tuple[str, CloudEvent]:
        return await asyncio.wait_for(self.got.get(), 5)


def quick_worker(**options: Any) -> tuple[Worker, Finished]:
    finished = Finished()
    worker = Worker("quick", observers=[finished], **options)

    @worker.capability("quick")
    async def quick(inp: dict[str, Any]) -> dict[str, Any]:
        return {"seen": inp["n"]}

    return worker, finished


def new_run() -> str:
    return f"run{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("said", [ANSWER_RECORDED, ANSWER_REFUSED])
async def test_a_reply_settles_the_answer_and_the_stream_stores_nothing(
    wire: Any, runner: Any, poll: Any, nc: Client, subjects: Subjects, said: str
) -> None:
    desk = Desk(nc, subjects, said)
    await desk.start()
    worker, finished = quick_worker()
    await runner.start(worker)
    run_id = new_run()
    action = await wire.publish_task("quick", {"n": 1}, run_id=run_id)
    subject, event = await desk.next()
    assert subject == subjects.answer("quick", run_id)
    assert event.type == "task.completed"
    assert event.data == {"seen": 1}
    assert event.extensions["actionid"] == action
    assert event.extensions["attempt"] == "1"
    assert (await finished.next())[1] == Outcome.COMPLETED

    async def acked() -> bool:
        return await wire.tasks_left() == 0

    await poll(acked)
    assert await wire.stored_results(run_id) == 0
    await desk.close()


@pytest.mark.parametrize("said", [None, ANSWER_FAILED], ids=["no-reply", "failed"])
async def test_without_a_reply_that_settles_it_the_answer_goes_to_the_stream(
    wire: Any, runner: Any, poll: Any, nc: Client, subjects: Subjects, said: str | None
) -> None:
    desk = Desk(nc, subjects, said)
    await desk.start()
    # A short wait only where no reply comes: a "failed" reply later than 0.3 s (a loaded
    # machine) would be a timeout, after which the worker stops asking.
    worker, finished = quick_worker(**({"answer_timeout": 0.3} if said is None else {}))
    await runner.start(worker)
    run_id = new_run()
    await wire.publish_task("quick", {"n": 2}, run_id=run_id)
    subject, asked = await desk.next()
    assert subject == subjects.answer("quick", run_id)
    stored, _ = await wire.result(run_id)
    assert stored.id == asked.id
    assert stored.data == {"seen": 2}
    assert (await finished.next())[1] == Outcome.COMPLETED

    async def acked() -> bool:
        return await wire.tasks_left() == 0

    await poll(acked)
    # After a request that timed out, the next answers go straight to the stream.
    later = new_run()
    await wire.publish_task("quick", {"n": 3}, run_id=later)
    again, _ = await wire.result(later)
    assert again.data == {"seen": 3}
    # (A reply "failed" is no reason to stop asking.)
    assert desk.got.qsize() == (0 if said is None else 1)
    await desk.close()
