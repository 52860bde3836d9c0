"""How a record and a guard check read: the one-line summaries that `interlock log`,
`explain` and `replay` print, and the JSON shapes docs/debugging.md documents.
"""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.cel import Expression, ExpressionError
from interlock.core.cel_text import plain_cel_error
from interlock.core.engine import GuardCheck
from interlock.core.expr import ABSENT
from interlock.core.record_text import (
    check_json,
    check_text,
    record_json,
    record_line,
    short,
    summarize,
)

ENVELOPE: dict[str, Any] = {
    "specversion": "1.0",
    "id": "e-1",
    "source": ev.SOURCE,
    "subject": "r-1",
    "time": "2026-01-01T00:00:00Z",
    "datacontenttype": "application/json",
}
BOOM = ev.ErrorInfo(error_class="permanent", message="no such branch")


def record(kind: type[ev.Record], **data: Any) -> ev.AnyRecord:
    data_type = kind.__annotations__["data"]
    data_class = getattr(ev, data_type) if isinstance(data_type, str) else data_type
    made: Any = kind(**ENVELOPE, data=data_class(**data))
    return made


def test_short_keeps_compact_json_up_to_120_characters() -> None:
    assert short({"a": [1, None, True, "x"]}) == '{"a":[1,null,true,"x"]}'
    assert short("x" * 118) == '"' + "x" * 118 + '"'  # 120 characters: kept whole
    cut = short("x" * 119)  # 121 characters
    assert cut == '"' + "x" * 116 + "..."
    assert len(cut) == 120


SUMMARIES = [
    (
        record(ev.RunStarted, workflow="review", version=3, spec_hash="h"),
        "run.started review v3",
    ),
    (record(ev.StateEntered, state="review"), "state.entered review"),
    (
        record(
            ev.ActionRequested,
            action_id="r-1:2",
            state="review",
            index=0,
            capability="code.review",
            input={"pr": 7},
        ),
        'action.requested code.review input={"pr":7}',
    ),
    (
        record(
            ev.ActionRequested,
            action_id="r-1:2",
            state="review",
            index=0,
            capability="code.review",
            input=None,
            attempt=2,
        ),
        "action.requested code.review input=null (attempt 2)",
    ),
    (
        record(
            ev.ActionRequested,
            action_id="r-1:2",
            state="review",
            index=0,
            capability="",
            workflow="child-flow",
            input=[1],
            attempt=3,
        ),
        "action.requested child-flow input=[1] (attempt 3)",
    ),
    (
        record(ev.ActionCompleted, action_id="r-1:2", state="review", index=0, result={"s": 8}),
        'action.completed r-1:2 result={"s":8}',
    ),
    (
        record(ev.ActionFailed, action_id="r-1:2", state="review", index=0, error=BOOM),
        "action.failed r-1:2 permanent: no such branch",
    ),
    (
        record(ev.EventReceived, event={"type": "approval.granted", "id": "ev-9"}),
        "event.received approval.granted id=ev-9",
    ),
    (
        record(
            ev.GuardFailed,
            state="review",
            transition=1,
            event_type="task.completed",
            guard="result.score > 7",
            error="no such key",
        ),
        "guard.failed review on[1] `result.score > 7`: no such key in the map",
    ),
    (
        record(
            ev.TransitionFired,
            from_state="review",
            to_state="merge",
            event_type="task.completed",
        ),
        "transition.fired review -> merge on task.completed",
    ),
    (
        record(
            ev.TransitionFired,
            from_state="review",
            to_state="merge",
            event_type="task.completed",
            set={"n": 1},
        ),
        'transition.fired review -> merge on task.completed set={"n":1}',
    ),
    (
        record(
            ev.TimerScheduled,
            timer_id="t-1",
            purpose="retry",
            fire_at="2026-01-01T00:01:00Z",
        ),
        "timer.scheduled retry at 2026-01-01T00:01:00Z",
    ),
    (record(ev.TimerFired, timer_id="t-1", purpose="timeout"), "timer.fired timeout"),
    (record(ev.TimerFired, timer_id="t-1"), "timer.fired t-1"),
    (
        record(ev.RunCompleted, state="done", outputs={"ok": True}),
        'run.completed in done outputs={"ok":true}',
    ),
    (record(ev.RunFailed, state="review", error=BOOM), "run.failed permanent: no such branch"),
    (record(ev.RunCancelled, reason="operator asked"), "run.cancelled: operator asked"),
    (
        record(
            ev.RunForked,
            origin_run_id="r-0",
            origin_seq=12,
            workflow="review",
            version=2,
            spec_hash="h",
            state="merge",
        ),
        "run.forked from r-0 at 12, v2, state merge",
    ),
    (
        record(
            ev.RunMigrated,
            from_version=1,
            from_spec_hash="a",
            version=2,
            spec_hash="b",
            checked_through=9,
        ),
        "run.migrated v1 -> v2",
    ),
    (
        record(ev.ActionCancelled, action_id="r-1:2", state="review", reason="run cancelled"),
        "action.cancelled r-1:2: run cancelled",
    ),
    (record(ev.MapStarted, state="each", items=[1, 2]), "map.started"),
    (record(ev.DagStarted, state="build", steps=["a"]), "dag.started"),
    (
        record(
            ev.RunQueued,
            slots=[
                ev.SlotClaim(limit="default/hello@paused", key="paused", size=0),
                ev.SlotClaim(limit="default/model-api", key="acme", size=3),
            ],
        ),
        "run.queued until default/hello is resumed, for a slot of default/model-api for key 'acme'",
    ),
    (record(ev.RunQueued, slots=[]), "run.queued for no slot (admitted next)"),
    (
        record(ev.RunAdmitted, limits=["default/model-api"]),
        "run.admitted: holds a slot of default/model-api",
    ),
    (
        record(ev.RunAdmitted, limits=["default/hello@paused", "default/model-api"]),
        "run.admitted: default/hello resumed; holds a slot of default/model-api",
    ),
]


@pytest.mark.parametrize(
    ("rec", "text"),
    SUMMARIES,
    ids=[f"{i}-{text.split()[0]}" for i, (_, text) in enumerate(SUMMARIES)],
)
def test_each_record_reads_as_one_line(rec: ev.AnyRecord, text: str) -> None:
    assert summarize(rec) == text


def test_a_long_value_in_a_summary_is_cut() -> None:
    rec = record(ev.RunCompleted, state="done", outputs={"text": "y" * 200})
    line = summarize(rec)
    assert line.startswith('run.completed in done outputs={"text":"yyy')
    assert line.endswith("...")
    assert len(line) == len("run.completed in done outputs=") + 120


def test_a_record_line_has_its_position_type_and_summary() -> None:
    rec = record(ev.StateEntered, state="review")
    assert record_line(4, rec) == {
        "seq": 4,
        "type": "io.interlock.state.entered",
        "summary": "state.entered review",
    }


def test_a_record_as_json_is_its_cloudevent() -> None:
    rec = record(ev.TransitionFired, from_state="a", to_state="b", event_type="go")
    out = record_json(rec)
    assert out == {
        **ENVELOPE,
        "type": "io.interlock.transition.fired",
        "data": {"from": "a", "to": "b", "event_type": "go"},
    }
    assert ev.decode(ev.encode(rec)) == rec


def check(**kw: Any) -> GuardCheck:
    base: dict[str, Any] = {
        "state": "review",
        "event_type": "task.completed",
        "transition": 0,
        "goto": "approval",
        "guard": "result.score > 7",
        "outcome": "false",
    }
    return GuardCheck(**{**base, **kw})


def test_a_check_as_json_is_the_documented_shape() -> None:
    out = check_json(check(value=False, reads={"result.score": 7}))
    assert out == {
        "state": "review",
        "event_type": "task.completed",
        "entry": 0,
        "goto": "approval",
        "guard": "result.score > 7",
        "outcome": "false",
        "value": False,
        "reads": {"result.score": 7},
    }


@pytest.mark.parametrize(
    ("outcome", "value"), [("fired", True), ("false", False), ("not_boolean", "yes")]
)
def test_a_check_that_gave_a_value_shows_it(outcome: str, value: Any) -> None:
    out = check_json(check(outcome=outcome, value=value))
    assert out["value"] == value
    assert "error" not in out
    assert "reads" not in out


def test_a_check_that_failed_shows_its_error_and_no_value() -> None:
    out = check_json(check(outcome="error", error="no such key", value=None))
    assert out["error"] == "no such key in the map"  # in CEL's words, not celpy's
    assert "value" not in out


def test_an_entry_without_a_guard_shows_no_value() -> None:
    out = check_json(check(guard=None, outcome="fired", value=True))
    assert out["guard"] is None
    assert "value" not in out


def test_a_catch_as_json_is_entry_minus_one() -> None:
    assert check_json(check(transition=-1, guard=None, outcome="fired"))["entry"] == -1


def test_a_fired_check_reads_as_text() -> None:
    text = check_text(check(outcome="fired", value=True, reads={"result.score": 8}))
    assert text == (
        "on[0] task.completed -> approval: `result.score > 7` (result.score = 8): true, fired"
    )


def test_a_false_check_reads_as_text() -> None:
    text = check_text(
        check(transition=2, value=False, reads={"result.score": 7, "result.tag": "x"})
    )
    assert text == (
        "on[2] task.completed -> approval: `result.score > 7` "
        '(result.score = 7, result.tag = "x"): false'
    )


def test_a_failed_check_reads_as_text_with_the_absent_path() -> None:
    text = check_text(
        check(
            guard="data.approver in inputs.approvers",
            event_type="approval.granted",
            goto="merge",
            outcome="error",
            error="no such member in mapping: 'approver'",
            reads={"data.approver": ABSENT, "inputs.approvers": ["alice", "bob"]},
        )
    )
    assert text == (
        "on[0] approval.granted -> merge: `data.approver in inputs.approvers` "
        '(data.approver is absent, inputs.approvers = ["alice","bob"]): '
        "error: no field 'approver' (the map has no such key) (fail-closed)"
    )


def test_a_check_that_is_not_a_boolean_reads_as_text() -> None:
    text = check_text(check(guard="result.score", outcome="not_boolean", value={"a": 1}))
    assert text == (
        'on[0] task.completed -> approval: `result.score`: {"a":1}, not a boolean (fail-closed)'
    )


def test_an_entry_without_a_guard_reads_as_fired() -> None:
    assert check_text(check(guard=None, outcome="fired")) == (
        "on[0] task.completed -> approval: no guard, fired"
    )
    assert check_text(
        check(transition=-1, event_type="task.failed", goto="fix", guard=None, outcome="fired")
    ) == ("catch task.failed -> fix: no guard, fired")


def test_a_catch_with_a_guard_reads_as_catch() -> None:
    text = check_text(check(transition=-1, guard="result.retryable", outcome="false", value=False))
    assert text.startswith("catch task.completed -> approval: `result.retryable`")


@pytest.mark.parametrize(
    ("celpy", "cel"),
    [
        (
            "input of action 0 in state 'merge': StringType('alice') with type: "
            "'<class 'celpy.celtypes.StringType'>' does not support field selection",
            "input of action 0 in state 'merge': field selection on a string ('alice'): "
            "a string has no fields",
        ),
        (
            "IntType(1) with type: '<class 'celpy.celtypes.IntType'>' does not support "
            "field selection",
            "field selection on an int (1): an int has no fields",
        ),
        (
            "found no matching overload for Token('RULE', 'relation_gt') applied to "
            "'(<class 'celpy.celtypes.StringType'>, <class 'celpy.celtypes.IntType'>)'",
            "no `>` for string and int",
        ),
        ("no such member in mapping: 'level'", "no field 'level' (the map has no such key)"),
        (
            "output 'x' of state 'y': modulus or divide by zero",
            "output 'x' of state 'y': division by zero",
        ),
        ("an agent's own words", "an agent's own words"),
    ],
)
def test_cel_errors_are_shown_in_cels_words(celpy: str, cel: str) -> None:
    assert plain_cel_error(celpy) == cel
    assert plain_cel_error(cel) == cel  # said once is said


def test_an_error_evaluated_now_is_shown_in_cels_words() -> None:
    with pytest.raises(ExpressionError) as caught:
        Expression("context.approver.name").evaluate({"context": {"approver": "alice"}})
    shown = plain_cel_error(str(caught.value))
    assert shown == "field selection on a string ('alice'): a string has no fields"
    assert "celpy" not in shown
    assert "Type(" not in shown
