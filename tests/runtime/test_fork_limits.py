"""A fork is a new run in flight: under its workflow's concurrency limits it takes its slot
as a run started now does, queued while the limit is full and admitted, into the state it
was forked in, when a slot frees."""

from __future__ import annotations

from interlock.client.queues import list_queues
from interlock.core import events as ev
from interlock.transport.subjects import Subjects
from support.concurrency import ONE_SLOT
from support.runtime import cli, eventually, running_stack


async def test_a_fork_waits_for_a_slot_of_its_workflows_limit_as_a_start_does(
    nats_url: str, subjects: Subjects
) -> None:

    async with running_stack(nats_url, subjects, [ONE_SLOT], worker=False) as stack:

        async def kinds(run_id: str) -> list[type]:
            return [type(r) for r in await stack.records(run_id)]

        await cli(nats_url, subjects, "start", "one", "--run-id", "one-3")

        async def admitted() -> bool:
            return ev.StateEntered in await kinds("one-3")

        await eventually(admitted, what="one-3 admitted, in its state")
        at = len(await stack.records("one-3"))
        await cli(nats_url, subjects, "fork", "one-3", "--at", str(at), "--run-id", "one-fork")

        async def fork_queued() -> bool:
            found = await list_queues(stack.client)
            return bool(found) and (found[0].running, found[0].queued) == (1, 1)

        await eventually(fork_queued, what="the fork queued behind one-3")
        forked = await stack.records("one-fork")
        assert isinstance(forked[-1], ev.RunQueued), forked[-1]
        assert (await stack.client.state("one-fork")).state == ""
        shown = await cli(nats_url, subjects, "queues")
        assert "1/1" in shown, shown
        described = await cli(nats_url, subjects, "describe", "run", "one-fork")
        assert "queued       1st for key k under default/one" in described, described
        # A third run waits behind the fork, in order.
        await cli(nats_url, subjects, "start", "one", "--run-id", "one-4")
        await cli(nats_url, subjects, "signal", "one-3", "go")
        assert (await stack.wait("one-3")).status == "completed"

        async def fork_in_its_state() -> bool:
            return (await stack.client.state("one-fork")).state == "wait"

        await eventually(fork_in_its_state, what="the fork admitted into its state")
        assert ev.StateEntered not in await kinds("one-4")
        await cli(nats_url, subjects, "signal", "one-fork", "go")
        assert (await stack.wait("one-fork")).status == "completed"

        async def third_in() -> bool:
            return (await stack.client.state("one-4")).state == "wait"

        await eventually(third_in, what="the third run admitted once the fork ended")
        # A fork while the workflow is paused waits for its resumption, then for its slot.
        await cli(nats_url, subjects, "pause", "workflow", "one")

        async def seen_paused() -> bool:
            return stack.orchestrator.flow.admission.pauses.holds("default", "one")

        await eventually(seen_paused, what="the orchestrator sees the pause")
        await cli(nats_url, subjects, "fork", "one-3", "--at", str(at), "--run-id", "one-fork2")
        await eventually(
            lambda: _queued(stack, "one-fork2"), what="the second fork queued behind the pause"
        )
        described = await cli(nats_url, subjects, "describe", "run", "one-fork2")
        assert "queued       until default/one is resumed" in described, described
        await cli(nats_url, subjects, "resume", "workflow", "one")
        await cli(nats_url, subjects, "signal", "one-4", "go")
        assert (await stack.wait("one-4")).status == "completed"

        async def second_fork_in() -> bool:
            return (await stack.client.state("one-fork2")).state == "wait"

        await eventually(second_fork_in, what="the second fork admitted into its state")


async def _queued(stack: object, run_id: str) -> bool:
    try:
        records = await stack.records(run_id)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001  (not written yet)
        return False
    return bool(records) and isinstance(records[-1], ev.RunQueued)
