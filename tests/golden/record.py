"""Record the golden run logs (run deliberately; the logs are then kept under version control).

    .venv/bin/python tests/golden/record.py                   # record every log again
    .venv/bin/python tests/golden/record.py --refresh-states  # keep the logs, refold them

Each scenario drives one of the golden workflows through start/decide/cancel with a fixed
clock: ``code-review.yaml`` here (a copy of examples/code-review.yaml) and
``control-flow/control-flow.yaml`` (parallel actions, a map, a loop, a human wait,
correlation, a run deadline) and ``constructs/constructs.yaml`` (a quorum, a DAG with an
evidence gate and a failure branch, a cost budget), all frozen so that re-recording gives
the same logs. Beside
its workflow, each scenario has

- ``<name>.jsonl``: the run log, one CloudEvent per line (``events.encode``);
- ``<name>.state.json``: the state the whole log folds to (``state.encode_state``);
- ``states/<name>.jsonl``: the state after each record of the log, one per line.

Each folder holds the logs of one workflow only, so a folder can be handed to
``interlock shadow --file`` as the exported runs of that workflow.

``test_golden_logs.py`` runs every scenario again in memory and requires the engine to write
the same log byte for byte and to pass through the same states; so a change to what the
engine writes or how a record folds shows up as a changed golden file, re-recorded here and
reviewed in a commit of its own.

``divergent/`` holds one log whose stored state deliberately does not match what the log
folds to: the test must report it. ``--refresh-states`` is for a deliberate change of the
state's shape: it rewrites the states of the golden logs from the logs as they are (never
the divergent one).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
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
from interlock.core.state import RunState, encode_state, evolve, fold
from interlock.core.vocabulary import TimerPurpose

HERE = Path(__file__).resolve().parent
DIVERGENT = HERE / "divergent"
CONTROL_FLOW = "control-flow/control-flow.yaml"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    """Drives one run and keeps its log, and the state after each record; one second
    passes per step."""

    def __init__(self, definition: Definition) -> None:
        self.definition = definition
        self.state = RunState()
        self.log: list[ev.AnyRecord] = []
        self.states: list[RunState] = []
        self.second = 0
        self.answers = 0

    def now(self) -> str:
        self.second += 1
        return f"2026-03-01T09:{self.second // 60:02d}:{self.second % 60:02d}Z"

    def take(self, records: list[ev.AnyRecord]) -> None:
        for record in records:
            self.state = evolve(self.state, record)
            self.states.append(self.state)
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
                traceparent=TRACEPARENT,
            )
        )

    def pending(self, item: int | None = None, step: str | None = None) -> str:
        """The awaited action (of map or parallel item ``item``, of DAG step ``step``)."""
        found = [
            a
            for a, p in self.state.pending.items()
            if (item is None or p.item == item) and (step is None or p.step == step)
        ]
        assert found, (item, self.state.pending)
        return found[0]

    def answer(
        self,
        data: Any,
        event_type: str = "task.completed",
        item: int | None = None,
        *,
        step: str | None = None,
        source: str = "interlock://agent/echo",
    ) -> None:
        self.answers += 1
        event = Incoming(
            type=event_type,
            source=source,
            id=f"answer-{self.answers}",
            data=data,
            time=self.now(),
            extensions={"actionid": self.pending(item, step)},
        )
        self.take(decide(self.definition, self.state, event, event.time or ""))

    def fail(self, error_class: str, message: str, *, item: int | None = None, **more: Any) -> None:
        error = {"class": error_class, "message": message, **more}
        self.answer({"error": error}, "task.failed", item)

    def fail_step(self, step: str, message: str) -> None:
        error = {"class": "agent_error", "message": message}
        self.answer({"error": error}, "task.failed", step=step)

    def send(self, event_type: str, data: Any, event_id: str) -> None:
        event = Incoming(
            type=event_type, source="https://review.example.com", id=event_id, data=data
        )
        self.take(decide(self.definition, self.state, event, self.now()))

    def fire(self, purpose: str, item: int | None = None) -> None:
        """The run's one due timer for ``purpose`` (of item ``item``) comes due."""
        (timer_id,) = [
            t
            for t, v in self.state.timers.items()
            if v.purpose == purpose and (item is None or v.item == item)
        ]
        event = Incoming(
            type=TIMER_FIRED,
            source="interlock://timers",
            id=f"timer-{timer_id}",
            extensions={"timerid": timer_id},
        )
        self.take(decide(self.definition, self.state, event, self.now()))

    def cancel(self, reason: str) -> None:
        self.take(cancel(self.definition, self.state, reason=reason, now=self.now()))


# --- code-review.yaml -----------------------------------------------------------------


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
    r.fail("agent_error", "echo crashed")


def review_retried_then_caught(r: Recorder) -> None:
    r.start("r-golden-retried", {"repository": "zynax-io/zynax", "pr": 49})
    r.fire("action-timeout")  # no answer in 5m: attempt 1 fails as timeout, a retry is due
    r.fire("retry")
    r.fail("schema_error", "output misses 'summary'")


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


# --- control-flow.yaml ----------------------------------------------------------------

REGIONS = {"regions": ["eu", "us", "ap"], "ticket": "OPS-7"}


def checks_pass(r: Recorder, run_id: str) -> None:
    """Start; both parallel actions succeed (the second after a retry of its own)."""
    r.start(run_id, REGIONS)
    r.fail("platform_error", "runner lost", item=1)  # retryable: a retry of branch 1 is due
    r.answer({"ok": True, "warnings": 0}, item=0)
    r.fire(TimerPurpose.RETRY, item=1)  # branch 1 again: capability test, not lint
    r.answer({"ok": True, "passed": 12}, item=1)


def all_done(r: Recorder) -> None:
    checks_pass(r, "r-golden-cf-done")
    r.answer({"region": "us", "shards": 2}, item=1)  # out of order; item 2 is requested
    r.fail("agent_error", "eu busy", item=0, retryable=True)
    r.fire(TimerPurpose.RETRY, item=0)
    r.answer({"region": "eu", "shards": 3}, item=0)
    r.answer({"region": "ap", "shards": 1}, item=2)
    r.answer({"ready": False})  # the loop's first iteration
    r.answer({"ready": True, "polls": 2})
    r.send("ops.ticket.closed", {"ticket": "OPS-7", "by": "grace"}, "close-1")


def some_regions_failed(r: Recorder) -> None:
    checks_pass(r, "r-golden-cf-regions")
    r.fail("schema_error", "output misses 'shards'", item=0, code="missing_field")
    r.answer({"region": "us", "shards": 2}, item=1)
    r.fail("odd_error", "ap is down", item=2)  # an unknown class is kept as the code


def overdue(r: Recorder) -> None:
    r.start("r-golden-cf-overdue", REGIONS)
    r.answer({"ok": True, "warnings": 1}, item=0)
    r.fire(TimerPurpose.RUN_DEADLINE)  # branch 1 still in flight: cancelled


def loop_stuck(r: Recorder) -> None:
    checks_pass(r, "r-golden-cf-stuck")
    for item, region in enumerate(["eu", "us", "ap"]):
        r.answer({"region": region, "shards": 1}, item=item)
    r.answer({"ready": False})
    r.answer({"building": True})  # until cannot read result.ready: guard.failed, go on
    r.answer({"ready": False})  # the third: out of iterations, caught


def parallel_failed(r: Recorder) -> None:
    r.start("r-golden-cf-parallel", REGIONS)
    r.fire(TimerPurpose.ACTION_TIMEOUT, item=1)  # a timeout is retried
    r.fire(TimerPurpose.RETRY, item=1)
    r.fail("agent_error", "3 tests failed", item=1)  # for good: lint is cancelled


def nobody_closed(r: Recorder) -> None:
    checks_pass(r, "r-golden-cf-unclosed")
    for item, region in enumerate(["eu", "us", "ap"]):
        r.answer({"region": region, "shards": 1}, item=item)
    r.answer({"ready": True, "polls": 1})
    r.fire(TimerPurpose.STATE_TIMEOUT)


# --- constructs/constructs.yaml -------------------------------------------------------

CONSTRUCTS = "constructs/constructs.yaml"


def quorum(r: Recorder, run_id: str) -> None:
    """Start; reviewers a and c answer (two distinct producers): b is cancelled."""
    r.start(run_id, {})
    r.answer({"verdict": "ok"}, item=0, source="interlock://agent/a")
    r.answer({"verdict": "ok"}, item=2, source="interlock://agent/c")


def shipped(r: Recorder) -> None:
    r.start("r-golden-constructs-shipped", {})
    # The evidence comes first, before the DAG even starts: it is kept and counts later.
    r.send("release.evidence", {"release": {"receipt": "verified"}}, "evidence-1")
    r.answer({"verdict": "ok"}, item=0, source="interlock://agent/a")
    r.answer({"verdict": "ok"}, item=2, source="interlock://agent/c")
    r.answer({"wheel": "app.whl", "cost": 1.5}, step="build")
    r.answer({"passed": 12, "cost": 2}, step="test")  # publish still waits for lint
    r.answer({"clean": True}, step="lint")
    r.answer({"url": "https://example.com/app"}, step="publish")


def rolled_back(r: Recorder) -> None:
    quorum(r, "r-golden-constructs-rolled-back")
    r.answer({"wheel": "app.whl"}, step="build")
    r.fail_step("test", "3 tests failed")  # a branch: publish is skipped, rollback runs
    r.answer({"clean": True}, step="lint")
    r.answer({"rolled_back": True}, step="rollback")


def held_then_over_budget(r: Recorder) -> None:
    quorum(r, "r-golden-constructs-over-budget")
    r.answer({"wheel": "app.whl", "cost": 4}, step="build")
    r.answer({"clean": True}, step="lint")
    r.answer({"passed": 12, "cost": 1}, step="test")  # publish is held: no evidence yet
    r.send("release.evidence", {"release": {"receipt": "pending"}}, "evidence-1")
    r.send("release.evidence", {"release": {"receipt": "verified"}}, "evidence-2")
    r.answer({"url": "https://example.com/app", "cost": 6}, step="publish")  # 11 > 10


@dataclass(frozen=True)
class Scenario:
    workflow: str
    """The workflow's file, relative to this folder; the scenario's files go beside it."""
    drive: Callable[[Recorder], None]

    @property
    def folder(self) -> Path:
        return (HERE / self.workflow).parent


SCENARIOS: dict[str, Scenario] = {
    "code-review-merged-fix-loop": Scenario("code-review.yaml", merged_after_fix_loop),
    "code-review-guard-failure": Scenario("code-review.yaml", guard_failure),
    "code-review-rejected": Scenario("code-review.yaml", rejected_after_three_fixes),
    "code-review-cancelled": Scenario("code-review.yaml", cancelled),
    "code-review-fix-failed": Scenario("code-review.yaml", fix_failed),
    "code-review-retried-then-caught": Scenario("code-review.yaml", review_retried_then_caught),
    "code-review-approval-expired": Scenario("code-review.yaml", approval_expired),
    "code-review-trigger-denied": Scenario("code-review.yaml", started_by_trigger),
    "control-flow-done": Scenario(CONTROL_FLOW, all_done),
    "control-flow-some-regions-failed": Scenario(CONTROL_FLOW, some_regions_failed),
    "control-flow-overdue": Scenario(CONTROL_FLOW, overdue),
    "control-flow-loop-stuck": Scenario(CONTROL_FLOW, loop_stuck),
    "control-flow-parallel-failed": Scenario(CONTROL_FLOW, parallel_failed),
    "control-flow-nobody-closed": Scenario(CONTROL_FLOW, nobody_closed),
    "constructs-shipped": Scenario(CONSTRUCTS, shipped),
    "constructs-rolled-back": Scenario(CONSTRUCTS, rolled_back),
    "constructs-over-budget": Scenario(CONSTRUCTS, held_then_over_budget),
}


def log_path(name: str) -> Path:
    return SCENARIOS[name].folder / f"{name}.jsonl"


def state_path(name: str) -> Path:
    return SCENARIOS[name].folder / f"{name}.state.json"


def states_path(name: str) -> Path:
    return SCENARIOS[name].folder / "states" / f"{name}.jsonl"


def definition(workflow: str = "code-review.yaml") -> Definition:
    path = HERE / workflow
    compiled = compile_sources([(str(path), path.read_text())])
    compiled.raise_for_errors()
    return compiled.workflows[0]


def replay(name: str) -> Recorder:
    """Drive scenario ``name`` in memory."""
    scenario = SCENARIOS[name]
    recorder = Recorder(definition(scenario.workflow))
    scenario.drive(recorder)
    return recorder


def log_bytes(records: list[ev.AnyRecord]) -> bytes:
    return b"".join(ev.encode(r) + b"\n" for r in records)


def state_bytes(state: RunState) -> bytes:
    return encode_state(state) + b"\n"


def states_bytes(states: list[RunState]) -> bytes:
    return b"".join(encode_state(s) + b"\n" for s in states)


def record_all() -> None:
    logs: dict[str, list[ev.AnyRecord]] = {}
    for name in SCENARIOS:
        recorder = replay(name)
        assert recorder.state.finished, (name, recorder.state.status)
        logs[name] = recorder.log
        states_path(name).parent.mkdir(exist_ok=True)
        log_path(name).write_bytes(log_bytes(recorder.log))
        states_path(name).write_bytes(states_bytes(recorder.states))
        state_path(name).write_bytes(state_bytes(recorder.state))
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
    for name in SCENARIOS:
        records = ev.decode_lines(log_path(name).read_bytes())
        states: list[RunState] = []
        for record in records:
            states.append(evolve(states[-1] if states else RunState(), record))
        state_path(name).write_bytes(state_bytes(states[-1]))
        states_path(name).write_bytes(states_bytes(states))
        print(f"refolded {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--refresh-states",
        action="store_true",
        help="keep the logs; rewrite their .state.json and states/ from a fresh fold",
    )
    args = parser.parse_args(argv)
    if args.refresh_states:
        refresh_states()
    else:
        record_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
