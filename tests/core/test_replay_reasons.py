"""The words of a replay, a shadow and an explanation: which way a guard took the run and
which way it takes it now, which fields of a record differ, how shadow counts runs it could
not replay, what `explain` refuses and what a waiting run would take."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition
from interlock.core.engine import start
from interlock.core.state import fold

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
WORKFLOW = (GOLDEN / "code-review.yaml").read_text()
ORIGINAL = compile_sources([("code-review.yaml", WORKFLOW)]).workflows[0]


def changed(*edits: tuple[str, str]) -> Definition:
    text = WORKFLOW
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    result = compile_sources([("code-review.yaml", text)])
    result.raise_for_errors()
    return result.workflows[0]


def golden(name: str) -> list[ev.AnyRecord]:
    return ev.decode_lines((GOLDEN / f"{name}.jsonl").read_bytes())


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
    assert d["group"] == "action.requested in state '' differs"
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
