"""Re-driving a recorded run with a definition that writes other records: the new run's
action and timer ids drift from the recorded ones, and every later answer and timer must
still reach the action or timer that stands for the recorded one; an input the new run
cannot take is skipped with the reason a user reads."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.definition import Definition
from support.core import Run, code_review, compile_one, golden

ORIGINAL = code_review()


def changed(old: str, new: str) -> Definition:
    return code_review((old, new))


# The review state gets a timeout of its own: each time the run enters it, a timer.scheduled
# is written right after state.entered, so the records after it (and every action and timer
# id, which are "<run>:<seq>") move on.
STATE_TIMEOUT = changed(
    "      description: An agent reviews the diff.\n",
    "      description: An agent reviews the diff.\n"
    "      timeout:\n        after: 72h\n        goto: rejected\n",
)


def _review_timer(record: ev.AnyRecord) -> bool:
    return (
        isinstance(record, ev.TimerScheduled)
        and record.data.purpose == "state-timeout"
        and record.data.state == "review"
    )


def _data(record: ev.AnyRecord, ids: dict[str, str] | None = None) -> Any:
    """A record's data with the run's ids (``<run>:<seq>``) renamed; a retry timer's time
    is left out (its jitter is drawn from the action's id)."""
    text = msgspec.json.encode(record.data).decode()
    if ids is not None:
        pattern = re.escape(record.subject or "") + r":\d+"
        text = re.sub(pattern, lambda m: ids.get(m.group(), "?"), text)
    data = json.loads(text)
    if isinstance(record, ev.TimerScheduled) and record.data.purpose == "retry":
        data.pop("fire_at")
    return data


@pytest.mark.parametrize(
    "name",
    [
        "code-review-merged-fix-loop",
        "code-review-approval-expired",
        "code-review-retried-then-caught",
        "code-review-rejected",
        "code-review-guard-failure",
    ],
)
def test_answers_and_timers_reach_the_new_runs_ids_after_records_more(name: str) -> None:
    log = golden(name)
    again = analysis.redrive(log, STATE_TIMEOUT)
    extra = [r for r in again if _review_timer(r)]
    assert extra, "the new definition writes the review's timer"
    rest = [r for r in again if not _review_timer(r)]
    # Everything else is what the log holds, under the new ids: each answer went to the
    # action standing for the recorded one, each timer (a timeout, a retry, the approval's
    # expiry) fired in the new run, at the same attempt.
    assert [ev.record_type(r) for r in rest] == [ev.record_type(r) for r in log]
    ids = {old.id: new.id for old, new in zip(log, rest, strict=True)}
    assert ids[log[2].id] != log[2].id, "the ids drifted"
    for new, old in zip(rest[1:], log[1:], strict=True):
        assert _data(new) == _data(old, ids), (name, old.id)
    report = analysis.replay(log, STATE_TIMEOUT)
    assert report["divergence"]["seq"] == 3
    assert report["skipped"] == []
    assert report["same_end"] is True


def test_a_timeout_fires_in_the_new_run_before_its_action_is_answered() -> None:
    """The action-timeout timer names its action: that action is mapped as the timer fires
    (nothing answered it yet), and the retry that follows asks again under the new id."""
    log = golden("code-review-retried-then-caught")
    report = analysis.replay(log, STATE_TIMEOUT)
    lines = [line["summary"] for line in report["continuation"]]
    assert lines[:5] == [
        "timer.scheduled state-timeout at 2026-03-04T09:00:01.000Z",
        'action.requested review input={"diff":"","score":6}',
        "timer.scheduled action-timeout at 2026-03-01T09:05:01.000Z",
        "timer.fired action-timeout",
        "action.failed r-golden-retried:4 timeout: no answer from review "
        "(deadline 2026-03-01T09:05:01.000Z)",
    ]
    assert "timer.fired retry" in lines
    assert 'action.requested review input={"diff":"","score":6} (attempt 2)' in lines


def test_timers_the_new_definition_never_sets_are_skipped_by_purpose() -> None:
    no_timeout = changed("          timeout: 5m\n", "")
    report = analysis.replay(golden("code-review-retried-then-caught"), no_timeout)
    assert [(s["seq"], s["reason"]) for s in report["skipped"]] == [
        (5, "the action-timeout timer is not set in the new run (state 'review')"),
        (8, "the retry timer is not set in the new run (state 'review')"),
    ]
    # The answer of the second attempt still reaches the one action the new run asked for.
    assert report["replayed_end"] == report["recorded_end"]


def test_inputs_after_the_new_run_ended_are_skipped_as_such() -> None:
    report = analysis.replay(
        golden("code-review-merged-fix-loop"),
        changed("guard: context.fixes < 3", "guard: context.fixes < 0"),
    )
    assert report["divergence"]["kind"] == "guard"
    assert [(s["seq"], s["input"]["kind"], s["reason"]) for s in report["skipped"]] == [
        (10, "answer", "the new run has already ended (completed)"),
        (15, "answer", "the new run has already ended (completed)"),
        (19, "event", "the new run has already ended (completed)"),
        (24, "answer", "the new run has already ended (completed)"),
    ]
    assert report["replayed_end"]["outputs"]["reason"] == "score 6 after 0 fixes"
    assert report["same_end"] is False


def test_answers_of_a_state_the_new_run_skipped_name_their_action() -> None:
    report = analysis.replay(
        golden("code-review-merged-fix-loop"),
        changed("guard: result.score > 7", "guard: result.score > 5"),
    )
    assert [(s["seq"], s["reason"]) for s in report["skipped"]] == [
        (
            10,
            "the answer of echo (state 'fix', action 0) is not awaited: "
            "the new run is in state 'approval'",
        ),
        (
            15,
            "the answer of review (state 'review', action 0) is not awaited: "
            "the new run is in state 'approval'",
        ),
    ]
    # The approval and the merge answer that follow are taken: the run is merged, unfixed.
    assert report["replayed_end"]["state"] == "merged"
    assert report["replayed_end"]["outputs"]["fixes"] == 0


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "    - event: com.github.pull_request\n",
            "    - event: com.github.pr\n",
            "no trigger of the workflow takes com.github.pull_request any more",
        ),
        (
            "action: [opened, reopened]",
            "action: [reopened]",
            "no trigger of the workflow takes com.github.pull_request any more",
        ),
    ],
)
def test_a_start_no_trigger_takes_any_more_is_not_started(old: str, new: str, reason: str) -> None:
    report = analysis.replay(golden("code-review-trigger-denied"), changed(old, new))
    d = report["divergence"]
    assert (d["seq"], d["kind"], d["reason"]) == (1, "not_started", reason)
    assert d["group"] == "not_started before the first state"
    assert report["skipped"][0]["reason"] == reason
    assert report["replayed"] == 0


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        (
            "    pr:\n      type: integer\n",
            "    pr:\n      type: string\n",
            "input 'pr' must be string, got integer",
        ),
        (
            "  inputs:\n",
            "  inputs:\n    team:\n      type: string\n      required: true\n",
            "input 'team' is required (string)",
        ),
    ],
)
def test_a_start_whose_inputs_no_longer_check_is_not_started(
    old: str, new: str, problem: str
) -> None:
    report = analysis.replay(golden("code-review-merged-fix-loop"), changed(old, new))
    d = report["divergence"]
    assert (d["seq"], d["kind"]) == (1, "not_started")
    assert d["reason"] == f"the inputs are no longer valid: {problem}"
    assert report["replayed"] == 0


def test_two_problems_with_the_inputs_are_both_named() -> None:
    definition = changed(
        "  inputs:\n",
        "  inputs:\n    team:\n      type: string\n      required: true\n"
        "    area:\n      type: string\n      required: true\n",
    )
    d = analysis.replay(golden("code-review-merged-fix-loop"), definition)["divergence"]
    assert d["reason"] == (
        "the inputs are no longer valid: input 'team' is required (string); "
        "input 'area' is required (string)"
    )


def test_explain_against_another_definition_says_where_it_stops_reproducing() -> None:
    renamed = changed("        - event: approval.granted\n", "        - event: approval.given\n")
    report = analysis.explain(golden("code-review-merged-fix-loop"), renamed)
    assert report["reproduces"] is False
    assert report["mismatch"]["kind"] == "event_not_taken"
    assert report["mismatch"]["seq"] == 19
    [step] = [s for s in report["steps"] if s["seq"] == 19]
    assert step["checks"] == []


def test_a_redrive_keeps_the_recorded_version_unless_given_one() -> None:
    log = golden("code-review-rejected")
    started = log[0]
    assert isinstance(started, ev.RunStarted)
    on_three = [
        msgspec.structs.replace(started, data=msgspec.structs.replace(started.data, version=3)),
        *log[1:],
    ]
    again = analysis.redrive(on_three, ORIGINAL)
    first = again[0]
    assert isinstance(first, ev.RunStarted)
    assert first.data.version == 3
    moved = analysis.redrive(on_three, ORIGINAL, version=5)[0]
    assert isinstance(moved, ev.RunStarted)
    assert moved.data.version == 5


def test_a_log_that_does_not_begin_with_its_start_is_not_redriven() -> None:
    log = golden("code-review-rejected")
    report = analysis.replay(log[1:], ORIGINAL)
    assert report["replayed"] == 0
    assert report["divergence"]["seq"] == 1


def _migrated_log() -> tuple[list[ev.AnyRecord], Definition]:
    """merged-fix-loop up to its second review, moved onto version 2 of the workflow."""
    log = golden("code-review-merged-fix-loop")[:14]
    newer = changed("      default: [alice, bob]\n", "      default: [alice, bob, carol]\n")
    moved, report = analysis.migration(log, newer, version=2, now="2026-03-01T10:00:00Z")
    assert report["migrate"] is None, report["migrate"]
    return [*log, *moved], newer


def test_a_migrated_run_redrives_with_its_migration() -> None:
    log, newer = _migrated_log()
    assert isinstance(log[-1], ev.RunMigrated)
    again = analysis.redrive(log, newer, version=2)
    assert [ev.record_type(r) for r in again] == [ev.record_type(r) for r in log]
    last = again[-1]
    assert isinstance(last, ev.RunMigrated)
    assert (last.id, last.time) == (log[-1].id, log[-1].time)
    assert (last.data.version, last.data.spec_hash) == (2, newer.spec_hash)
    assert last.data.checked_through == 14
    assert analysis.replay(log, newer, version=2)["agree"] is True


CHILD = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: child, namespace: default}
spec:
  inputs:
    n: {type: integer}
  initial_state: work
  states:
    work:
      actions:
        - capability: build
      on:
        - event: task.completed
          guard: result.ok == true
          goto: done
        - event: task.completed
          goto: failed
    done: {type: terminal, outputs: {n: "{{ inputs.n }}"}}
    failed:
      type: terminal
      fail: {message: not ok, class: agent_error}
"""


def test_a_child_runs_log_redrives_naming_its_parent() -> None:
    definition = compile_one(CHILD)
    parent = ev.ParentRef(run_id="r-parent", action_id="r-parent:3", attempt=2)
    child = Run(definition, run_id="r-child")
    child.start({"n": 4}, parent=parent)
    child.answer({"ok": False})
    assert analysis.redrive(child.log, definition) == child.log
    report = analysis.explain(child.log, definition)
    assert report["reproduces"] is True
    [_, answered] = report["steps"]
    assert [c["outcome"] for c in answered["checks"]] == ["false", "fired"]
