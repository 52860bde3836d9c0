"""The task queue's keeper: one message that no agent takes, so the work-queue stream's
last block never drains (interlock.runtime.keeper)."""

from __future__ import annotations

from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StreamConfig
from test_runindex_writes import fast

from interlock.runtime.keeper import TaskQueueKeeper
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.jetstream import jetstream
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.runtime import eventually, running_stack, yaml

__all__ = ["fast"]  # the fixture, shared with test_runindex_writes

ECHOED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: echoed
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {n: 1}
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
    """
)


async def _held(nc: Client, subjects: Subjects, subject: str) -> int:
    """Messages the task requests' stream holds on ``subject`` (a filter)."""
    info = await jetstream(nc).stream_info(subjects.tasks_stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def test_the_orchestrator_keeps_one_keeper_and_the_tasks_drain(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ECHOED]) as stack:
        nc = stack.orchestrator.nc
        for _ in range(3):
            run_id = await stack.client.start("echoed", {})
            assert (await stack.wait(run_id)).status == "completed"
        await eventually(
            lambda: _until_no_tasks(nc, subjects), what="every task acknowledged and removed"
        )
        assert await _held(nc, subjects, subjects.tasks_keeper) == 1
        assert stack.orchestrator.keeper.written >= 1


async def _until_no_tasks(nc: Client, subjects: Subjects) -> bool:
    return await _held(nc, subjects, subjects.capabilities_all) == 0


async def test_written_again_while_tasks_are_dispatched_it_stays_one_message(
    fast: Client, subjects: Subjects
) -> None:
    dispatched = 0

    def count() -> int:
        nonlocal dispatched
        dispatched += 1  # moves at every turn: as if tasks went out all the time
        return dispatched

    keeper = TaskQueueKeeper(fast, subjects, count, every=0.01)
    keeper.start()
    try:
        await eventually(lambda: _at_least(keeper, 4), what="the keeper written again three times")
    finally:
        await keeper.stop()
    assert await _held(fast, subjects, subjects.tasks_keeper) == 1
    assert await _held(fast, subjects, subjects.capabilities_all) == 0


async def _at_least(keeper: TaskQueueKeeper, written: int) -> bool:
    return keeper.written >= written


async def test_with_no_task_dispatched_it_is_written_once(fast: Client, subjects: Subjects) -> None:
    keeper = TaskQueueKeeper(fast, subjects, lambda: 0, every=0.01)
    keeper.start()
    try:
        await eventually(lambda: _turned(keeper, 5), what="five turns of the keeper's loop")
    finally:
        await keeper.stop()
    assert keeper.written == 1
    assert await _held(fast, subjects, subjects.tasks_keeper) == 1


async def _turned(keeper: TaskQueueKeeper, turns: int) -> bool:
    return keeper.turns >= turns


async def test_an_installation_from_before_the_keeper_gets_its_subject(
    nats_url: str, subjects: Subjects
) -> None:
    nc = await connect(ConnectOptions.resolve(nats_url))
    try:
        js = jetstream(nc)
        # The task stream as it was made before: tasks only (and rollups, as a later
        # layout had them for the keeper).
        await js.add_stream(
            StreamConfig(
                name=subjects.tasks_stream,
                subjects=[subjects.capabilities_all],
                retention=RetentionPolicy.WORK_QUEUE,
                duplicate_window=120,
                allow_rollup_hdrs=True,
            )
        )
        await js.publish(subjects.capability("echo"), b"queued before")
        await provision(js, subjects)
        config = (await js.stream_info(subjects.tasks_stream)).config
        assert config.subjects == [subjects.capabilities_all, subjects.tasks_keeper]
        assert not config.allow_rollup_hdrs  # the keeper is purged, not rolled up
        assert await _held(nc, subjects, subjects.capabilities_all) == 1  # the task kept
    finally:
        await nc.close()
