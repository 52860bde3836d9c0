"""Record the golden run logs (run once; the logs are then kept under version control).

    .venv/bin/python tests/golden/record.py                   # record every log again
    .venv/bin/python tests/golden/record.py --refresh-states  # keep the logs, refold them

Each scenario drives the workflow in tests/golden/code-review.yaml (a copy of
examples/code-review.yaml, frozen so that re-recording gives the same logs) through
start/decide/cancel with a fixed clock, and writes

- ``<name>.jsonl``: the run log, one CloudEvent per line (``events.encode``);
- ``<name>.state.json``: the state the log folds to (``state.encode_state``), which the
  test requires byte for byte.

``divergent/`` holds one log whose stored state deliberately does not match what the log
folds to: the test must report it. ``--refresh-states`` is for a deliberate change of the
state's shape: it rewrites the states of the golden logs from the logs as they are (never
the divergent one).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import (
    TIMER_FIRED,
    Incoming,
    cancel,
    decide,
    derive_run_id,
    matching_trigger,
    start,
    trigger_inputs,
)
from interlock.core.state import RunState, encode_state, fold

HERE = Path(__file__).resolve().parent
WORKFLOW = HERE / "code-review.yaml"
DIVERGENT = HERE / "divergent"


class Recorder:
    """Drives one run and keeps its log; one second passes per step."""

    def __init__(self, definition: Definition) -> None:
        self.definition = definition
        self.state = RunState()
        self.log: list[ev.AnyRecord] = []
        self.second = 0
        self.answers = 0

    def now(self) -> str:
        self.second += 1
        return f"2026-03-01T09:{self.second // 60:02d}:{self.second % 60:02d}Z"

    def take(self, records: list[ev.AnyRecord]) -> None:
        self.state = fold(records, self.state)
        self.log.extend(records)

    def start(self, run_id: str, given: dict[str, Any], trigger: Incoming | None = None) -> None:
        inputs, problems = resolve_inputs(self.definition, given)
        assert not problems, problems
        self.take(
            start(
                self.definition,
                run_id=run_id,
                inputs=inputs,
                now=self.now(),
                trigger=trigger,
                traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
        )

    def answer(self, data: Any, event_type: str = "task.completed") -> None:
        self.answers += 1
        action_id = next(iter(self.state.pending))
        event = Incoming(
            type=event_type,
            source="interlock://agent/echo",
            id=f"answer-{self.answers}",
            data=data,
            time=self.now(),
            extensions={"actionid": action_id},
        )
        self.take(decide(self.definition, self.state, event, event.time or ""))

    def send(self, event_type: str, data: Any, event_id: str) -> None:
        event = Incoming(
            type=event_type, source="https://review.example.com", id=event_id, data=data
        )
        self.take(decide(self.definition, self.state, event, self.now()))

    def fire(self, purpose: str) -> None:
        """The run's one due timer for ``purpose`` comes due."""
        (timer_id,) = [t for t, v in self.state.timers.items() if v.purpose == purpose]
        event = Incoming(
            type=TIMER_FIRED,
            source="interlock://timers",
            id=f"timer-{timer_id}",
            extensions={"timerid": timer_id},
        )
        self.take(decide(self.definition, self.state, event, self.now()))

    def cancel(self, reason: str) -> None:
        self.take(cancel(self.definition, self.state, reason=reason, now=self.now()))


def merged_after_fix_loop(r: Recorder) -> None:
    r.start("r-golden-merged", {"repository": "zynax-io/zynax", "pr": 42, "diff": "+ a\n- b\n"})
    r.answer({"score": 6, "summary": "echo reviewed 2 line(s) of diff: score 6"})
    r.answer({"message": "Fix PR #42: echo reviewed 2 line(s) of diff: score 6"})
    r.answer({"score": 8, "summary": "echo reviewed 2 line(s) of diff: score 8"})
    r.send("approval.granted", {"approver": "alice"}, "approval-1")
    r.answer({"message": "Merging zynax-io/zynax#42, approved by alice"})


def guard_failure(r: Recorder) -> None:
    r.start("r-golden-guard", {"repository": "zynax-io/zynax", "pr": 43, "score": 9})
    r.answer({"score": 9, "summary": "echo reviewed 0 line(s) of diff: score 9"})
    r.send("approval.granted", {"by": "alice"}, "approval-1")  # no approver: guard errors
    r.send("approval.granted", {"approver": "mallory"}, "approval-2")  # not an approver
    r.send("approval.granted", {"by": "alice"}, "approval-1")  # a duplicate: ignored
    r.send("approval.granted", {"approver": "bob"}, "approval-3")
    r.answer({"message": "Merging zynax-io/zynax#43, approved by bob"})


def rejected_after_three_fixes(r: Recorder) -> None:
    r.start("r-golden-rejected", {"repository": "zynax-io/zynax", "pr": 44, "score": 1})
    for score in (1, 3, 5):
        r.answer({"score": score, "summary": f"score {score}"})
        r.answer({"message": f"fixing after {score}"})
    r.answer({"score": 7, "summary": "score 7"})


def cancelled(r: Recorder) -> None:
    r.start("r-golden-cancelled", {"repository": "zynax-io/zynax", "pr": 45})
    r.answer({"score": 6, "summary": "score 6"})
    r.cancel("superseded by PR #46")


def fix_failed(r: Recorder) -> None:
    r.start("r-golden-failed", {"repository": "zynax-io/zynax", "pr": 47})
    r.answer({"score": 6, "summary": "score 6"})
    r.answer({"error": {"class": "agent_error", "message": "echo crashed"}}, "task.failed")


def review_retried_then_caught(r: Recorder) -> None:
    r.start("r-golden-retried", {"repository": "zynax-io/zynax", "pr": 49})
    r.fire("action-timeout")  # no answer in 5m: attempt 1 fails as timeout, a retry is due
    r.fire("retry")
    r.answer(
        {"error": {"class": "schema_error", "message": "output misses 'summary'"}}, "task.failed"
    )


def approval_expired(r: Recorder) -> None:
    r.start("r-golden-expired", {"repository": "zynax-io/zynax", "pr": 50, "score": 8})
    r.answer({"score": 8, "summary": "score 8"})
    r.fire("state-timeout")


def started_by_trigger(r: Recorder) -> None:
    event = Incoming(
        type="com.github.pull_request",
        source="https://github.com/zynax-io/zynax",
        id="delivery-7f3a",
        subject="pull/48",
        time="2026-03-01T08:59:59Z",
        data={
            "action": "opened",
            "number": 48,
            "repository": {"full_name": "zynax-io/zynax"},
            "diff": "+ one\n",
        },
    )
    trigger = matching_trigger(r.definition, event)
    assert trigger is not None
    run_id = derive_run_id(r.definition, event.source, event.id)
    r.start(run_id, trigger_inputs(trigger, event), trigger=event)
    r.answer({"score": 10, "summary": "score 10"})
    r.send("approval.denied", {"approver": "bob"}, "denial-1")


SCENARIOS: dict[str, Callable[[Recorder], None]] = {
    "code-review-merged-fix-loop": merged_after_fix_loop,
    "code-review-guard-failure": guard_failure,
    "code-review-rejected": rejected_after_three_fixes,
    "code-review-cancelled": cancelled,
    "code-review-fix-failed": fix_failed,
    "code-review-retried-then-caught": review_retried_then_caught,
    "code-review-approval-expired": approval_expired,
    "code-review-trigger-denied": started_by_trigger,
}


def definition() -> Definition:
    compiled = compile_sources([(str(WORKFLOW), WORKFLOW.read_text())])
    compiled.raise_for_errors()
    return compiled.workflows[0]


def log_bytes(records: list[ev.AnyRecord]) -> bytes:
    return b"".join(ev.encode(r) + b"\n" for r in records)


def state_bytes(state: RunState) -> bytes:
    return encode_state(state) + b"\n"


def record_all() -> None:
    compiled = definition()
    logs: dict[str, list[ev.AnyRecord]] = {}
    for name, scenario in SCENARIOS.items():
        recorder = Recorder(compiled)
        scenario(recorder)
        assert recorder.state.finished, (name, recorder.state.status)
        logs[name] = recorder.log
        (HERE / f"{name}.jsonl").write_bytes(log_bytes(recorder.log))
        (HERE / f"{name}.state.json").write_bytes(state_bytes(recorder.state))
        print(f"wrote {name}: {len(recorder.log)} records, {recorder.state.status}")
    # The divergent pair: the merged run's state next to a log in which one decision was
    # made differently (the fix counter was written as 2, not 1), as a changed engine or
    # a tampered log would give.
    merged = logs["code-review-merged-fix-loop"]
    tampered = [
        replace(r, data=replace(r.data, set={"fixes": 2}))
        if isinstance(r, ev.TransitionFired) and r.data.set == {"fixes": 1}
        else r
        for r in merged
    ]
    assert tampered != merged
    DIVERGENT.mkdir(exist_ok=True)
    (DIVERGENT / "code-review-tampered.jsonl").write_bytes(log_bytes(tampered))
    (DIVERGENT / "code-review-tampered.state.json").write_bytes(state_bytes(fold(merged)))
    print("wrote divergent/code-review-tampered")


def refresh_states() -> None:
    for log in sorted(HERE.glob("*.jsonl")):
        state = fold(ev.decode_lines(log.read_bytes()))
        log.with_suffix(".state.json").write_bytes(state_bytes(state))
        print(f"refolded {log.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--refresh-states",
        action="store_true",
        help="keep the logs; rewrite their .state.json from a fresh fold",
    )
    args = parser.parse_args(argv)
    if args.refresh_states:
        refresh_states()
    else:
        record_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
