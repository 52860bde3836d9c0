"""The cost budget: ``budget.max_cost`` is summed from the ``cost`` each answer reports
(recorded on ``action.completed``); the answer that takes the run over it fails its state
with ``budget_exceeded`` (code ``max_cost``), routed like any failure."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one

SPEND = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: spend}
spec:
  budget: {max_cost: 5}
  initial_state: work
  states:
    work:
      actions: [{capability: model.call}]
      on:
        - {event: task.completed, guard: "run.cost < 3.0", goto: work}
        - {event: task.completed, goto: done}
      catch:
        - errors: [budget_exceeded]
          codes: [max_cost]
          goto: over
          set: {why: "{{ result.error.message }}"}
    done: {type: terminal, outputs: {spent: "{{ run.cost }}"}}
    over: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""


def test_costs_are_summed_and_readable_as_run_cost() -> None:
    run = Run(compile_one(SPEND))
    run.start()
    run.answer({"cost": 1.5})
    run.answer({"cost": 2})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"spent": 3.5}
    costs = [r.data.cost for r in run.log if isinstance(r, ev.ActionCompleted)]
    assert costs == [1.5, 2.0]
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_the_answer_that_goes_over_fails_its_state_routed_by_catch() -> None:
    run = Run(compile_one(SPEND))
    run.start()
    run.answer({"cost": 1})
    run.answer({"cost": 4.5})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.state == "over"
    assert run.state.outputs == {"why": "spent 5.5, more than budget.max_cost (5)"}


def test_answers_without_a_cost_cost_nothing() -> None:
    run = Run(compile_one(SPEND))
    run.start()
    run.answer({"cost": "a lot"})
    assert run.state.cost is None
    run.answer({})
    assert run.state.status == RunStatus.RUNNING


def test_a_negative_cost_is_no_cost_and_lowers_nothing() -> None:
    """One agent's answer cannot take back what another's spent."""
    run = Run(compile_one(SPEND))
    run.start()
    run.answer({"cost": 2})
    run.answer({"cost": -100})
    assert run.state.cost == 2.0
    run.answer({"cost": 3.5})
    assert run.state.state == "over"
    costs = [r.data.cost for r in run.log if isinstance(r, ev.ActionCompleted)]
    assert costs == [2.0, None, 3.5]


def test_a_cost_budget_must_be_above_zero() -> None:
    diags = compile_sources([("s.yaml", SPEND.replace("max_cost: 5", "max_cost: 0"))]).diagnostics
    assert [d.rule for d in diags] == ["invalid-value"]
