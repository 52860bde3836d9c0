"""Explain, replay against another definition, shadow, fork and migrate, on the golden logs.

The analyses re-drive the recorded inputs through the pure engine; these tests pin what
they say about the recorded runs in tests/golden (and variants of their workflow with one
change each: a guard, a state's name, an action's input).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import TIMER_FIRED, Incoming, decide, start
from interlock.core.expr import read_paths
from interlock.core.state import fold

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
WORKFLOW = (GOLDEN / "code-review.yaml").read_text()
LOGS = sorted(GOLDEN.glob("*.jsonl"))


def compiled(text: str) -> Definition:
    result = compile_sources([("code-review.yaml", text)])
    result.raise_for_errors()
    return result.workflows[0]


def changed(old: str, new: str, text: str = WORKFLOW) -> Definition:
    assert old in text, old
    return compiled(text.replace(old, new))


def golden(name: str) -> list[ev.AnyRecord]:
    return ev.decode_lines((GOLDEN / f"{name}.jsonl").read_bytes())


ORIGINAL = compiled(WORKFLOW)
STRICTER_GUARD = changed("guard: result.score > 7", "guard: result.score > 8")
RENAMED = compiled(
    WORKFLOW.replace("goto: approval", "goto: approve").replace("    approval:\n", "    approve:\n")
)
NEW_FIX_INPUT = changed(
    'message: "Fix PR #{{ inputs.pr }}: {{ context.last_summary }}"',
    'message: "Please fix PR #{{ inputs.pr }}"',
)


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_every_golden_log_agrees_with_its_own_definition(log: Path) -> None:
    records = ev.decode_lines(log.read_bytes())
    report = analysis.replay(records, ORIGINAL)
    assert report["agree"], report["divergence"]
    assert report["same_end"]
    assert report["continuation"] == []
    assert report["skipped"] == []


def test_tracing_guards_changes_no_record() -> None:
    """The guard trace is the analyses' view; the records decided with it are the ones
    decided without it (and so, byte for byte, the golden logs)."""
    records = golden("code-review-guard-failure")
    report = analysis.explain(records, ORIGINAL)
    assert report["reproduces"] is True
    assert sum(len(s["checks"]) for s in report["steps"]) >= 5


def test_steps_cut_a_log_into_its_decisions() -> None:
    cut = analysis.steps(golden("code-review-retried-then-caught"))
    assert [s.kind for s in cut] == ["start", "timer", "timer", "answer"]
    # The timeout's failure belongs to the timer's decision.
    assert [ev.record_type(r).removeprefix(ev.PREFIX) for r in cut[1].records][:2] == [
        "timer.fired",
        "action.failed",
    ]
    assert analysis.boundaries(golden("code-review-fix-failed")) == [4, 9, 11]


def test_explain_names_the_false_guard_and_the_values_it_read() -> None:
    report = analysis.explain(golden("code-review-guard-failure"), ORIGINAL)
    by_input = {s["input"].get("id"): s for s in report["steps"]}
    # approval-1 has no approver: the guard errors (fail-closed), naming the missing value.
    erred = by_input["approval-1"]["checks"][0]
    assert erred["outcome"] == "error"
    assert erred["guard"] == "data.approver in inputs.approvers"
    assert erred["reads"] == {"data.approver": "<absent>", "inputs.approvers": ["alice", "bob"]}
    # approval-2 is mallory's: the guard is false, and says what it read.
    false = by_input["approval-2"]
    assert false["checks"] == [
        {
            "state": "approval",
            "event_type": "approval.granted",
            "entry": 0,
            "goto": "merge",
            "guard": "data.approver in inputs.approvers",
            "outcome": "false",
            "value": False,
            "reads": {"data.approver": "mallory", "inputs.approvers": ["alice", "bob"]},
        }
    ]
    assert false["fired"] is None
    assert "none gave true" in false["why_none"]
    assert false["explanation"] == [
        "on[0] approval.granted -> merge: `data.approver in inputs.approvers` "
        '(data.approver = "mallory", inputs.approvers = ["alice","bob"]): false'
    ]
    # bob's fires, with what its `set` wrote.
    fired = by_input["approval-3"]
    assert fired["fired"]["to"] == "merge"
    assert fired["fired"]["set"] == {"approver": "bob"}
    assert report["steps"][-1]["outputs"]["approver"] == "bob"
    assert report["end"]["status"] == "completed"


def test_explain_at_one_record_and_what_a_waiting_run_waits_for() -> None:
    records = golden("code-review-guard-failure")
    report = analysis.explain(records[:11], ORIGINAL, at=11)
    assert [s["seq"] for s in report["steps"]] == [11]
    waiting = report["waiting"]
    assert waiting["state"] == "approval"
    assert waiting["answers"] == []
    assert [e["type"] for e in waiting["events"]] == ["approval.granted", "approval.denied"]
    assert waiting["events"][0]["entries"][0]["guard"] == "data.approver in inputs.approvers"
    assert waiting["timers"][0]["purpose"] == "state-timeout"
    assert waiting["timers"][0]["goto"] == "rejected"
    with pytest.raises(ValueError, match="records 1 to 11"):
        analysis.explain(records[:11], ORIGINAL, at=12)


def test_explain_says_when_the_definition_is_not_the_one_the_run_ran() -> None:
    report = analysis.explain(golden("code-review-merged-fix-loop"), STRICTER_GUARD)
    assert report["reproduces"] is False
    assert report["mismatch"]["seq"] == 16


def test_replay_finds_a_changed_guard_at_the_transition() -> None:
    records = golden("code-review-merged-fix-loop")
    report = analysis.replay(records, STRICTER_GUARD)
    found = report["divergence"]
    assert report["agree"] is False
    assert found["seq"] == 16
    assert ev.record_type(records[15]) == ev.PREFIX + "transition.fired"
    assert found["kind"] == "guard"
    assert found["recorded"]["data"]["to"] == "approval"
    assert found["replayed"]["data"]["to"] == "fix"
    assert found["guard"]["guard"] == "result.score > 8"
    assert found["guard"]["reads"] == {"result.score": 8}
    assert "result.score = 8" in found["reason"]
    # The new run goes on as far as the recorded inputs allow: to a fix it never got an
    # answer for; the approval and the merge's answer are not awaited there.
    assert (
        report["continuation"][0]["summary"] == "transition.fired review -> fix on task.completed"
    )
    assert [s["seq"] for s in report["skipped"]] == [19, 24]
    assert report["replayed_end"] == {"status": "running", "state": "fix"}
    assert report["same_end"] is False


def test_replay_finds_a_renamed_state() -> None:
    report = analysis.replay(golden("code-review-merged-fix-loop"), RENAMED)
    found = report["divergence"]
    assert (found["seq"], found["kind"]) == (16, "state_missing")
    assert "'approval'" in found["reason"]
    assert "'approve'" in found["reason"]
    # Renamed, not changed: the new run ends the same.
    assert report["same_end"] is True


def test_replay_finds_a_changed_action_input() -> None:
    report = analysis.replay(golden("code-review-merged-fix-loop"), NEW_FIX_INPUT)
    found = report["divergence"]
    assert (found["seq"], found["kind"]) == (8, "action_input")
    assert found["differences"] == [
        'input.message: recorded "Fix PR #42: echo reviewed 2 line(s) of diff: score 6", '
        'now "Please fix PR #42"'
    ]
    assert report["same_end"] is True


def test_replay_reports_an_answer_no_longer_awaited() -> None:
    # Without the fix state's action the fix answer has nothing to answer.
    no_fix_action = changed(
        """      actions:
        - capability: echo
          timeout: 30s
          input:
            message: "Fix PR #{{ inputs.pr }}: {{ context.last_summary }}"
      on:
        - event: task.completed
          goto: review""",
        """      on:
        - event: fix.done
          goto: review""",
    )
    report = analysis.replay(golden("code-review-fix-failed"), no_fix_action)
    found = report["divergence"]
    assert found["seq"] == 8  # the fix's action.requested is no longer written
    report_at_answer = [s for s in report["skipped"] if s["seq"] == 10]
    assert "is not awaited" in report_at_answer[0]["reason"]


def test_shadow_groups_runs_by_where_and_why() -> None:
    logs = [ev.decode_lines(p.read_bytes()) for p in LOGS]
    summary = analysis.shadow(logs, STRICTER_GUARD)
    assert summary["runs"] == len(LOGS)
    # Runs whose review scored 8 go to a fix instead of approval; 9 and 10 still pass, and
    # the runs that never got a score above 7 do not notice.
    (group,) = summary["groups"]
    assert group["kind"] == "guard"
    assert group["where"] == {
        "state": "review",
        "event_type": "task.completed",
        "record": ev.PREFIX + "transition.fired",
    }
    assert sorted(group["runs"]) == ["r-golden-expired", "r-golden-merged"]
    assert group["count"] == 2
    assert summary["diverge"] == 2
    assert summary["agree"] == len(LOGS) - 2
    assert group["example"]["run_id"] in group["runs"]
    # Two changes at once: two groups.
    both = changed(
        'message: "Fix PR #{{ inputs.pr }}: {{ context.last_summary }}"',
        "x",
        WORKFLOW.replace("guard: result.score > 7", "guard: result.score > 8"),
    )
    two = analysis.shadow(logs, both)
    assert sorted(g["kind"] for g in two["groups"]) == ["action_input", "guard"]


def test_fork_copies_the_prefix_and_enters_the_state_again() -> None:
    records = golden("code-review-fix-failed")
    forked = analysis.fork(
        records, 9, run_id="r-fork", definition=NEW_FIX_INPUT, version=2, now="2026-04-01T10:00:00Z"
    )
    assert [r.subject for r in forked] == ["r-fork"] * len(forked)
    assert [r.id for r in forked] == [f"r-fork:{i}" for i in range(1, len(forked) + 1)]
    marker = forked[9]
    assert isinstance(marker, ev.RunForked)
    assert (marker.data.origin_run_id, marker.data.origin_seq) == ("r-golden-failed", 9)
    assert marker.data.state == "fix"
    assert marker.data.version == 2
    again = forked[10:]
    assert [ev.record_type(r).removeprefix(ev.PREFIX) for r in again] == [
        "state.entered",
        "action.requested",
        "timer.scheduled",
    ]
    request = again[1]
    assert isinstance(request, ev.ActionRequested)
    assert request.data.input == {"message": "Please fix PR #47"}
    assert request.data.deadline == "2026-04-01T10:00:30.000Z"
    state = fold(forked)
    assert (state.run_id, state.version, state.state) == ("r-fork", 2, "fix")
    assert list(state.pending) == ["r-fork:12"]
    # The shell acts on the start (to index the run) and on what follows the marker only.
    acted = analysis.acted_on(forked)
    assert [ev.record_type(r).removeprefix(ev.PREFIX) for r in acted] == [
        "run.started",
        "run.forked",
        "state.entered",
        "action.requested",
        "timer.scheduled",
    ]
    assert analysis.acted_on(records) == records
    # A fork's log replays like any other: this one's history was made by the original,
    # what follows the marker by the fix.
    assert analysis.replay(forked, ORIGINAL)["divergence"]["seq"] == 12
    early = analysis.fork(
        records, 4, run_id="r-fork", definition=NEW_FIX_INPUT, version=2, now="2026-04-01T10:00:00Z"
    )
    assert analysis.replay(early, NEW_FIX_INPUT, version=2)["agree"]


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (7, r"middle of a decision; fork at the end of one \(4 or 9\)"),
        (11, "already ended"),
        # Only ends after which the run was still running are offered.
        (10, r"fork at the end of one \(9\)"),
        (0, "records 1 to 11"),
    ],
)
def test_a_fork_that_cannot_be_made_says_why(at: int, message: str) -> None:
    with pytest.raises(analysis.NotPossible, match=message):
        analysis.fork(
            golden("code-review-fix-failed"),
            at,
            run_id="r-x",
            definition=ORIGINAL,
            version=1,
            now="2026-04-01T10:00:00Z",
        )


def test_a_fork_needs_the_state_in_the_definition() -> None:
    with pytest.raises(analysis.NotPossible, match="state 'approval'"):
        analysis.fork(
            golden("code-review-guard-failure"),
            8,
            run_id="r-x",
            definition=RENAMED,
            version=2,
            now="2026-04-01T10:00:00Z",
        )


def test_migration_moves_only_runs_whose_log_agrees() -> None:
    running = golden("code-review-merged-fix-loop")[:14]  # waiting for the second review
    records, report = analysis.migration(
        running, NEW_FIX_INPUT, version=2, now="2026-04-01T10:00:00Z"
    )
    # Its fix was asked for with the old input: it does not agree.
    assert records == []
    assert "diverges from version 2 at record 8" in report["migrate"]
    records, report = analysis.migration(
        running, STRICTER_GUARD, version=2, now="2026-04-01T10:00:00Z"
    )
    assert report["migrate"] is None
    (moved,) = records
    assert isinstance(moved, ev.RunMigrated)
    assert (moved.data.from_version, moved.data.version, moved.data.checked_through) == (1, 2, 14)
    after = fold(records, fold(running))
    assert (after.version, after.spec_hash) == (2, STRICTER_GUARD.spec_hash)
    # Everything else about the run is as it was.
    before = fold(running)
    assert (
        msgspec.structs.replace(
            after,
            version=1,
            spec_hash=ORIGINAL.spec_hash,
            seq=14,
            updated_at=before.updated_at,
            size=before.size,
        )
        == before
    )
    finished = golden("code-review-merged-fix-loop")
    assert analysis.migration(finished, STRICTER_GUARD, version=2, now="x")[0] == []


def test_read_paths_of_guards() -> None:
    assert read_paths("result.score > 7 && result.error['class'] == 'x'") == (
        ("result", "score"),
        ("result", "error", "class"),
    )
    assert read_paths("data.approver in inputs.approvers") == (
        ("data", "approver"),
        ("inputs", "approvers"),
    )
    assert read_paths("size(states.review.output.items) > 0") == (
        ("states", "review", "output", "items"),
    )


def test_a_run_that_changed_versions_is_explained_by_each_in_its_turn() -> None:
    forked = analysis.fork(
        golden("code-review-fix-failed"),
        9,
        run_id="r-fork",
        definition=NEW_FIX_INPUT,
        version=2,
        now="2026-04-01T10:00:00Z",
    )
    assert analysis.versions_named(forked) == [1, 2]
    # The history was decided by version 1, what follows the fork by version 2.
    assert analysis.explain(forked, NEW_FIX_INPUT)["reproduces"] is False
    both = analysis.explain(forked, NEW_FIX_INPUT, versions={1: ORIGINAL, 2: NEW_FIX_INPUT})
    assert both["reproduces"] is True
    assert both["waiting"]["answers"][0]["capability"] == "echo"


def test_redrive_writes_the_recorded_log_with_its_own_definition() -> None:
    for log in LOGS:
        records = ev.decode_lines(log.read_bytes())
        again = analysis.redrive(records, ORIGINAL, version=1)
        assert [r.id for r in again] == [r.id for r in records]
        for new, old in zip(again, records, strict=True):
            assert new.data == old.data, (log.stem, old.id)


# --- properties: random runs of the golden workflow ---------------------------------------

_move = st.one_of(
    st.tuples(st.just("answer"), st.integers(0, 11)),
    st.tuples(st.just("fail"), st.sampled_from(["timeout", "agent_error", "schema_error"])),
    st.tuples(st.just("event"), st.sampled_from(["alice", "mallory", None, "deny"])),
    st.tuples(st.just("timer"), st.integers(0, 3)),
)


def _random_run(moves: list[tuple[str, Any]]) -> list[ev.AnyRecord]:
    """A run of the golden workflow driven by ``moves`` through the engine, as it is live."""
    inputs, _ = resolve_inputs(ORIGINAL, {"repository": "acme/app", "pr": 1})
    log = list(start(ORIGINAL, run_id="r-prop", inputs=inputs, now="2026-03-01T09:00:00Z"))
    state = fold(log)
    for n, (kind, value) in enumerate(moves, start=1):
        now = f"2026-03-01T09:{n // 60:02d}:{n % 60:02d}Z"
        if kind in ("answer", "fail") and state.pending:
            action_id = sorted(state.pending)[0]
            data: Any = (
                {"score": value, "summary": f"s{value}"}
                if kind == "answer"
                else {"error": {"class": value, "message": "no"}}
            )
            incoming = Incoming(
                type="task.completed" if kind == "answer" else "task.failed",
                source="interlock://agent/prop",
                id=f"a-{n}",
                data=data,
                extensions={"actionid": action_id},
            )
        elif kind == "event":
            incoming = Incoming(
                type="approval.denied" if value == "deny" else "approval.granted",
                source="urn:prop",
                id=f"e-{n}",
                data={} if value in (None, "deny") else {"approver": value},
            )
        elif kind == "timer" and state.timers:
            timers = sorted(state.timers)
            timer_id = timers[value % len(timers)]
            incoming = Incoming(
                type=TIMER_FIRED, source="t", id=timer_id, extensions={"timerid": timer_id}
            )
        else:
            continue
        out = decide(ORIGINAL, state, incoming, now)
        log.extend(out)
        state = fold(out, state)
    return log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_move, min_size=1, max_size=25))
def test_any_run_replays_against_its_own_definition_and_diverges_only_where_it_differs(
    moves: list[tuple[str, Any]],
) -> None:
    log = _random_run(moves)
    same = analysis.replay(log, ORIGINAL)
    assert same["agree"], same["divergence"]
    assert analysis.explain(log, ORIGINAL)["reproduces"] is True
    assert analysis.redrive(log, ORIGINAL) == log
    stricter = analysis.replay(log, STRICTER_GUARD)
    found = stricter["divergence"]
    again = analysis.redrive(log, STRICTER_GUARD)
    event("diverged" if found is not None else "agreed")
    if found is None:
        assert [ev.encode(r) for r in again][1:] == [ev.encode(r) for r in log][1:]
        return
    # Everything before the first divergence is what the log holds, and the divergence is
    # a guard weighed on a score of 8 (the only score the two guards disagree on).
    seq = found["seq"]
    assert [ev.encode(r) for r in again[1 : seq - 1]] == [ev.encode(r) for r in log[1 : seq - 1]]
    assert found["kind"] == "guard"
    assert found["guard"]["reads"] == {"result.score": 8}
