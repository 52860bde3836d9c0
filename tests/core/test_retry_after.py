"""An agent's retry-after: the next attempt's timer fires at the later of the backoff and
the wait the failure asked for (seconds or an instant), clamped to an hour; a value that is
none is ignored by the core (the edge refuses it) and the log says why the retry waits."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.cli.timeline import describe
from interlock.core import events as ev
from interlock.core.analysis import explain
from interlock.core.capacity import admitted
from interlock.core.record_text import summarize
from interlock.core.retryafter import RETRY_AFTER_MAX_S, retry_after_problem
from interlock.core.rfc3339 import parse_time
from interlock.core.vocabulary import TimerPurpose
from support.core import Run, compile_one

LIMITED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: limited}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: llm.call
          retry: {max_attempts: %d, backoff: {initial: 2s, jitter: false}}
      on: [{event: task.completed, goto: done}]
      catch: [{errors: ["*"], goto: gave_up}]
    done: {type: terminal}
    gave_up: {type: terminal}
"""


def _refused(run: Run, retry_after: Any) -> tuple[ev.ActionFailed, ev.TimerScheduled | None]:
    error = {"class": "agent_error", "message": "429", "retryable": True, "code": "rate_limited"}
    if retry_after is not None:
        error["retry_after"] = retry_after
    out = run.answer({"error": error}, type="task.failed")
    failed = [r for r in out if isinstance(r, ev.ActionFailed)]
    timers = [r for r in out if isinstance(r, ev.TimerScheduled)]
    assert len(failed) == 1
    return failed[0], (timers[0] if timers else None)


def _wait(failed: ev.ActionFailed, timer: ev.TimerScheduled) -> float:
    return (parse_time(timer.data.fire_at) - parse_time(failed.time)).total_seconds()


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        (None, 2.0),  # the backoff alone
        (0.5, 2.0),  # shorter than the backoff: the backoff
        (30, 30.0),
        (12.25, 12.25),
        (10**18, RETRY_AFTER_MAX_S),  # clamped
        ("2026-01-01T00:01:00Z", 60.0 - 2),  # an instant: answered at second 2
        ("2026-01-01T01:00:00+01:00", 2.0),  # the same instant as the start: past
        ("2020-01-01T00:00:00Z", 2.0),  # past: the backoff
        ("2099-01-01T00:00:00Z", RETRY_AFTER_MAX_S),
    ],
)
def test_the_retry_waits_for_the_later_of_backoff_and_retry_after(
    retry_after: Any, wait: float
) -> None:
    run = Run(compile_one(LIMITED % 3))
    run.start()
    failed, timer = _refused(run, retry_after)
    assert timer is not None
    assert failed.data.will_retry
    assert _wait(failed, timer) == wait
    asked = failed.data.error.retry_after_s
    assert timer.data.retry_after_s == asked
    if retry_after is None:
        assert asked is None
        assert timer.data.backoff_s is None  # the record of a plain retry is unchanged
    else:
        assert asked is not None
        assert timer.data.backoff_s == 2.0
    run.fire(TimerPurpose.RETRY)
    assert next(iter(run.state.pending.values())).attempt == 2


@pytest.mark.parametrize(
    "garbage", [-1, -0.001, float("nan"), float("inf"), True, "soon", "2026-01-01", [], {}]
)
def test_a_value_that_is_no_retry_after_is_named_and_ignored(garbage: Any) -> None:
    assert retry_after_problem(garbage) is not None
    run = Run(compile_one(LIMITED % 3))
    run.start()
    failed, timer = _refused(run, garbage)
    assert failed.data.error.retry_after_s is None
    assert timer is not None
    assert _wait(failed, timer) == 2.0


def test_a_retry_after_does_not_add_attempts() -> None:
    run = Run(compile_one(LIMITED % 2))
    run.start()
    _refused(run, 5)
    run.fire(TimerPurpose.RETRY)
    failed, timer = _refused(run, 5)
    assert timer is None
    assert not failed.data.will_retry
    assert run.state.state == "gave_up"


def test_the_log_says_why_the_retry_waits() -> None:
    definition = compile_one(LIMITED % 3)
    run = Run(definition)
    run.start()
    _, timer = _refused(run, 30)
    assert timer is not None
    why = "the later of the backoff 2s and the agent's retry-after 30s"
    assert why in summarize(timer)  # explain's and the console's line
    assert why in describe(timer)  # interlock describe's
    report = explain(run.log, definition)
    assert report["reproduces"] is True, report
    assert why in str(report["steps"])


def test_a_replay_with_an_instant_decides_the_same() -> None:
    definition = compile_one(LIMITED % 3)
    run = Run(definition)
    run.start()
    _refused(run, "2026-01-01T00:00:40Z")
    run.fire(TimerPurpose.RETRY)
    assert explain(run.log, definition)["reproduces"] is True


RATED = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: llm-agent}
spec:
  capabilities:
    - name: llm.call
      concurrency: {limit: 2, key: input.account}
      rate: {limit: 60, per: 1m, key: input.account, burst: 3}
    - name: llm.slots
      concurrency: {limit: 2}
"""


def _rated_run(capability: str) -> Run:
    from interlock.core.compiler import compile_sources
    from interlock.core.definition import link

    workflow = (LIMITED % 3).replace("capability: llm.call", f"capability: {capability}")
    workflow = workflow.replace("retry:", "input: {account: acme}\n          retry:")
    compiled = compile_sources([("agent.yaml", RATED), ("wf.yaml", workflow)])
    assert not compiled.diagnostics, compiled.diagnostics
    (agent,) = compiled.agents
    run = Run(link(compiled.workflows[0], agent.capabilities))
    run.start()
    run._apply(
        admitted(run.definition, run.state, run.now(), action_id=run.pending_id(), attempt=1)
    )
    return run


@pytest.mark.parametrize(
    ("capability", "retry_after", "held_until"),
    [
        ("llm.call", 30, "2026-01-01T00:00:33.000Z"),  # answered at second 3
        ("llm.call", None, None),
        ("llm.slots", 30, None),  # no rate to hold
    ],
)
def test_a_retry_after_holds_the_rate_of_the_key_until_then(
    capability: str, retry_after: Any, held_until: str | None
) -> None:
    run = _rated_run(capability)
    failed, _ = _refused(run, retry_after)
    assert failed.data.freed is not None
    assert failed.data.freed.rate_held_until == held_until
    assert len(failed.data.freed.limits) == (2 if capability == "llm.call" else 1)
