"""Costly CEL: the nested comprehension over the inputs is refused at ``validate`` and
``apply`` (rule ``cel-cost``, at its line and column); an expression that is fine to
validate but costly on the values it meets stops at its step budget, recorded as
``guard.failed`` (the guard does not fire), while an unrelated run completes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hostile_support import (
    ECHO_FLOW,
    TIMEOUT,
    bystander_completes,
    cli_env,
    run_capped,
    running_stack,
    yaml,
)

from interlock.core import events as ev
from interlock.core.expr import STEP_BUDGET, Expression, ExpressionError
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects

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
