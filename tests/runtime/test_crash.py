"""Processes killed at the worst moment: nothing acknowledged is lost, nothing happens twice.

The orchestrator runs as ``interlock serve`` in a child process and is killed with SIGKILL
while runs are in flight; an agent worker is killed in the middle of a task.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.sdk import TaskContext, Worker
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.runtime import (
    REPO,
    TEST_AGENT,
    TIMEOUT,
    Background,
    Recorder,
    cli_env,
    client_for,
    connect,
    eventually,
    interlock_bg,
    make_worker,
    running_stack,
    serve,
    started,
    yaml,
)

CHAIN = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: chain
    spec:
      inputs:
        n: {type: integer, required: true}
        gated: {type: boolean, default: false}
      triggers:
        - event: com.example.chain
      initial_state: one
      states:
        one:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", gated: "{{ inputs.gated }}", step: 1}
          on:
            - {event: task.completed, goto: two}
        two:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 2}
          on:
            - {event: task.completed, goto: three}
        three:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 3}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            n: "$.states.three.output.n"
    """
)


def gated_worker(handled: list[str], gate: asyncio.Event) -> Worker:
    """``echo``, recording each task's action id; ``gated`` tasks wait for the gate."""
    worker = Worker("crashagent", concurrency=64, grace_period=1.0)

    @worker.capability("echo")
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        handled.append(ctx.action_id)
        if inp.get("gated"):
            await gate.wait()
        return inp

    return worker


async def test_killing_the_orchestrator_mid_way_loses_and_repeats_nothing(
    nats_url: str, subjects: Subjects
) -> None:
    handled: list[str] = []
    gate = asyncio.Event()
    worker = gated_worker(handled, gate)
    orchestrator: Background | None = None
    async with client_for(nats_url, subjects) as client:
        applied = await client.apply([("agent", TEST_AGENT), ("chain", CHAIN)])
        assert applied.compiled.ok
        worker_nc = await connect(nats_url)
        worker_task = asyncio.create_task(worker.run(worker_nc, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            orchestrator = serve(nats_url, subjects.prefix)
            await started(orchestrator)

            # 10 runs go straight through; 20 wait at the agent until the crash.
            run_ids = [await client.start("chain", {"n": n, "gated": n >= 10}) for n in range(30)]
            waits = {asyncio.create_task(client.wait(r, 60)): r for r in run_ids}
            done: set[asyncio.Task[Any]] = set()
            while len(done) < 3:
                finished, _ = await asyncio.wait(
                    set(waits) - done, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED
                )
                assert finished, "no run completed before the crash"
                done |= finished
            gate.set()  # a burst of answers while the orchestrator dies
            orchestrator.kill()
            completed_before = sum(t.done() for t in waits)
            assert 0 < completed_before < len(run_ids)

            # While no orchestrator runs: runs started by hand, runs triggered by events.
            more = [await client.start("chain", {"n": n}) for n in range(30, 35)]
            definition, _ = await client.registry.latest("chain")
            for n in range(35, 40):
                event = CloudEvent(
                    id=f"chain-{n}",
                    source="/crash-test",
                    type="com.example.chain",
                    datacontenttype="application/json",
                    data={"n": n},
                )
                await client.emit(event)
                more.append(derive_run_id(definition, event.source, event.id))
            waits.update({asyncio.create_task(client.wait(r, 60)): r for r in more})
            run_ids += more

            orchestrator = serve(nats_url, subjects.prefix)
            await started(orchestrator)
            restart = time.monotonic()
            _, stuck = await asyncio.wait(waits, timeout=30)
            if stuck:
                report = [await _summary(client, waits[t]) for t in stuck]
                pytest.fail(f"{len(stuck)} runs did not finish: {report[:5]}")
            states = [t.result() for t in waits]
            recovery = time.monotonic() - restart

            assert sorted((s.outputs or {})["n"] for s in states) == list(range(40))
            for run_id in run_ids:
                kinds = Counter(ev.record_type(r) for r in await client.read(run_id))
                assert kinds[ev.PREFIX + "run.started"] == 1, run_id
                assert kinds[ev.PREFIX + "action.requested"] == 3, run_id
                assert kinds[ev.PREFIX + "action.completed"] == 3, run_id
                assert kinds[ev.PREFIX + "run.completed"] == 1, run_id
            # Every action was handed to the agent exactly once.
            per_action = Counter(handled)
            assert len(per_action) == 120
            assert set(per_action.values()) == {1}, per_action.most_common(3)
            # What the killed process held came back after its 2 s ack wait, not a task's
            # 30 s: a bound far above the 1-5 s this takes from the restarted process's
            # start (its imports not counted), on a quiet machine or with a seventh of a core.
            assert recovery < 20, f"recovery took {recovery:.1f}s"

            # The run index has caught up with every log, whatever came twice.
            async def indexed() -> bool:
                runs = await client.list_runs(workflow="chain")
                return sorted(r["run_id"] for r in runs if r["status"] == "completed") == sorted(
                    run_ids
                )

            await eventually(indexed, what="the run index shows every run completed")
            assert orchestrator.stop() == 0, orchestrator.output
        finally:
            if orchestrator is not None:
                orchestrator.kill()
            await worker.stop(force=True)
            await worker_task
            await worker_nc.close()


async def _summary(client: InterlockClient, run_id: str) -> str:
    records = await client.read(run_id)
    tail = [ev.record_type(r).removeprefix(ev.PREFIX) for r in records[-3:]]
    return f"{run_id}: {len(records)} records, last {tail}"


async def test_a_workflow_applied_just_before_an_event_is_triggered_by_it(
    nats_url: str, subjects: Subjects
) -> None:
    # The orchestrator learns applied workflows asynchronously; apply-then-emit must still
    # start the run. Separate processes, as a deployment and a script that drives it.
    orchestrator = serve(nats_url, subjects.prefix)
    try:
        async with client_for(nats_url, subjects) as client:
            await started(orchestrator)
            assert (await client.apply([("agent", TEST_AGENT)])).compiled.ok
            for attempt in range(40):
                kind = f"com.example.late{attempt}"
                wf = CHAIN.replace("name: chain", f"name: late{attempt}").replace(
                    "com.example.chain", kind
                )
                assert (await client.apply([("late", wf)])).compiled.ok
                event = CloudEvent(id=f"e{attempt}", source="/late", type=kind, data={"n": attempt})
                await client.emit(event)
                definition, _ = await client.registry.latest(f"late{attempt}")
                run_id = derive_run_id(definition, event.source, event.id)
                # No agent runs: the first record is all that is awaited.
                first = await asyncio.wait_for(anext(aiter(client.follow(run_id))), TIMEOUT)
                assert isinstance(first, ev.RunStarted)
    finally:
        assert orchestrator.stop() == 0, orchestrator.output


SLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: slow
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: slow
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


async def test_a_task_of_a_killed_worker_goes_to_another_worker(
    nats_url: str, subjects: Subjects
) -> None:
    env = cli_env(nats_url, subjects.prefix, PYTHONPATH=str(REPO / "tests"))
    async with running_stack(nats_url, subjects, [SLOW], worker=False, task_ack_wait=2.0) as stack:
        doomed = interlock_bg(
            "agent", "run", "support.runtime:slow_worker", "--metrics-port", "0", env=env
        )
        try:
            await doomed.await_line("serving slow")
            run_id = await stack.client.start("slow", {})
            found = await doomed.await_line(r"STARTED (\S+) delivery=1")
            action_id = found.group(1)
            doomed.kill()
        finally:
            doomed.kill()

        recorder = Recorder()
        recorder.release.set()
        rescuer = make_worker(recorder)
        nc = await connect(nats_url)
        task = asyncio.create_task(rescuer.run(nc, prefix=subjects.prefix))
        try:
            state = await stack.wait(run_id)
        finally:
            await rescuer.stop(force=True)
            await task
            await nc.close()

        assert state.status == "completed"
        # Redelivered (second delivery) to the other worker, and handled there once.
        assert recorder.handled == [("slow", action_id, 2)]
        kinds = Counter(ev.record_type(r) for r in await stack.records(run_id))
        assert kinds[ev.PREFIX + "action.requested"] == 1
        assert kinds[ev.PREFIX + "action.completed"] == 1
        assert kinds[ev.PREFIX + "run.completed"] == 1


pytestmark = pytest.mark.timeout(120)
