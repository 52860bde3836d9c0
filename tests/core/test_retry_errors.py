"""retry.errors: failures of the classes it names are retried though not retryable
(``*``: any failure); the policy travels on ``action.requested`` so a replay decides the
same."""

from __future__ import annotations

import pytest

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.vocabulary import TimerPurpose
from support.core import Run, compile_one

FLAKY = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: flaky}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: tool.call
          retry: {max_attempts: 2, errors: %s, backoff: {initial: 1s, jitter: false}}
      on: [{event: task.completed, goto: done}]
      catch: [{errors: ["*"], goto: gave_up}]
    done: {type: terminal}
    gave_up: {type: terminal}
"""


def _fail(run: Run, error_class: str, code: str = "") -> ev.ActionFailed:
    error = {"class": error_class, "message": "no"}
    if code:
        error["code"] = code
    out = run.answer({"error": error}, type="task.failed")
    failed = [r for r in out if isinstance(r, ev.ActionFailed)]
    assert len(failed) == 1
    return failed[0]


@pytest.mark.parametrize(
    ("errors", "error_class", "retried"),
    [
        ('["*"]', "agent_error", True),
        ('["*"]', "tool_error", True),  # an agent's own class: agent_error, code tool_error
        ("[agent_error]", "agent_error", True),
        ("[schema_error]", "agent_error", False),
        ("[]", "agent_error", False),
        ("[]", "timeout", True),  # retryable anyway
    ],
)
def test_the_classes_named_are_retried(errors: str, error_class: str, retried: bool) -> None:
    run = Run(compile_one(FLAKY % errors))
    run.start()
    failed = _fail(run, error_class)
    assert failed.data.will_retry is retried
    if retried:
        run.fire(TimerPurpose.RETRY)
        assert next(iter(run.state.pending.values())).attempt == 2
        run.answer({})
        assert run.state.state == "done"
    else:
        assert run.state.state == "gave_up"


def test_the_policy_is_recorded_on_the_request() -> None:
    run = Run(compile_one(FLAKY % '["*"]'))
    records = run.start()
    requested = [r for r in records if isinstance(r, ev.ActionRequested)]
    assert requested[0].data.retry is not None
    assert requested[0].data.retry.errors == ["*"]


def test_an_unknown_class_is_refused() -> None:
    diags = compile_sources([("f.yaml", FLAKY % "[flaky]")]).diagnostics
    assert [d.rule for d in diags] == ["unknown-error-class"]
