"""Which answers the orchestrator drops as late rather than dead-letters: those to attempts
the run stopped waiting for itself (read from its log)."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core import events as ev
from interlock.runtime.answers import AnswerKey, late_reason

KEY = AnswerKey("work", "r1", "r1:3", 1)


def record(cls: Any, data: Any) -> Any:
    return cls(
        specversion="1.0",
        id="x",
        source="interlock://test",
        subject="r1",
        time="2026-12-04T00:00:00Z",
        datacontenttype="application/json",
        data=data,
    )


REQUESTED = record(
    ev.ActionRequested,
    ev.ActionRequestedData(action_id="r1:3", state="s", index=0, capability="work"),
)
TIMED_OUT = record(
    ev.ActionFailed,
    ev.ActionFailedData(
        action_id="r1:3", state="s", index=0, error=ev.ErrorInfo(error_class="timeout", message="t")
    ),
)
FAILED = record(
    ev.ActionFailed,
    ev.ActionFailedData(
        action_id="r1:3",
        state="s",
        index=0,
        error=ev.ErrorInfo(error_class="agent_error", message="x"),
    ),
)
COMPLETED = record(ev.ActionCompleted, ev.ActionCompletedData(action_id="r1:3", state="s", index=0))
CANCELLED = record(ev.ActionCancelled, ev.ActionCancelledData(action_id="r1:3", state="s"))
RUN_CANCELLED = record(ev.RunCancelled, ev.RunCancelledData(cancelled_actions=["r1:3"]))
RUN_FAILED = record(
    ev.RunFailed, ev.RunFailedData(error=ev.ErrorInfo(error_class="x", message="y"))
)


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        ([REQUESTED, CANCELLED], "action-cancelled"),
        ([REQUESTED, RUN_CANCELLED], "action-cancelled"),
        ([REQUESTED, TIMED_OUT], "attempt-timed-out"),
        ([REQUESTED, TIMED_OUT, RUN_FAILED], "attempt-timed-out"),
        ([REQUESTED, RUN_FAILED], "run-ended"),
        ([REQUESTED, COMPLETED], None),  # answered already: a dead letter
        ([REQUESTED, FAILED], None),
        ([REQUESTED, COMPLETED, RUN_CANCELLED], None),
        ([CANCELLED], None),  # never requested here
        ([], None),
    ],
)
def test_late_reason(log: list[Any], reason: str | None) -> None:
    assert late_reason(log, KEY) == reason


def test_another_attempt_is_not_this_one() -> None:
    assert late_reason([REQUESTED, TIMED_OUT], AnswerKey("work", "r1", "r1:3", 2)) is None
