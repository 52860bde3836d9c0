"""Pausing one run, and a workflow with its runs, on a real nats-server through the CLI as
an operator types it: a paused run takes no transition; the answer and the event that
reach it are held in its log and decided on, in order, when it is resumed, even across a
SIGKILL of the orchestrator; nothing is dispatched twice or lost."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.transport.subjects import Subjects
from support.concurrency import GATE_AGENT, Gates, gate_worker
from support.runtime import cli, client_for, eventually, serve, started, yaml

TWO_STEPS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: twosteps
    spec:
      inputs:
        n: {type: integer, required: true}
      initial_state: first
      states:
        first:
          actions:
            - capability: gate
              input: {n: "{{ inputs.n }}"}
          on: [{event: task.completed, goto: wait}]
        wait:
          on: [{event: com.example.go, goto: done}]
        done: {type: terminal}
    """
)


ONE_STEP = TWO_STEPS.replace(
    "goto: wait}]\n    wait:\n      on: [{event: com.example.go, goto: done}]", "goto: done}]"
)


def kinds(records: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in records]


async def test_a_paused_run_holds_what_reaches_it_across_a_crash(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    first = serve(nats_url, subjects.prefix)
    second = None
    try:
        async with client_for(nats_url, subjects) as client, gate_worker(nats_url, subjects, gates):
            assert (await client.apply([("a", GATE_AGENT), ("w", TWO_STEPS)])).compiled.ok
            await started(first)
            run_id = await client.start("twosteps", {"n": 1})

            async def at_work() -> bool:
                return gates.started == [1]

            await eventually(at_work, what="the run's action at work")
            said = await cli(nats_url, subjects, "pause", "run", run_id, "--reason", "vendor")
            assert f"paused run {run_id}" in said
            again = await cli(nats_url, subjects, "pause", "run", run_id)
            assert f"run {run_id} is paused already (since " in again
            gates.gate(1).set()  # the answer comes while it is paused

            async def held() -> bool:
                return "event.held" in kinds(await client.read(run_id))

            await eventually(held, what="the answer held")
            # The event it will wait for once resumed is sent and held too.
            told = await cli(nats_url, subjects, "signal", run_id, "com.example.go")
            assert "held by paused run" in told
            # One it would not take, even resumed, is not sent.
            await cli(nats_url, subjects, "signal", run_id, "com.example.nope", code=1)
            records = await client.read(run_id)
            assert kinds(records)[-3:] == ["run.paused", "event.held", "event.held"]
            assert (await client.state(run_id)).state == "first"

            async def listed() -> str | None:
                shown = await cli(nats_url, subjects, "runs")
                return shown if "running (paused)" in shown else None

            assert run_id in await eventually(listed, what="the list shows it paused")
            described = await cli(nats_url, subjects, "describe", "run", run_id)
            assert "paused       since " in described
            assert ": vendor" in described
            assert f"2 event(s) held until 'interlock resume run {run_id}'" in described

            first.kill()  # SIGKILL while it is paused: what it holds is in its log
            second = serve(nats_url, subjects.prefix)
            await started(second)
            said = await cli(nats_url, subjects, "resume", "run", run_id)
            assert f"resumed run {run_id}" in said
            assert (await client.wait(run_id, 30)).status == "completed"
            after = kinds(await client.read(run_id))
            resumed = after.index("run.resumed")
            assert after[resumed + 1 : resumed + 3] == ["action.completed", "transition.fired"]
            assert after.count("event.received") == 1
            assert after.count("action.requested") == 1
            assert gates.started == [1]  # dispatched once
            # Explained by its own version: the pause, what it held, the resume.
            explained = await cli(nats_url, subjects, "explain", run_id)
            assert "does not reproduce" not in explained, explained
            assert "resume in first" in explained, explained
            assert "was not paused" in await cli(nats_url, subjects, "resume", "run", run_id)
            ended = await cli(nats_url, subjects, "pause", "run", run_id)
            assert f"run {run_id} was not paused: it has ended (completed)" in ended
            missing = await cli(nats_url, subjects, "pause", "run", "nope", code=4)
            assert missing == ""
    finally:
        first.kill()
        if second is not None:
            second.kill()


async def test_pausing_a_workflow_with_its_runs_holds_them_until_it_is_resumed(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    first = serve(nats_url, subjects.prefix)
    try:
        async with client_for(nats_url, subjects) as client, gate_worker(nats_url, subjects, gates):
            assert (await client.apply([("a", GATE_AGENT), ("w", ONE_STEP)])).compiled.ok
            await started(first)
            running = [await client.start("twosteps", {"n": n}) for n in (1, 2)]
            alone = await client.start("twosteps", {"n": 4})

            async def all_at_work() -> bool:
                listed = await client.list_runs(workflow="twosteps", status="running")
                return sorted(gates.started) == [1, 2, 4] and len(listed) == 3

            await eventually(all_at_work, what="the runs at work and listed")
            await cli(nats_url, subjects, "pause", "run", alone)
            said = await cli(nats_url, subjects, "pause", "workflow", "twosteps", "--runs")
            assert "paused 2 run(s) in flight with it" in said
            later = await client.start("twosteps", {"n": 3})  # new: waits for the workflow
            for n in (1, 2):
                gates.gate(n).set()

            async def answers_held() -> bool:
                logs = [kinds(await client.read(r)) for r in running]
                return all("event.held" in k for k in logs)

            await eventually(answers_held, what="both answers held")
            for run_id in running:
                assert (await client.state(run_id)).paused.workflow  # type: ignore[union-attr]
            # Paused with its workflow: describe names what resumes it.
            described = await cli(nats_url, subjects, "describe", "run", running[0])
            assert "held until 'interlock resume workflow default/twosteps'" in described
            assert kinds(await client.read(later))[-1] == "run.queued"
            # A run paused on its own stays paused when the workflow is resumed.
            said = await cli(nats_url, subjects, "resume", "workflow", "twosteps")
            assert "resumed 2 run(s) paused with it" in said
            pause = (await client.state(alone)).paused
            assert pause is not None
            assert not pause.workflow
            gates.gate(3).set()
            for run_id in [*running, later]:
                assert (await client.wait(run_id, 30)).status == "completed"
            assert (await client.state(alone)).paused is not None
    finally:
        first.kill()
