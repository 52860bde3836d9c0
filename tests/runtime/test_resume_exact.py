"""Resuming a workflow paused with its runs resumes every run paused with it, those the run
list (written behind the runs) does not show yet included."""

from __future__ import annotations

import json

from interlock.core import events as ev
from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, cli, connect, eventually, running_stack

TWO_WAITS = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: two-waits}
spec:
  initial_state: first
  states:
    first:
      actions: [{capability: echo, input: {message: unanswered}}]
      on: [{event: go, goto: second}]
    second:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""


async def test_a_run_paused_at_its_next_step_and_not_listed_is_resumed_with_its_workflow(
    nats_url: str, subjects: Subjects
) -> None:

    # The run index is written long after a run that waits for an agent (as a busy
    # installation's lags): the run list does not show it, its own log says where it is.
    async with running_stack(nats_url, subjects, [TWO_WAITS], worker=False, index_hold=60) as st:
        run_id = await st.client.start("two-waits", {})
        await eventually(lambda: _has(st, run_id, ev.RunStarted), what="the run started")
        assert run_id not in await cli(nats_url, subjects, "runs", "--workflow", "two-waits")
        said = await cli(nats_url, subjects, "pause", "workflow", "two-waits", "--runs")
        assert run_id not in said, said  # not listed: paused at its next step instead

        async def seen() -> bool:
            return st.orchestrator.flow.admission.pauses.holds("default", "two-waits")

        await eventually(seen, what="the orchestrator sees the pause")
        await cli(nats_url, subjects, "signal", run_id, "go")
        await eventually(lambda: _has(st, run_id, ev.EventHeld), what="the run paused, go held")
        said = await cli(nats_url, subjects, "resume", "workflow", "two-waits", "--json")
        assert json.loads(said) == {"workflow": "default/two-waits", "resumed": True, "runs": []}
        # Resumed all the same, and what it held decided on: it waits in its second state.
        await eventually(lambda: _has(st, run_id, ev.RunResumed), what="the run resumed")
        assert (await st.client.state(run_id)).state == "second"
        described = await cli(nats_url, subjects, "describe", "run", run_id)
        assert "paused" not in described, described
        await cli(nats_url, subjects, "signal", run_id, "go")
        assert (await st.wait(run_id)).status == "completed"


async def _has(stack: object, run_id: str, kind: type) -> bool:
    records = await stack.records(run_id)  # type: ignore[attr-defined]
    return any(isinstance(r, kind) for r in records)


async def test_a_run_paused_with_its_workflow_goes_on_at_its_next_step_once_resumed(
    nats_url: str, subjects: Subjects
) -> None:
    # Resumed while no orchestrator ran, and not listed: the orchestrator that starts later
    # resumes the run at its next decision (a signal), which decides what it held first.

    async with running_stack(nats_url, subjects, [TWO_WAITS], worker=False, index_hold=60) as st:
        run_id = await st.client.start("two-waits", {})
        await eventually(lambda: _has(st, run_id, ev.RunStarted), what="the run started")
        await cli(nats_url, subjects, "pause", "workflow", "two-waits", "--runs")

        async def seen() -> bool:
            return st.orchestrator.flow.admission.pauses.holds("default", "two-waits")

        await eventually(seen, what="the orchestrator sees the pause")
        await cli(nats_url, subjects, "signal", run_id, "go")
        await eventually(lambda: _has(st, run_id, ev.EventHeld), what="the run paused, go held")
        await st.orchestrator.stop()  # (which writes the run index: the run is listed now)
        # What a lagging run list gives: the run not in it.
        await (await st.js.key_value(subjects.runs_bucket)).delete(run_id)
        said = await cli(nats_url, subjects, "resume", "workflow", "two-waits", "--json")
        assert json.loads(said)["runs"] == [], said
        later = Orchestrator(await connect(nats_url), subjects)
        await later.start()
        try:
            assert (await st.client.state(run_id)).paused is not None
            await cli(nats_url, subjects, "signal", run_id, "go", "--id", "second-go")
            assert (await st.client.wait(run_id, TIMEOUT)).status == "completed"
            kinds = [type(r) for r in await st.records(run_id)]
            assert kinds.count(ev.RunResumed) == 1
        finally:
            await later.stop()
            await later.nc.close()
