"""``required: true``: every run that completes passes through the state; a path around
it to a completing terminal state is refused (``required-step-bypass``)."""

from __future__ import annotations

from interlock.core.compiler import compile_sources
from support.core import compile_one

FLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: merge}
spec:
  initial_state: review
  states:
    review:
      on:
        - {event: review.approved, goto: approve}
        - {event: review.rejected, goto: rejected}
      catch: [{errors: ["*"], goto: rejected}]
    approve:
      required: true
      type: human_in_the_loop
      on:
        - {event: approval.granted, goto: merged}
        - {event: approval.denied, goto: rejected}
    merged: {type: terminal}
    rejected: {type: terminal, fail: {message: not merged}}
"""


def test_paths_around_a_required_state_that_end_failed_are_allowed() -> None:
    assert compile_one(FLOW).states["approve"].kind == "human_in_the_loop"


def test_a_path_that_completes_without_the_required_state_is_refused() -> None:
    bypass = FLOW.replace(
        "        - {event: review.rejected, goto: rejected}\n",
        "        - {event: review.rejected, goto: rejected}\n"
        "        - {event: review.trivial, goto: merged}\n",
    )
    diags = compile_sources([("m.yaml", bypass)]).diagnostics
    assert [(d.rule, d.line) for d in diags] == [("required-step-bypass", 14)]
    assert "a run can complete in 'merged' without passing it" in diags[0].message


def test_the_run_deadline_is_a_path_from_every_state() -> None:
    deadline = FLOW.replace(
        "  initial_state: review\n",
        "  initial_state: review\n  deadline: {after: 1h, goto: merged}\n",
    )
    diags = compile_sources([("m.yaml", deadline)]).diagnostics
    assert [d.rule for d in diags] == ["required-step-bypass"]
