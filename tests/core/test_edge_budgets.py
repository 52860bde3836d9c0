"""Edge budgets: ``spec.budget.edges`` names budgets, transitions and catches count against
the ones they name (``budget: [...]``), and the transition that would go over one fails the
run (``budget_exceeded``). A cycle the run goes round on its own outcomes alone must count
against one, or the workflow must declare its run budget (``unbounded-cycle``)."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

LOOP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: loop}
spec:
  budget:
    edges: {fixes: 2, review-exits: 3}
  initial_state: review
  states:
    review:
      actions: [{capability: ci.review}]
      on:
        - {event: task.completed, guard: result.ok, goto: done, budget: [review-exits]}
        - {event: task.completed, goto: fix, budget: [fixes, review-exits]}
    fix:
      actions: [{capability: ci.fix}]
      on:
        - {event: task.completed, goto: review}
      catch:
        - {errors: ["*"], goto: review, budget: [fixes]}
    done: {type: terminal}
"""


def test_each_transition_spends_the_budgets_it_names() -> None:
    run = Run(compile_one(LOOP))
    run.start()
    records = run.answer({"ok": False})
    fired = [r for r in records if isinstance(r, ev.TransitionFired)]
    assert fired[0].data.budget == ["fixes", "review-exits"]
    assert run.state.spent == {"fixes": 1, "review-exits": 1}
    records = run.answer({})  # fix -> review: counts against nothing
    fired = [r for r in records if isinstance(r, ev.TransitionFired)]
    assert fired[0].data.budget == []
    assert run.state.spent == {"fixes": 1, "review-exits": 1}
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_the_transition_that_would_go_over_fails_the_run() -> None:
    run = Run(compile_one(LOOP))
    run.start()
    for _ in range(2):
        run.answer({"ok": False})
        run.answer({})
    records = run.answer({"ok": False})  # the third fix
    assert types(records) == ["action.completed", "run.failed"]
    assert run.state.status == RunStatus.FAILED
    assert run.state.error is not None
    assert run.state.error.error_class == "budget_exceeded"
    assert run.state.error.message == (
        "more than budget.edges.fixes (2) transitions: review -> fix on task.completed"
    )


def test_a_budget_of_one_lets_its_edge_be_taken_once() -> None:
    run = Run(compile_one(LOOP.replace("fixes: 2", "fixes: 1")))
    run.start()
    run.answer({"ok": False})  # the one fix the budget allows
    assert (run.state.state, run.state.spent) == ("fix", {"fixes": 1, "review-exits": 1})
    run.answer({})
    records = run.answer({"ok": False})
    assert types(records) == ["action.completed", "run.failed"]
    assert run.state.error is not None
    assert run.state.error.message == (
        "more than budget.edges.fixes (1) transitions: review -> fix on task.completed"
    )


def test_a_catch_counts_too_and_budgets_are_shared() -> None:
    run = Run(compile_one(LOOP))
    run.start()
    run.answer({"ok": False})  # fixes 1
    run.answer({"error": {"class": "agent_error"}}, type="task.failed")  # catch: fixes 2
    assert run.state.spent == {"fixes": 2, "review-exits": 1}
    run.answer({"ok": False})
    assert run.state.status == RunStatus.FAILED


def test_a_run_without_edge_budgets_writes_what_it_always_wrote() -> None:
    run = Run(compile_one(LOOP.replace(", budget: [review-exits]", "")))
    run.start()
    run.answer({"ok": True})
    assert run.state.spent is None
    assert b'"spent"' not in encode_state(run.state)
    fired = [r for r in run.log if isinstance(r, ev.TransitionFired)]
    assert b'"budget"' not in ev.encode(fired[0])


def _diags(text: str) -> list[str]:
    return [f"{d.line}:{d.col} {d.rule}" for d in compile_sources([("c.yaml", text)]).diagnostics]


def test_an_undeclared_budget_is_refused_where_it_is_named() -> None:
    assert _diags(LOOP.replace("budget: [fixes]}", "budget: [fixs]}")) == ["19:50 unknown-budget"]


UNBOUNDED = LOOP.replace(", budget: [fixes, review-exits]", "")


def test_a_cycle_on_the_runs_own_outcomes_needs_a_budget() -> None:
    # review -> fix (the unguarded fallback) -> review: nothing but max_transitions ends
    # it; reported at the edge that closes it (fix -> review).
    assert _diags(UNBOUNDED) == ["17:11 unbounded-cycle"]
    # Counting either edge against a budget bounds it, and so does a declared run budget.
    assert _diags(LOOP) == []
    assert _diags(UNBOUNDED.replace("  budget:\n", "  budget:\n    max_transitions: 50\n")) == []


def test_a_guard_or_an_outside_event_on_the_cycle_stops_it() -> None:
    guarded = UNBOUNDED.replace(
        "{event: task.completed, goto: review}",
        "{event: task.completed, guard: result.again, goto: review}",
    )
    catch_bounded = guarded.replace("goto: review, budget: [fixes]}", "goto: review}")
    assert _diags(guarded) == []
    assert _diags(catch_bounded) == ["19:11 unbounded-cycle"]  # the catch closes it
    outside = UNBOUNDED.replace(
        "{event: task.completed, goto: review}", "{event: fix.pushed, goto: review}"
    )
    assert _diags(outside) == []  # (the catch back to review still counts against fixes)


def test_a_state_timeout_cycle_waits_its_time_each_round() -> None:
    text = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: poll}
spec:
  initial_state: wait
  states:
    wait:
      timeout: {after: 1m, goto: wait}
      on:
        - {event: ready, goto: done}
    done: {type: terminal}
"""
    assert _diags(text) == []


def test_a_zynax_manifest_runs_as_written() -> None:
    text = (
        UNBOUNDED.replace("interlock.io/v1", "zynax.io/v1")
        .replace("  budget:\n    edges: {fixes: 2, review-exits: 3}\n", "")
        .replace(", budget: [review-exits]", "")
        .replace(", budget: [fixes]", "")
    )
    assert _diags(text) == []
