"""Pausing a workflow on a real nats-server, through the CLI as an operator types it: its
new runs (started by hand or by a trigger) wait, recorded as queued; resumed, they go on in
order; nothing is lost when the workflow is resumed while no orchestrator runs."""

from __future__ import annotations

import asyncio
import re

from interlock.client.queues import list_queues
from interlock.core import events as ev
from interlock.runtime.service import Orchestrator
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.concurrency import timeline
from support.runtime import (
    HELLO,
    TIMEOUT,
    cli,
    cli_env,
    connect,
    eventually,
    run_cli,
    running_stack,
)


def kinds(records: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in records]


async def test_a_paused_workflow_holds_its_new_runs_until_resumed(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [HELLO]) as stack:
        client = stack.client
        before = await client.start("hello", {"message": "before"})
        assert (await stack.wait(before)).status == "completed"
        said = await cli(nats_url, subjects, "pause", "workflow", "hello", "--reason", "vendor")
        assert "paused default/hello" in said

        async def seen_paused() -> bool:
            return stack.orchestrator.flow.admission.pauses.holds("default", "hello")

        await eventually(seen_paused, what="the orchestrator sees the pause")
        held = [await client.start("hello", {"message": f"m{n}"}) for n in range(3)]
        event = CloudEvent(
            id="greet-1",
            source="/test",
            type="com.example.greet",
            data={"lang": "en", "message": "t"},
        )
        await client.emit(event)

        async def all_waiting() -> list[str] | None:
            found = await list_queues(client)
            if found and found[0].queued == 4:
                return [q.limit for q in found]
            return None

        assert await eventually(all_waiting, what="four runs waiting") == ["default/hello@paused"]
        for run_id in held:
            assert kinds(await stack.records(run_id)) == ["run.started", "run.queued"]
        shown = await cli(nats_url, subjects, "queues", "--workflow", "hello")
        assert shown.splitlines()[1].split()[:4] == ["default/hello@paused", "paused", "0/0", "4"]
        assert stack.recorder.handled == [("echo", f"{before}:3", 1)]
        described = await cli(nats_url, subjects, "describe", "run", held[1])
        assert "queued       until default/hello is resumed (2nd in line)" in described
        logged = await cli(nats_url, subjects, "logs", held[1])
        assert "run queued       until default/hello is resumed" in logged, logged
        # Why it waits, where explain said "waiting in state ;" and nothing more.
        explained = await cli(nats_url, subjects, "explain", held[1])
        assert explained.endswith(
            "\nwaiting before its first state; it moves on:\n"
            "  its admission: #2 run.queued until default/hello is resumed "
            f"(interlock describe run {held[1]} shows where it stands)\n"
        ), explained

        said = await cli(nats_url, subjects, "resume", "workflow", "hello")
        assert "resumed default/hello" in said
        for run_id in held:
            assert (await stack.wait(run_id)).status == "completed"
        seen = await timeline(client.nc, subjects)
        assert [r for r in seen.admitted if r in held] == held
        logged = await cli(nats_url, subjects, "logs", held[1])
        assert "io.interlock" not in logged, logged
        assert "run admitted" in logged, logged
        explained = await cli(nats_url, subjects, "explain", held[1])
        assert "does not reproduce" not in explained, explained
        # Its workflow's pause is no slot: the admission says the workflow was resumed.
        assert "=> no transition: admitted: it enters its state" in explained
        assert "run.admitted: default/hello resumed (after " in explained
        # How long it waited, from its run.queued to its run.admitted.
        assert re.search(r"#\d+ +run\.admitted: .*\(after \d+\.\ds in line\)\n", explained), (
            explained
        )
        assert await list_queues(client) == []
        again = await cli(nats_url, subjects, "resume", "workflow", "hello")
        assert "was not paused" in again
        missing = await asyncio.to_thread(
            run_cli, "pause", "workflow", "nope", env=cli_env(nats_url, subjects.prefix)
        )
        assert missing.returncode == 1
        assert "nope" in missing.stderr


async def test_runs_held_while_no_orchestrator_ran_go_on_when_one_starts(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [HELLO]) as stack:
        client = stack.client
        await cli(nats_url, subjects, "pause", "workflow", "hello")
        await eventually(lambda: _holds(stack.orchestrator), what="the orchestrator sees the pause")
        held = [await client.start("hello", {"message": f"m{n}"}) for n in range(2)]

        async def waiting() -> bool:
            found = await list_queues(client)
            return bool(found) and found[0].queued == 2

        await eventually(waiting, what="both runs waiting")
        await stack.orchestrator.stop()
        await cli(nats_url, subjects, "resume", "workflow", "hello")
        # Resumed, though no orchestrator has taken them on yet: describe says so.
        described = await cli(nats_url, subjects, "describe", "run", held[0])
        assert "queued       default/hello is resumed: it goes on in turn" in described
        nc = await connect(nats_url)
        later = Orchestrator(nc, subjects)
        await later.start()
        try:
            for run_id in held:
                assert (await client.wait(run_id, TIMEOUT)).status == "completed"
        finally:
            await later.stop()
            await nc.close()


async def _holds(orchestrator: Orchestrator) -> bool:
    return orchestrator.flow.admission.pauses.holds("default", "hello")


LIMITED = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: limited}
spec:
  concurrency:
    - {key: '"k"', limit: 3}
  initial_state: hold
  states:
    hold:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""


async def test_describe_says_only_the_pause_holds_a_run_of_a_paused_workflow(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [LIMITED], worker=False) as stack:
        await cli(nats_url, subjects, "pause", "workflow", "limited")

        async def seen_paused() -> bool:
            return stack.orchestrator.flow.admission.pauses.holds("default", "limited")

        await eventually(seen_paused, what="the orchestrator sees the pause")
        run_id = await stack.client.start("limited", {})

        async def queued() -> bool:
            return any(isinstance(r, ev.RunQueued) for r in await stack.records(run_id))

        await eventually(queued, what="the run queued")
        described = await cli(nats_url, subjects, "describe", "run", run_id)
        assert "queued       until default/limited is resumed" in described, described
        assert "slot" not in described, described
        await cli(nats_url, subjects, "resume", "workflow", "limited")

        async def admitted() -> bool:
            return any(isinstance(r, ev.RunAdmitted) for r in await stack.records(run_id))

        await eventually(admitted, what="the run admitted once its workflow is resumed")
        described = await cli(nats_url, subjects, "describe", "run", run_id)
        assert "slot         holds a slot for key k under default/limited" in described, described
