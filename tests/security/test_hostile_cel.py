"""Costly CEL: the nested comprehension over the inputs is refused at ``validate`` and
``apply`` (rule ``cel-cost``, at its line and column); an expression that is fine to
validate but costly on the values it meets stops at its step budget, recorded as
``guard.failed`` (the guard does not fire), while an unrelated run completes; and while a
workflow whose guard costs its whole budget is fed event after event, the runs of another
workflow keep completing (their completions are appended between the costly decisions)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from interlock.core import events as ev
from interlock.core.expr import STEP_BUDGET, Expression, ExpressionError
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.hostile import (
    ECHO_FLOW,
    TIMEOUT,
    Stack,
    bystander_completes,
    cli_env,
    eventually,
    run_capped,
    running_stack,
    yaml,
)

NESTED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: nested
    spec:
      inputs:
        xs: {type: list, required: true}
      initial_state: check
      states:
        check:
          type: human_in_the_loop
          on:
            - event: go
              guard: 'inputs.xs.all(x, inputs.xs.all(y, x + y >= 0))'
              goto: done
        done:
          type: terminal
    """
)

COSTLY = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: costly
    spec:
      inputs:
        xs: {type: list, required: true}
      initial_state: check
      states:
        check:
          type: human_in_the_loop
          on:
            - event: go
              guard: 'inputs.xs.all(x, x >= 0)'
              goto: all-positive
            - {event: go, goto: undecided}
        all-positive:
          type: terminal
        undecided:
          type: terminal
    """
)


def test_the_nested_comprehension_is_refused_at_validate(tmp_path: Path) -> None:
    path = tmp_path / "nested.yaml"
    path.write_text(NESTED)
    ran = run_capped("validate", str(path))
    assert ran.code == 1, ran
    # The inner comprehension, inside the guard's quotes: line 14, column 46.
    assert re.match(rf"^{re.escape(str(path))}:14:46: cel-cost: ", ran.stderr), ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_nested_comprehension_is_refused_at_apply(
    tmp_path: Path, nats_url: str, subjects: Subjects
) -> None:
    path = tmp_path / "nested.yaml"
    path.write_text(NESTED)
    ran = run_capped("apply", str(path), env=cli_env(nats_url, subjects.prefix))
    assert ran.code == 1, ran
    assert f"{path}:14:46: cel-cost: " in ran.stderr


def test_an_evaluation_stops_at_its_budget_whatever_the_values() -> None:
    expression = Expression("inputs.xs.all(x, x >= 0)")
    assert expression.evaluate({"inputs": {"xs": list(range(600))}}) is True
    started = time.process_time()
    with pytest.raises(ExpressionError, match=f"after {STEP_BUDGET:,} steps"):
        expression.evaluate({"inputs": {"xs": list(range(100_000))}})
    # Unbounded, this took minutes of CPU; the budget ends it within one interpreter slice.
    assert time.process_time() - started < 10


def test_a_workflow_with_a_comprehension_is_decided_off_the_loop() -> None:
    from interlock.core.compiler import compile_workflow_text
    from interlock.core.definition import may_loop

    assert may_loop(compile_workflow_text(COSTLY))
    assert may_loop(compile_workflow_text(LOOPING))
    assert not may_loop(compile_workflow_text(ECHO_FLOW))


async def test_a_costly_guard_is_recorded_and_other_runs_go_on(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW, COSTLY]) as stack:
        run_id = await stack.client.start("costly", {"xs": list(range(20_000))})
        go = CloudEvent(id="go-1", source="test", type="go", extensions={"runid": run_id})
        await stack.client.emit(go)
        await bystander_completes(stack)
        state = await stack.wait(run_id, TIMEOUT)
        assert state.state == "undecided", state
        failed = [r for r in await stack.records(run_id) if isinstance(r, ev.GuardFailed)]
        assert len(failed) == 1
        assert f"after {STEP_BUDGET:,} steps" in failed[0].data.error


LOOPING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: looping
    spec:
      inputs:
        xs: {type: list, required: true}
      initial_state: check
      states:
        check:
          type: human_in_the_loop
          on:
            - event: go
              guard: 'inputs.xs.all(x, x >= 0)'
              goto: done
        done:
          type: terminal
    """
)

COSTLY_EVENTS = 10
BYSTANDERS = 3


async def _appended(stack: Stack, run_id: str, kind: type[ev.AnyRecord]) -> list[int]:
    """Stream sequences (one order over every run) of the run's appends holding ``kind``."""
    raw = await stack.client.log.read_raw(run_id)
    return [seq for seq, data in raw if any(isinstance(r, kind) for r in ev.decode_batch(data))]


async def test_other_runs_complete_while_a_costly_guard_is_fed_events(
    nats_url: str, subjects: Subjects
) -> None:
    """Each ``go`` costs the guard its whole step budget (about half a second of the
    interpreter). Decided on the orchestrator's event loop, the ten would hold every other
    run for seconds; decided off it, runs of another workflow started once the first is
    recorded complete, one after another, before the last is: by the stream's order."""
    async with running_stack(nats_url, subjects, [ECHO_FLOW, LOOPING]) as stack:
        costly = await stack.client.start("looping", {"xs": list(range(20_000))})
        for n in range(COSTLY_EVENTS):
            go = CloudEvent(id=f"go-{n}", source="test", type="go", extensions={"runid": costly})
            await stack.client.emit(go)
        await eventually(
            lambda: _appended(stack, costly, ev.GuardFailed), within=60, what="a costly guard"
        )
        completions: list[int] = []
        for _ in range(BYSTANDERS):
            run_id = await stack.client.start("bystander", {})
            state = await stack.wait(run_id, 60)
            assert state.status == "completed", state
            completions += await _appended(stack, run_id, ev.RunCompleted)

        async def all_decided() -> list[int]:
            found = await _appended(stack, costly, ev.GuardFailed)
            return found if len(found) == COSTLY_EVENTS else []

        failed = await eventually(all_decided, within=120, what="every costly guard")
        assert len(completions) == BYSTANDERS
        assert max(completions) < failed[-1], (completions, failed)
        records = await stack.records(costly)
        errors = {r.data.error for r in records if isinstance(r, ev.GuardFailed)}
        assert errors == {
            f"evaluation stopped after {STEP_BUDGET:,} steps (its budget): "
            "the expression costs too much on these values"
        }
        assert (await stack.client.state(costly)).state == "check"
