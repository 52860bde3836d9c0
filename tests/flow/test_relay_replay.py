"""A relay that reads old records again (a crash, a recreated consumer) must not hand out
work that was already done: past the capability stream's dedupe window, a second publish
would be a second task."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import nats
from nats.js.errors import NotFoundError

from interlock.core import events as ev
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.service import Orchestrator
from interlock.runtime.timers import ClockTimers
from interlock.sdk.runner import load_worker
from interlock.transport.subjects import Subjects
from support.flow import WAIT, clock_orchestrator

REPO = Path(__file__).resolve().parents[2]


class Dispatches(OrchestratorObserver):
    def __init__(self) -> None:
        self.actions: list[str] = []

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        self.actions.append(record.data.action_id)


async def test_a_replayed_request_for_an_answered_action_is_not_dispatched(
    nats_url: str, subjects: Subjects
) -> None:
    async with clock_orchestrator(nats_url, subjects) as (client, timers, first):
        sources = [
            (str(p), p.read_text())
            for p in (
                REPO / "examples" / "subworkflow.yaml",
                REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml",
            )
        ]
        assert (await client.apply(sources)).compiled.ok
        worker = load_worker("echo")
        task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
        nc = await nats.connect(nats_url)
        try:
            run_id = await client.start("greet-child", {"name": "ada"})
            assert (await client.wait(run_id, WAIT)).status == "completed"
            seen = Dispatches()
            first.observers.add(seen)
            # Much later, the relay starts over from the first record.
            timers.clock.advance_to(timers.clock.moment + timedelta(seconds=300))
            js = nc.jetstream()
            await js.delete_consumer(subjects.runs_stream, "relay")
            second = Orchestrator(
                nc, subjects, clock=timers.clock, timers=ClockTimers(timers.clock), observers=[seen]
            )
            await second.start()
            try:
                for _ in range(600):
                    await asyncio.sleep(0.05)
                    try:
                        info = await js.consumer_info(subjects.runs_stream, "relay")
                    except NotFoundError:  # the new relay has not made its consumer yet
                        continue
                    caught_up = info.num_pending == 0 and info.num_ack_pending == 0
                    if info.delivered.stream_seq and caught_up:
                        break
                assert info.num_pending == 0
                assert info.num_ack_pending == 0
                assert seen.actions == []
            finally:
                await second.stop()
        finally:
            await worker.stop(force=True)
            await asyncio.wait_for(task, 10)
            await nc.close()
