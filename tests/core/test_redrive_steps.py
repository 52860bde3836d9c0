"""Where a log's steps begin, what `replay` and `explain` say of an input the new run does
not take, and timers found again after the new run's ids drift: the cases of
:mod:`interlock.core.redrive` the golden runs alone do not reach."""

from __future__ import annotations

import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.redrive import steps
from support.core import LOOPER, Run, code_review, compile_one, golden

ORIGINAL = code_review()
changed = code_review

DEADLINE = ("spec:\n", "spec:\n  deadline:\n    after: 30d\n    goto: rejected\n")
REVIEW_TIMEOUT = (
    "      description: An agent reviews the diff.\n",
    "      description: An agent reviews the diff.\n"
    "      timeout:\n        after: 72h\n        goto: rejected\n",
)

SPENDER = LOOPER.replace("max_total_spawns: 3", "max_total_spawns: 2")


def test_a_refused_spawn_is_part_of_the_decision_that_would_have_asked_for_it() -> None:
    """The engine's own failure of an action it did not ask for (no event id) is no
    answer: replay and explain reproduce the run with its own definition."""
    definition = compile_one(SPENDER)
    run = Run(definition)
    run.start()
    run.answer({})
    run.answer({})
    assert run.state.status == "completed"
    [refused] = [r for r in run.log if isinstance(r, ev.ActionFailed)]
    assert refused.data.event_id is None
    assert [(s.kind, s.first) for s in steps(run.log)] == [
        ("start", 1),
        ("answer", 4),
        ("answer", 8),
    ]
    report = analysis.replay(run.log, definition)
    assert report["agree"] is True
    assert report["skipped"] == []
    explained = analysis.explain(run.log, definition)
    assert explained["reproduces"] is True
    # The last answer's step: its entry back to work, then the catch of the refusal.
    last = explained["steps"][-1]
    assert [(c["goto"], c["outcome"]) for c in last["checks"]] == [
        ("work", "fired"),
        ("over", "fired"),
    ]


def test_an_agents_failure_after_a_timer_is_an_answer_and_a_timeout_is_not() -> None:
    log = golden("code-review-retried-then-caught")
    assert [(s.kind, s.first) for s in steps(log)] == [
        ("start", 1),
        ("timer", 5),  # timer.fired, then the timeout's action.failed
        ("timer", 8),
        ("answer", 11),  # the agent's action.failed
    ]


def test_a_log_that_does_not_begin_with_its_start_never_starts_a_new_run() -> None:
    log = golden("code-review-merged-fix-loop")[1:]
    report = analysis.replay(log, ORIGINAL)
    assert report["divergence"]["reason"] == "the new run never started"
    assert report["skipped"]
    assert {s["reason"] for s in report["skipped"]} == {"the new run never started"}
    explained = analysis.explain(log, ORIGINAL)
    assert explained["mismatch"]["reason"] == "the new run never started"
    assert explained["steps"][0]["checks"] == []


@pytest.mark.parametrize(
    ("name", "edit", "reason"),
    [
        (
            "code-review-trigger-denied",
            ("    - event: com.github.pull_request\n", "    - event: com.github.pr\n"),
            "no trigger of the workflow takes com.github.pull_request any more",
        ),
        (
            "code-review-merged-fix-loop",
            ("    pr:\n      type: integer\n", "    pr:\n      type: string\n"),
            "the inputs are no longer valid: input 'pr' must be string, got integer",
        ),
    ],
)
def test_explain_says_why_a_start_is_not_taken(
    name: str, edit: tuple[str, str], reason: str
) -> None:
    explained = analysis.explain(golden(name), changed(edit))
    assert explained["mismatch"] == {"seq": 1, "kind": "not_started", "reason": reason}
    first = explained["steps"][0]
    assert (first["checks"], first["why_none"]) == ([], "the run started")


def test_explain_shows_a_migration_as_a_step_of_its_own() -> None:
    log = golden("code-review-merged-fix-loop")[:14]
    newer = changed(("      default: [alice, bob]\n", "      default: [alice, bob, carol]\n"))
    moved, report = analysis.migration(log, newer, version=2, now="2026-03-01T10:00:00Z")
    assert report["migrate"] is None
    explained = analysis.explain([*log, *moved], newer)
    assert explained["reproduces"] is True
    last = explained["steps"][-1]
    assert last["input"] == {"kind": "migrate", "from_version": 1, "version": 2}
    assert (last["checks"], last["why_none"]) == ([], "a migrate, not a transition")
    # Re-driven without a version, the migration keeps the one it recorded.
    migrated = analysis.redrive([*log, *moved], newer)[-1]
    assert isinstance(migrated, ev.RunMigrated)
    assert (migrated.data.from_version, migrated.data.version) == (1, 2)


CAUGHT_TIMEOUT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: slow}
spec:
  initial_state: work
  states:
    work:
      actions: [{capability: build, timeout: 5m}]
      on:
        - {event: task.completed, goto: done}
      catch:
        - {errors: [agent_error], goto: broken}
        - {errors: [timeout], goto: late}
    done: {type: terminal}
    broken: {type: terminal}
    late: {type: terminal}
"""


def test_explain_shows_the_catch_that_took_a_timeout() -> None:
    definition = compile_one(CAUGHT_TIMEOUT)
    run = Run(definition)
    run.start()
    run.fire("action-timeout")
    assert run.state.state == "late"
    explained = analysis.explain(run.log, definition)
    timer = explained["steps"][-1]
    assert timer["input"]["kind"] == "timer"
    assert [(c["goto"], c["outcome"]) for c in timer["checks"]] == [("late", "fired")]
    assert timer["fired"]["to"] == "late"


def test_a_timer_whose_recorded_id_names_another_timer_of_the_new_run() -> None:
    """With a run deadline and a review timeout the new run writes two records more before
    the action's timer: the recorded action-timeout's id is the new review timeout's. The
    timer that fires is still the action's, then its retry."""
    log = golden("code-review-retried-then-caught")
    definition = changed(DEADLINE, REVIEW_TIMEOUT)
    again = analysis.redrive(log, definition)
    fired = [r for r in again if isinstance(r, ev.TimerFired)]
    assert [r.data.purpose for r in fired] == ["action-timeout", "retry"]
    recorded = [r.data.timer_id for r in log if isinstance(r, ev.TimerFired)]
    purposes = {r.data.timer_id: r.data.purpose for r in again if isinstance(r, ev.TimerScheduled)}
    assert purposes[recorded[0]] == "state-timeout"  # the id the recorded timer had
    report = analysis.replay(log, definition)
    assert report["skipped"] == []
    assert report["same_end"] is True


def test_a_timer_set_steps_before_it_fires_is_found_after_the_ids_drift() -> None:
    """The approval's timeout is set, an event the guard turns down comes, then the timeout
    fires: re-driven with a run deadline and a review timeout (every id after them moves
    on), it is that timeout that fires, not the deadline also set."""
    run = Run(ORIGINAL, run_id="r-late")
    run.start({"repository": "acme/app", "pr": 7, "score": 8})
    run.answer({"score": 8, "summary": "fine"})
    assert run.state.state == "approval"
    run.send("approval.granted", {"approver": "mallory"})
    assert run.state.state == "approval"
    run.fire("state-timeout")
    assert run.state.outputs["reason"] == "no approval within 72h"
    again = analysis.redrive(run.log, changed(DEADLINE, REVIEW_TIMEOUT))
    assert [r.data.purpose for r in again if isinstance(r, ev.TimerFired)] == ["state-timeout"]
    end = again[-1]
    assert isinstance(end, ev.RunCompleted)
    assert end.data.outputs == run.state.outputs


def test_a_forked_run_redrives_to_its_own_log() -> None:
    forked = analysis.fork(
        golden("code-review-merged-fix-loop"),
        9,
        run_id="r-fork",
        definition=ORIGINAL,
        version=2,
        now="2026-04-01T10:00:00Z",
    )
    marker = next(r for r in forked if isinstance(r, ev.RunForked))
    assert marker.data.version == 2
    # Without a version each record keeps its own: the start 1, the fork 2.
    assert analysis.redrive(forked, ORIGINAL) == forked
    again = analysis.redrive(forked, ORIGINAL, version=3)
    assert [r.data.version for r in again if isinstance(r, ev.RunStarted | ev.RunForked)] == [3, 3]
