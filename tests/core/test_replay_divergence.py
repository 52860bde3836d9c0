"""What replay says when a definition writes other records than the log holds: which
record, which fields (dotted, recorded and now), and the group it counts under."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition
from interlock.core.replay import comparable
from support.core import CODE_REVIEW, GOLDEN, code_review, golden


def changed(old: str, new: str) -> Definition:
    return code_review((old, new))


def divergence(log: str, old: str, new: str) -> dict[str, Any]:
    report = analysis.replay(golden(log), changed(old, new))
    assert report["agree"] is False
    found: dict[str, Any] = report["divergence"]
    return found


def test_an_output_computed_otherwise_is_named_with_both_values() -> None:
    d = divergence(
        "code-review-merged-fix-loop",
        'approver: "{{ context.approver }}"',
        "approver: \"{{ context.approver + '!' }}\"",
    )
    assert (d["seq"], d["kind"]) == (27, "record")
    assert d["differences"] == ['data.outputs.approver: recorded "alice", now "alice!"']
    assert d["reason"] == (
        'run.completed differs: data.outputs.approver: recorded "alice", now "alice!"'
    )
    assert d["group"] == "run.completed in state 'merge' differs"


@pytest.mark.parametrize(
    ("new", "difference"),
    [
        ("        merged: false\n        extra: 1\n", "data.outputs.extra: not recorded, now 1"),
        ("", "data.outputs.merged: recorded false, now absent"),
    ],
)
def test_an_output_added_or_dropped_is_named(new: str, difference: str) -> None:
    d = divergence("code-review-rejected", "        merged: false\n", new)
    assert (d["seq"], d["kind"]) == (38, "record")
    assert d["differences"] == [difference]
    assert d["reason"] == f"run.completed differs: {difference}"


def test_a_record_the_definition_no_longer_writes_is_named() -> None:
    d = divergence(
        "code-review-approval-expired",
        "      timeout:\n        after: 72h\n        goto: rejected\n"
        "        set:\n          reason: no approval within 72h\n",
        "",
    )
    assert (d["seq"], d["kind"]) == (8, "record")
    assert d["reason"] == (
        "the new definition does not write timer.scheduled state-timeout at "
        "2026-03-04T09:00:02.000Z"
    )
    [difference] = d["differences"]
    assert difference.startswith('recorded {"type":"io.interlock.timer.scheduled"')
    assert difference.endswith(", now null")


def test_records_compare_without_what_names_the_version() -> None:
    started = golden("code-review-rejected")[0]
    assert isinstance(started, ev.RunStarted)
    value = comparable(started, started)
    assert "spec_hash" not in value["data"]
    assert "version" not in value["data"]
    assert value["data"]["workflow"] == "code-review"
    assert comparable(None, started) is None


def _waiting_for_review() -> list[ev.AnyRecord]:
    """merged-fix-loop up to its second review: the run waits for answer r-golden-merged:13."""
    return golden("code-review-merged-fix-loop")[:14]


def _original() -> Definition:
    result = compile_sources([("code-review.yaml", CODE_REVIEW)])
    result.raise_for_errors()
    return result.workflows[0]


def test_an_answer_no_run_awaits_is_named() -> None:
    log = _waiting_for_review()
    done = next(r for r in log if isinstance(r, ev.ActionCompleted))
    again = msgspec.structs.replace(
        done, id="r-golden-merged:15", data=msgspec.structs.replace(done.data, event_id="dup")
    )
    d = analysis.replay([*log, again], _original())["divergence"]
    assert (d["seq"], d["kind"]) == (15, "answer_not_awaited")
    assert d["reason"] == (
        "the answer of r-golden-merged:3 is not awaited: the new run is in state 'review'"
    )
    assert d["group"] == "answer of an action no longer awaited"


@pytest.mark.parametrize(
    ("purpose", "reason", "group"),
    [
        ("retry", "the retry timer is not set", "retry timer not set"),
        ("", "timer r-golden-merged:99 is not set", "timer not set"),
    ],
)
def test_a_timer_the_run_never_set_is_named(purpose: str, reason: str, group: str) -> None:
    log = _waiting_for_review()
    fired = ev.TimerFired(
        specversion="1.0",
        id="r-golden-merged:15",
        source=ev.SOURCE,
        subject=log[0].subject,
        time=log[-1].time,
        datacontenttype="application/json",
        data=ev.TimerFiredData(timer_id="r-golden-merged:99", purpose=purpose),
    )
    d = analysis.replay([*log, fired], _original())["divergence"]
    assert (d["seq"], d["kind"]) == (15, "timer_not_set")
    assert d["reason"] == f"{reason} in the new run (state 'review')"
    assert d["group"] == group


def test_an_event_the_state_no_longer_takes_is_named() -> None:
    d = divergence(
        "code-review-guard-failure",
        "        - event: approval.granted\n",
        "        - event: approval.given\n",
    )
    assert (d["seq"], d["kind"]) == (9, "event_not_taken")
    assert d["reason"] == "state 'approval' has no `on` entry for approval.granted"
    assert d["group"] == "approval.granted not taken"


STRICTER = "guard: result.score > 8"


def test_a_guard_that_decides_otherwise_is_named_with_every_check() -> None:
    log = golden("code-review-merged-fix-loop")
    report = analysis.replay(
        log, changed("guard: result.score > 7", STRICTER), version=3, label="s"
    )
    assert (report["against"]["version"], report["against"]["label"]) == (3, "s")
    d = report["divergence"]
    assert (d["seq"], d["kind"], d["state"]) == (16, "guard", "review")
    assert d["reason"] == (
        "on task.completed in state 'review' the run went to 'approval'; now it goes to "
        "'fix': on[0] task.completed -> approval: `result.score > 8` (result.score = 8): "
        "false; on[1] task.completed -> fix: `context.fixes < 3` (context.fixes = 1): "
        "true, fired"
    )
    assert d["group"] == "on task.completed in 'review': approval -> fix"
    assert d["guard"] == {
        "state": "review",
        "event_type": "task.completed",
        "entry": 0,
        "goto": "approval",
        "guard": "result.score > 8",
        "outcome": "false",
        "value": False,
        "reads": {"result.score": 8},
    }


REQUIRED_REPO = "    repository:\n      type: string\n      required: true\n"
TICKET = "    ticket:\n      type: string\n      required: true\n"
SAME = "initial_state: review"  # the definition unchanged: the log is cut


@pytest.mark.parametrize(
    ("cut", "old", "new", "seq", "state", "group"),
    [
        (None, REQUIRED_REPO, REQUIRED_REPO + TICKET, 1, "", "not_started before the first state"),
        (
            None,
            "initial_state: review",
            "initial_state: fix",
            2,
            "",
            "state.entered before the first state differs",
        ),
        (1, SAME, SAME, 2, "", "state.entered before the first state differs"),
        (2, SAME, SAME, 3, "review", "action.requested in state 'review' differs"),
    ],
    ids=["inputs", "initial-state", "cut-after-start", "cut-after-entry"],
)
def test_a_divergence_where_the_run_starts_names_the_state_entered_by_then(
    cut: int | None, old: str, new: str, seq: int, state: str, group: str
) -> None:
    # The step that starts a run has no state before it: the divergence is in the state
    # the recorded run had entered by then, or before the first state (never state '').
    log = golden("code-review-merged-fix-loop")[:cut]
    report = analysis.replay(log, changed(old, new))
    d = report["divergence"]
    assert (d["seq"], d["input"]["kind"], d["state"], d["group"]) == (seq, "start", state, group)
    assert "''" not in d["reason"]


def test_shadow_counts_groups_and_orders_them_by_size() -> None:
    logs = [golden(p.stem) for p in sorted(GOLDEN.glob("*.jsonl"))]
    cut = logs[0][:2]  # a log cut after its first two records
    candidate = changed('message: "Fix PR #{{ inputs.pr }}: {{ context.last_summary }}"', "x")
    summary = analysis.shadow([*logs, [], cut], candidate, version=4, label="cand")
    assert summary["candidate"] == {
        "name": "code-review",
        "namespace": "default",
        "version": 4,
        "spec_hash": candidate.spec_hash,
        "label": "cand",
    }
    assert (summary["runs"], summary["agree"], summary["diverge"]) == (9, 4, 5)
    assert summary["errors"] == []
    first, second = summary["groups"]
    assert (first["kind"], first["count"], first["why"]) == (
        "action_input",
        4,
        "input of echo in state 'fix' differs",
    )
    assert first["where"] == {
        "state": "review",
        "event_type": "task.completed",
        "record": "io.interlock.action.requested",
    }
    assert first["runs"] == sorted(first["runs"])
    assert first["example"]["run_id"] == first["runs"][0]
    assert first["example"]["recorded_end"] == first["example"]["replayed_end"]
    assert (second["kind"], second["count"]) == ("record", 1)
    assert second["where"] == {
        "state": "review",
        "event_type": "start",
        "record": "io.interlock.action.requested",
    }
    assert second["example"]["reason"].startswith(
        "the new definition writes one more record: action.requested review input="
    )
    # Only the fix's input changed: every run still ends as it did.
    assert (summary["same_end"], first["same_end"], second["same_end"]) == (9, 4, 1)
    default = analysis.shadow(logs[:1], candidate)["candidate"]
    assert (default["version"], default["label"]) == (None, None)
