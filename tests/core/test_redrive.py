"""How a log is cut into the decisions that appended it, and how the input behind each
reads (what `explain` and `replay` show for a step)."""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.redrive import (
    boundaries,
    describe_input,
    event_of,
    steps,
)

ENVELOPE: dict[str, Any] = {
    "specversion": "1.0",
    "source": ev.SOURCE,
    "subject": "r-1",
    "time": "2026-01-01T00:00:00Z",
    "datacontenttype": "application/json",
}


def record(n: int, kind: type[ev.Record], **data: Any) -> ev.AnyRecord:
    data_type = kind.__annotations__["data"]
    data_class = getattr(ev, data_type) if isinstance(data_type, str) else data_type
    made: Any = kind(**ENVELOPE, id=f"r-1:{n}", data=data_class(**data))
    return made


BOOM = ev.ErrorInfo(error_class="timeout", message="no answer in 5s", retryable=True)
LOG = [
    record(1, ev.RunStarted, workflow="w", spec_hash="h", inputs={"pr": 7}),
    record(2, ev.StateEntered, state="review"),
    record(3, ev.ActionRequested, action_id="r-1:3", state="review", index=0, capability="c"),
    # A timeout: the timer fired and the failure it caused are one decision.
    record(4, ev.TimerFired, timer_id="r-1:t1", purpose="action-timeout"),
    record(5, ev.ActionFailed, action_id="r-1:3", state="review", index=0, error=BOOM),
    # An agent's failure right after a timer is an answer of its own.
    record(6, ev.TimerFired, timer_id="r-1:t2", purpose="retry"),
    record(7, ev.ActionRequested, action_id="r-1:3", state="review", index=0, capability="c"),
    record(
        8,
        ev.ActionFailed,
        action_id="r-1:3",
        state="review",
        index=0,
        attempt=2,
        event_id="e-8",
        source="agent://one",
        error=ev.ErrorInfo(error_class="agent_error", message="broke", code="tool_error"),
    ),
    record(9, ev.EventReceived, event={"type": "poke", "id": "e-9", "source": "x", "k": 1}),
    record(10, ev.ActionCompleted, action_id="r-1:3", state="review", index=0, result={"s": 8}),
    record(11, ev.RunCancelled, reason="enough"),
]


def test_a_log_is_cut_where_each_input_was_taken() -> None:
    cut = steps(LOG)
    assert [(s.kind, s.first, s.last) for s in cut] == [
        ("start", 1, 3),
        ("timer", 4, 5),
        ("timer", 6, 7),
        ("answer", 8, 8),
        ("event", 9, 9),
        ("answer", 10, 10),
        ("cancel", 11, 11),
    ]
    assert boundaries(LOG) == [3, 5, 7, 8, 9, 10, 11]
    assert cut[1].head is LOG[3]
    assert steps([]) == []


def test_records_that_begin_no_decision_stay_with_the_one_before() -> None:
    tail = [record(1, ev.StateEntered, state="a"), record(2, ev.StateEntered, state="b")]
    assert [(s.kind, s.first, s.last) for s in steps(tail)] == [("start", 1, 2)]


def test_each_input_reads_as_json() -> None:
    cut = steps(LOG)
    assert [describe_input(s) for s in cut] == [
        {"kind": "start", "inputs": {"pr": 7}},
        {"kind": "timer", "timer_id": "r-1:t1", "purpose": "action-timeout"},
        {"kind": "timer", "timer_id": "r-1:t2", "purpose": "retry"},
        {
            "kind": "answer",
            "type": "task.failed",
            "id": "e-8",
            "action_id": "r-1:3",
            "data": {"error": {"class": "agent_error", "message": "broke", "code": "tool_error"}},
            "source": "agent://one",
        },
        {"kind": "event", "type": "poke", "id": "e-9", "source": "x", "data": None},
        {
            "kind": "answer",
            "type": "task.completed",
            "id": "r-1:10",  # no event id recorded: the record's own
            "action_id": "r-1:3",
            "data": {"s": 8},
        },
        {"kind": "cancel", "reason": "enough"},
    ]


def test_a_retryable_failure_answer_says_so() -> None:
    failed = record(4, ev.ActionFailed, action_id="r-1:3", state="review", index=0, error=BOOM)
    [step] = steps([failed])
    assert describe_input(step)["data"] == {
        "error": {"class": "timeout", "message": "no answer in 5s", "retryable": True}
    }


def test_a_triggered_start_fork_and_migration_read_as_json() -> None:
    trigger = {"type": "pr.opened", "source": "github", "id": "t-1", "data": {"pr": 7}}
    log = [
        record(1, ev.RunStarted, workflow="w", spec_hash="h", trigger=trigger),
        record(
            2,
            ev.RunForked,
            origin_run_id="r-0",
            origin_seq=9,
            workflow="w",
            spec_hash="h",
            state="s",
        ),
        record(
            3,
            ev.RunMigrated,
            from_version=1,
            from_spec_hash="a",
            version=2,
            spec_hash="b",
            checked_through=2,
        ),
    ]
    assert [describe_input(s) for s in steps(log)] == [
        {
            "kind": "start",
            "inputs": {},
            "trigger": {"type": "pr.opened", "source": "github", "id": "t-1"},
        },
        {"kind": "fork", "origin_run_id": "r-0", "origin_seq": 9},
        {"kind": "migrate", "from_version": 1, "version": 2},
    ]


def test_an_event_copy_becomes_the_incoming_event_again() -> None:
    incoming = event_of(
        {
            "specversion": "1.0",
            "type": "poke",
            "source": "x",
            "id": "e-1",
            "time": "2026-01-01T00:00:00Z",
            "subject": "s",
            "data": {"a": 1},
            "runid": "r-1",
            "attempt": 2,
        }
    )
    assert (incoming.type, incoming.source, incoming.id, incoming.data) == (
        "poke",
        "x",
        "e-1",
        {"a": 1},
    )
    assert (incoming.time, incoming.subject) == ("2026-01-01T00:00:00Z", "s")
    assert incoming.extensions == {"runid": "r-1", "attempt": "2"}
    bare = event_of({})
    assert (bare.type, bare.source, bare.id, bare.data, bare.time, bare.subject) == (
        "",
        "",
        "",
        None,
        None,
        None,
    )
