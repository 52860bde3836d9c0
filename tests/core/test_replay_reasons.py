"""The words of a replay, a shadow and an explanation: which way a guard took the run and
which way it takes it now, which fields of a record differ, how shadow counts runs it could
not replay, what `explain` refuses and what a waiting run would take."""

from __future__ import annotations

import msgspec
import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.engine import start
from interlock.core.state import fold
from support.core import Run, code_review, golden

ORIGINAL = code_review()
changed = code_review

APPROVAL_GUARD = "guard: data.approver in inputs.approvers"


# --- replay: guards ----------------------------------------------------------------------


def test_a_guard_that_now_holds_the_run_says_it_stays() -> None:
    report = analysis.replay(
        golden("code-review-merged-fix-loop"), changed((APPROVAL_GUARD, 'guard: "false"'))
    )
    d = report["divergence"]
    assert (d["seq"], d["kind"]) == (20, "guard")
    assert d["reason"] == (
        "on approval.granted in state 'approval' the run went to 'merge'; now it takes no "
        "`on` entry: on[0] approval.granted -> merge: `false`: false"
    )
    assert d["group"] == "on approval.granted in 'approval': merge -> (stays)"
    assert (d["guard"]["entry"], d["guard"]["outcome"]) == (0, "false")
    assert [(c["entry"], c["outcome"]) for c in d["checks"]] == [(0, "false")]


def test_a_guard_that_now_moves_a_run_that_stayed_says_where() -> None:
    report = analysis.replay(
        golden("code-review-guard-failure"),
        changed(
            (APPROVAL_GUARD, 'guard: "true"'),
            ('approver: "{{ data.approver }}"', "approver: someone"),
        ),
    )
    d = report["divergence"]
    assert (d["seq"], d["kind"]) == (10, "guard")
    assert d["reason"] == (
        "on approval.granted in state 'approval' the run took no `on` entry; now it goes to "
        "'merge': on[0] approval.granted -> merge: `true`: true, fired"
    )
    assert d["group"] == "on approval.granted in 'approval': (stays) -> merge"
    # Only one entry was weighed and it fired: it is the deciding check.
    assert (d["guard"]["entry"], d["guard"]["outcome"]) == (0, "fired")


def test_a_timer_that_now_goes_elsewhere_names_no_guard() -> None:
    report = analysis.replay(
        golden("code-review-approval-expired"),
        changed(
            (
                "        after: 72h\n        goto: rejected\n",
                "        after: 72h\n        goto: merge\n",
            )
        ),
    )
    d = report["divergence"]
    assert (d["seq"], d["kind"]) == (10, "guard")
    assert d["reason"] == (
        "on timer state-timeout in state 'approval' the run went to 'rejected'; now it goes "
        "to 'merge': no `on` entry matches"
    )
    assert d["group"] == "on timer state-timeout in 'approval': rejected -> merge"
    assert "guard" not in d
    assert "checks" not in d


# --- replay: records ---------------------------------------------------------------------


def test_a_record_that_differs_in_many_fields_names_three_in_its_reason() -> None:
    report = analysis.replay(
        golden("code-review-merged-fix-loop"),
        changed(
            (
                '        merged: true\n        pr: "{{ inputs.pr }}"\n'
                '        score: "$.states.review.output.score"\n'
                '        summary: "$.states.review.output.summary"\n',
                '        merged: 1\n        pr: "{{ inputs.pr + 1 }}"\n'
                "        score: 0\n        summary: x\n",
            )
        ),
    )
    d = report["divergence"]
    assert d["differences"] == [
        "data.outputs.merged: recorded true, now 1",
        "data.outputs.pr: recorded 42, now 43",
        "data.outputs.score: recorded 8, now 0",
        'data.outputs.summary: recorded "echo reviewed 2 line(s) of diff: score 8", now "x"',
    ]
    assert d["reason"] == "run.completed differs: " + "; ".join(d["differences"][:3])


def test_a_record_no_longer_written_counts_under_its_own_type() -> None:
    no_expiry = changed(
        (
            "      timeout:\n        after: 72h\n        goto: rejected\n"
            "        set:\n          reason: no approval within 72h\n",
            "",
        )
    )
    d = analysis.replay(golden("code-review-approval-expired"), no_expiry)["divergence"]
    assert d["group"] == "timer.scheduled in state 'review' differs"
    assert (d["recorded"]["type"], d["replayed"]) == ("io.interlock.timer.scheduled", None)


def test_a_record_more_counts_under_the_new_records_type() -> None:
    cut = golden("code-review-rejected")[:2]
    d = analysis.replay(cut, ORIGINAL)["divergence"]
    assert d["reason"].startswith("the new definition writes one more record: action.requested")
    assert d["group"] == "action.requested in state 'review' differs"
    assert d["recorded"] is None


# --- shadow ------------------------------------------------------------------------------


def test_a_shadow_made_directly_names_no_version_and_no_label() -> None:
    summary = analysis.Shadow(ORIGINAL).summary()
    assert summary["candidate"]["version"] is None
    assert summary["candidate"]["label"] is None
    assert (summary["runs"], summary["agree"], summary["diverge"]) == (0, 0, 0)


def test_a_run_shadow_cannot_replay_is_an_error_not_a_divergence() -> None:
    broken = changed(('pr: "{{ data.number }}"', 'pr: "{{ data.nope }}"'))
    shadow = analysis.Shadow(broken)
    shadow.add(golden("code-review-trigger-denied"))
    shadow.add(golden("code-review-merged-fix-loop"))
    summary = shadow.summary()
    assert summary["errors"] == [
        {"run_id": "rdce6416d14fa0c5fdbc2d23e", "error": "no such member in mapping: 'nope'"}
    ]
    assert (summary["runs"], summary["agree"], summary["diverge"]) == (2, 1, 0)


def test_a_group_lists_at_most_its_first_runs_and_counts_them_all() -> None:
    log = golden("code-review-rejected")
    candidate = changed(
        ("reason: denied", "reason: refused"),
        ("guard: context.fixes < 3", "guard: context.fixes < 2"),
    )
    shadow = analysis.Shadow(candidate)
    for _ in range(analysis.RUNS_LISTED + 1):
        shadow.add(log)
    [group] = shadow.summary()["groups"]
    assert group["count"] == analysis.RUNS_LISTED + 1
    assert len(group["runs"]) == analysis.RUNS_LISTED
    first = analysis.replay(log, candidate)["divergence"]
    assert group["example"]["seq"] == first["seq"]


# --- explain -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (0, "--at 0: the log has records 1 to 11"),
        (12, "--at 12: the log has records 1 to 11"),
    ],
)
def test_explain_refuses_a_position_outside_the_log(at: int, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        analysis.explain(golden("code-review-fix-failed"), ORIGINAL, at=at)
    assert str(caught.value) == message


def test_explain_refuses_an_empty_log() -> None:
    with pytest.raises(ValueError) as caught:
        analysis.explain([], ORIGINAL)
    assert str(caught.value) == "an empty log"


def test_explain_at_the_first_record_shows_the_start() -> None:
    report = analysis.explain(golden("code-review-fix-failed"), ORIGINAL, at=1)
    [step] = report["steps"]
    assert (step["seq"], step["why_none"]) == (1, "the run started")
    assert report["run_id"] == "r-golden-failed"
    assert report["waiting"]["state"] == "review"


def test_explain_names_the_first_record_another_definition_does_not_write() -> None:
    no_expiry = changed(
        (
            "      timeout:\n        after: 72h\n        goto: rejected\n"
            "        set:\n          reason: no approval within 72h\n",
            "",
        )
    )
    report = analysis.explain(golden("code-review-approval-expired"), no_expiry)
    assert report["reproduces"] is False
    assert report["mismatch"] == {
        "seq": 8,
        "kind": "record",
        "reason": "the new definition does not write timer.scheduled state-timeout at "
        "2026-03-04T09:00:02.000Z",
    }


def test_explain_names_a_record_another_definition_writes_more() -> None:
    log = golden("code-review-rejected")[:2]
    report = analysis.explain(log, ORIGINAL)
    assert report["reproduces"] is False
    assert report["mismatch"]["seq"] == 3
    assert report["mismatch"]["reason"].startswith(
        "the new definition writes one more record: action.requested review"
    )


# --- what a waiting run takes -------------------------------------------------------------

WAITING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: waits, namespace: default}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: build
      timeout: {after: 1h, goto: late}
      on:
        - event: task.completed
          goto: done
        - event: build.cancelled
          guard: data.force == true
          goto: late
        - event: build.cancelled
          goto: done
        - event: build.paused
          goto: late
    done: {type: terminal}
    late: {type: terminal}
"""


def test_a_run_waiting_on_an_action_also_takes_its_states_events() -> None:
    compiled = compile_sources([("waits.yaml", WAITING)])
    compiled.raise_for_errors()
    definition = compiled.workflows[0]
    state = fold(start(definition, run_id="r-w", inputs={}, now="2026-01-01T00:00:00Z"))
    waiting = analysis.waiting(definition, state)
    [answer] = waiting["answers"]
    assert answer["capability"] == "build"
    assert answer["accepts"] == ["task.completed", "task.failed", "build.cancelled", "build.paused"]
    assert waiting["events"] == [
        {
            "type": "build.cancelled",
            "entries": [
                {"entry": 1, "guard": "data.force == true", "goto": "late"},
                {"entry": 2, "guard": None, "goto": "done"},
            ],
        },
        {"type": "build.paused", "entries": [{"entry": 3, "guard": None, "goto": "late"}]},
    ]
    assert waiting["timers"] == [
        {
            "timer_id": "r-w:3",
            "purpose": "state-timeout",
            "fire_at": "2026-01-01T01:00:00.000Z",
            "goto": "late",
        }
    ]


def test_a_run_in_a_state_the_definition_lacks_waits_on_its_answers_only() -> None:
    state = fold(golden("code-review-merged-fix-loop")[:9])
    assert (state.state, len(state.pending)) == ("fix", 1)
    other = changed(("    fix:\n", "    fixing:\n"), ("goto: fix\n", "goto: fixing\n"))
    waiting = analysis.waiting(other, state)
    assert [a["accepts"] for a in waiting["answers"]] == [["task.completed", "task.failed"]]
    assert waiting["events"] == []
    assert all("goto" not in t for t in waiting["timers"])


def test_explain_says_when_the_entry_that_fired_could_not_be_taken() -> None:
    """The guard fires, its `set` reads a field the event lacks: the run fails instead of
    moving, and no transition is explained by that failure, not by a catch."""
    definition = changed((APPROVAL_GUARD, 'guard: "true"'))
    run = Run(definition, run_id="r-golden-guard")
    run.log = golden("code-review-guard-failure")[:8]
    run.state = fold(run.log)
    run.tick = 100
    run.send("approval.granted", {}, event_id="no-approver")
    assert isinstance(run.log[-1], ev.RunFailed)
    step = analysis.explain(run.log, definition)["steps"][-1]
    assert step["fired"] is None
    assert step["explanation"] == ["on[0] approval.granted -> merge: `true`: true, fired"]
    assert step["why_none"] == "the entry that fired could not be taken: the run failed"


def test_an_answer_recorded_without_its_source_differs_only_in_what_changed() -> None:
    """Logs written before answers named their source: the re-driven answer's source is not
    counted as a difference, only the field the new definition changed."""
    log = []
    for record in golden("code-review-merged-fix-loop"):
        if isinstance(record, ev.ActionCompleted):
            record = msgspec.structs.replace(
                record, data=msgspec.structs.replace(record.data, source=None)
            )
        log.append(record)
    renamed = changed(("            score: last_score", "            score: final_score"))
    d = analysis.replay(log, renamed)["divergence"]
    assert (d["seq"], d["kind"]) == (5, "record")
    assert d["differences"] == [
        "data.context_writes.last_score: recorded 6, now absent",
        "data.context_writes.final_score: not recorded, now 6",
    ]


def test_a_guard_that_no_longer_errors_is_a_guard_divergence() -> None:
    """The recorded guard failed (guard.failed), the new one gives false: both stay, and the
    difference is still the guard's."""
    quiet = changed(
        (APPROVAL_GUARD, "guard: has(data.approver) && data.approver in inputs.approvers")
    )
    d = analysis.replay(golden("code-review-guard-failure"), quiet)["divergence"]
    assert (d["seq"], d["kind"]) == (10, "guard")
    assert d["recorded"]["type"] == "io.interlock.guard.failed"
    assert d["reason"].startswith(
        "on approval.granted in state 'approval' the run took no `on` entry; now it takes no "
        "`on` entry: on[0] approval.granted -> merge: "
    )
    assert d["group"] == "on approval.granted in 'approval': (stays) -> (stays)"


def test_an_action_input_that_differs_names_three_fields_in_its_reason() -> None:
    more = changed(
        (
            '            diff: "{{ inputs.diff }}"\n'
            '            score: "{{ inputs.score + 2 * context.fixes }}"\n',
            "            diff: \"{{ inputs.diff + '!' }}\"\n"
            '            score: "{{ inputs.score + 1 }}"\n'
            "            a: 1\n            b: 2\n",
        )
    )
    d = analysis.replay(golden("code-review-merged-fix-loop"), more)["divergence"]
    assert (d["seq"], d["kind"]) == (3, "action_input")
    assert len(d["differences"]) == 4
    assert d["reason"] == (
        "the input of review (state 'review') differs: " + "; ".join(d["differences"][:3])
    )
    assert d["group"] == "input of review in state 'review' differs"


def test_a_state_the_run_went_to_that_is_gone_names_where_it_goes_instead() -> None:
    renamed = changed(("    fix:\n", "    repair:\n"), ("goto: fix\n", "goto: repair\n"))
    d = analysis.replay(golden("code-review-merged-fix-loop"), renamed)["divergence"]
    assert (d["seq"], d["kind"]) == (6, "state_missing")
    assert d["reason"] == (
        "the run went to state 'fix', which does not exist in the new definition "
        "(it goes to 'repair' instead)"
    )
    assert d["group"] == "state 'fix' no longer exists"


def test_a_replay_names_what_it_was_against() -> None:
    report = analysis.replay(golden("code-review-cancelled"), ORIGINAL)
    assert report["against"] == {
        "name": "code-review",
        "namespace": "default",
        "version": None,
        "spec_hash": ORIGINAL.spec_hash,
        "label": None,
    }


def test_explain_reproduces_a_log_recorded_before_answers_named_their_source() -> None:
    log = [
        msgspec.structs.replace(r, data=msgspec.structs.replace(r.data, source=None))
        if isinstance(r, ev.ActionCompleted)
        else r
        for r in golden("code-review-merged-fix-loop")
    ]
    assert analysis.explain(log, ORIGINAL)["reproduces"] is True
    assert analysis.replay(log, ORIGINAL)["agree"] is True


def test_explain_of_a_run_that_has_only_started_names_it() -> None:
    report = analysis.explain(golden("code-review-cancelled")[:1], ORIGINAL)
    assert report["run_id"] == "r-golden-cancelled"


def test_a_log_whose_records_after_the_start_carry_no_traceparent_still_agrees() -> None:
    """Logs written before every record carried the run's traceparent: the re-driven records
    carry it, and that is not a difference."""
    log = golden("code-review-trigger-denied")
    assert log[0].traceparent is not None
    older = [log[0], *(msgspec.structs.replace(r, traceparent=None) for r in log[1:])]
    assert analysis.replay(older, ORIGINAL)["agree"] is True
    assert analysis.explain(older, ORIGINAL)["reproduces"] is True
