"""Fixtures for the worker SDK tests: provisioned streams, an orchestrator's-eye view of tasks.

``wire.publish_task`` writes a task request header by header as the wire contract states it
(not through the SDK's own encoder), and ``wire.result`` reads answers back from the
RESULTS stream, so the tests check the contract rather than the SDK against itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.sdk import Worker
from interlock.transport.cloudevents import CloudEvent, decode_message
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Wire:
    """The orchestrator's side of the task contract, written out by hand."""

    def __init__(self, nc: Client, js: JetStreamContext, subjects: Subjects) -> None:
        self.nc = nc
        self.js = js
        self.subjects = subjects
        self._queues: dict[str, asyncio.Queue[tuple[CloudEvent, dict[str, str]]]] = {}
        self._sub: Any = None
        self._capability_of: dict[str, str] = {}

    async def start(self) -> None:
        async def collect(msg: Any) -> None:
            event = decode_message(msg.headers, msg.data)
            self._queue(event.subject or "").put_nowait((event, dict(msg.headers or {})))

        # An ordered consumer on the stream: what we read back was stored, not just sent.
        self._sub = await self.js.subscribe(
            self.subjects.results_all, ordered_consumer=True, cb=collect
        )

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    def _queue(self, run_id: str) -> asyncio.Queue[tuple[CloudEvent, dict[str, str]]]:
        return self._queues.setdefault(run_id, asyncio.Queue())

    async def publish_task(
        self,
        capability: str,
        data: Any,
        *,
        run_id: str,
        seq: int = 1,
        attempt: int = 1,
        deadline: datetime | None = None,
        traceparent: str | None = None,
        msg_id: str | None = None,
        at: datetime | None = None,
    ) -> str:
        """Publish a task request as the orchestrator does; returns the action id.

        ``at`` is when the run log requested it (default: now).
        """
        action_id = f"{run_id}.{seq}"
        self._capability_of[action_id] = capability
        headers = {
            "ce-specversion": "1.0",
            "ce-id": action_id,
            "ce-source": "interlock://orchestrator",
            "ce-type": "io.interlock.task.requested",
            "ce-subject": run_id,
            "ce-time": rfc3339(at or datetime.now(UTC)),
            "ce-datacontenttype": "application/json",
            "Content-Type": "application/json",
            "ce-runid": run_id,
            "ce-actionid": action_id,
            "ce-capability": capability,
            "ce-attempt": str(attempt),
            "Nats-Msg-Id": msg_id or f"{action_id}.{attempt}",
        }
        if deadline is not None:
            headers["ce-deadline"] = rfc3339(deadline)
        if traceparent is not None:
            headers["ce-traceparent"] = traceparent
        await self.js.publish(
            self.subjects.capability(capability), json.dumps(data).encode(), headers=headers
        )
        return action_id

    async def cancel(
        self,
        run_id: str,
        action_id: str,
        *,
        attempt: int | None = None,
        at: datetime | None = None,
        capability: str | None = None,
    ) -> None:
        """Publish a cancellation on core NATS, as the orchestrator does (``at``: when
        the run log cancelled the action, default now; ``attempt``: only that one;
        ``capability``: the action's, when no task of it was published here)."""
        headers = {
            "ce-specversion": "1.0",
            "ce-id": f"{action_id}.cancel",
            "ce-source": "interlock://orchestrator",
            "ce-type": "io.interlock.task.cancel",
            "ce-subject": run_id,
            "ce-time": rfc3339(at or datetime.now(UTC)),
            "ce-runid": run_id,
            "ce-actionid": action_id,
        }
        if attempt is not None:
            headers["ce-attempt"] = str(attempt)
        capability = capability or self._capability_of[action_id]
        await self.nc.publish(self.subjects.control(capability, run_id), b"", headers=headers)
        await self.nc.flush()

    async def result(self, run_id: str, wait: float = 30.0) -> tuple[CloudEvent, dict[str, str]]:
        """The next stored result for ``run_id`` (event and raw headers); ``wait`` only
        bounds a hang (a worker starved of CPU on a busy machine takes seconds)."""
        return await asyncio.wait_for(self._queue(run_id).get(), wait)

    def pending_results(self, run_id: str) -> int:
        return self._queue(run_id).qsize()

    async def stored_results(self, run_id: str) -> int:
        """How many result messages the RESULTS stream holds for ``run_id``."""
        subject = self.subjects.result("*", run_id)
        info = await self.js.stream_info(self.subjects.results_stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    async def tasks_left(self) -> int:
        """Task messages still in the work-queue stream (acked ones are removed)."""
        # Tasks only: with an orchestrator up, the stream also holds its keeper
        # (interlock.runtime.keeper).
        info = await self.js.stream_info(
            self.subjects.tasks_stream, subjects_filter=self.subjects.capabilities_all
        )
        return sum((info.state.subjects or {}).values())


@pytest.fixture
async def wire(nc: Client, js: JetStreamContext, subjects: Subjects) -> AsyncIterator[Wire]:
    await provision(js, subjects)
    w = Wire(nc, js, subjects)
    await w.start()
    try:
        yield w
    finally:
        await w.close()


class Runner:
    """Runs workers in the background on the test's connection; stops them at the end."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects
        self._running: list[tuple[Worker, asyncio.Task[None]]] = []

    async def start(self, worker: Worker) -> asyncio.Task[None]:
        task = asyncio.create_task(worker.run(self.nc, prefix=self.subjects.prefix))
        self._running.append((worker, task))
        await worker.wait_ready()
        return task

    async def stop_all(self) -> None:
        for worker, task in self._running:
            await worker.stop(force=True)
            await task


@pytest.fixture
async def runner(nc: Client, subjects: Subjects, wire: Wire) -> AsyncIterator[Runner]:
    r = Runner(nc, subjects)
    try:
        yield r
    finally:
        await r.stop_all()


async def eventually(check: Callable[[], Any], within: float = 30.0) -> None:
    """Poll ``check`` (sync or async) until it is truthy; for server state with no event.
    Bounded against a hang only: a met condition returns at once."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
def poll() -> Callable[..., Any]:
    return eventually
