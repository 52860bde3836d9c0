"""How each record folds, beyond what the engine's own logs exercise: every record moves
``updated_at`` to its time, records about actions or timers the state no longer holds fold
without error, and the fields of child runs, sub-workflow actions, forks and migrations
reach the state."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.engine import Incoming
from interlock.core.state import RunState, evolve, fold
from support.core import SPAWN_CAPPED_MAP, Run, compile_one

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_every_record_moves_updated_at_to_its_own_time() -> None:
    """The engine writes one time for all the records of a decision, so its logs cannot
    tell a record that forgets to move ``updated_at``; these logs, one second per record,
    can."""
    logs = [*GOLDEN.glob("*.jsonl"), *GOLDEN.glob("control-flow/*.jsonl")]
    logs += GOLDEN.glob("constructs/*.jsonl")  # DAG steps, skips, gates and evidence
    for log in sorted(logs):
        records = ev.decode_lines(log.read_bytes())
        state = RunState()
        for i, record in enumerate(records):
            moment = f"2027-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
            state = evolve(state, replace(record, time=moment))
            assert state.updated_at == moment, (log.name, i, ev.record_type(record))
            assert state.seq == i + 1


ENVELOPE = {
    "specversion": "1.0",
    "source": ev.SOURCE,
    "datacontenttype": "application/json",
}


def _record(cls: type[ev.Record], run_id: str, seq: int, data: object) -> ev.AnyRecord:
    return cls(  # type: ignore[call-arg,return-value]
        id=f"{run_id}:{seq}", subject=run_id, time="2027-01-01T00:00:00Z", data=data, **ENVELOPE
    )


def test_records_about_what_the_state_no_longer_holds_fold_quietly() -> None:
    """A record for an action or a timer the state does not hold (a log cut and spliced by
    a fork, a migration) changes the counters and nothing else."""
    records = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())
    state = fold(records[:3])
    strays = [
        _record(
            ev.ActionCompleted,
            "r",
            4,
            ev.ActionCompletedData(
                action_id="gone", state="review", index=0, result={}, event_type="task.completed"
            ),
        ),
        _record(
            ev.ActionFailed,
            "r",
            5,
            ev.ActionFailedData(
                action_id="gone",
                state="review",
                index=0,
                error=ev.ErrorInfo(error_class="timeout", message="x"),
            ),
        ),
        _record(ev.ActionCancelled, "r", 6, ev.ActionCancelledData(action_id="gone", state="x")),
        _record(ev.TimerFired, "r", 7, ev.TimerFiredData(timer_id="gone")),
        # An item of a map the run is no longer in.
        _record(
            ev.ActionCompleted,
            "r",
            8,
            ev.ActionCompletedData(action_id="gone", state="fan", index=0, result=1, item=2),
        ),
        _record(
            ev.ActionFailed,
            "r",
            9,
            ev.ActionFailedData(
                action_id="gone",
                state="fan",
                index=0,
                item=3,
                error=ev.ErrorInfo(error_class="timeout", message="x"),
            ),
        ),
    ]
    after = fold(strays, state)
    assert after.seq == state.seq + 6
    assert after.pending == state.pending
    assert after.timers == state.timers
    assert after.map is None


GRANDCHILD_CALL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: child}
spec:
  initial_state: call
  states:
    call:
      actions: [{workflow: grandchild}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_a_child_run_keeps_its_parent_and_a_sub_workflow_action_its_workflow() -> None:
    parent = ev.ParentRef(run_id="r-parent", action_id="r-parent:3", attempt=2)
    child = Run(
        compile_one(GRANDCHILD_CALL),
        run_id="r-child",
    )
    child.start(parent=parent)
    assert child.state.parent == parent
    [pending] = child.state.pending.values()
    assert pending.workflow == "grandchild"
    assert pending.capability == ""


def test_a_fork_and_a_migration_move_the_run_to_their_version() -> None:
    records = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())
    state = fold(records[:5])
    forked = evolve(
        state,
        ev.RunForked(
            **ENVELOPE,
            id="f:6",
            subject="f",
            time="2027-01-01T00:00:06Z",
            data=ev.RunForkedData(
                origin_run_id=state.run_id,
                origin_seq=5,
                workflow=state.workflow,
                version=7,
                spec_hash="sha256:forked",
                state=state.state,
            ),
        ),
    )
    assert (forked.seq, forked.updated_at) == (6, "2027-01-01T00:00:06Z")
    assert (forked.version, forked.spec_hash) == (7, "sha256:forked")
    assert forked.state == state.state
    migrated = evolve(
        forked,
        ev.RunMigrated(
            **ENVELOPE,
            id="f:7",
            subject="f",
            time="2027-01-01T00:00:07Z",
            data=ev.RunMigratedData(
                from_version=7,
                from_spec_hash="sha256:forked",
                version=8,
                spec_hash="sha256:migrated",
                checked_through=6,
            ),
        ),
    )
    assert (migrated.seq, migrated.updated_at) == (7, "2027-01-01T00:00:07Z")
    assert (migrated.version, migrated.spec_hash) == (8, "sha256:migrated")
    assert migrated.context == forked.context


def test_a_finished_run_holds_no_pending_action_and_no_timer_however_it_ended() -> None:
    """Whatever the log held in flight when the run ended (the engine cancels first, a log
    from elsewhere need not), a finished run waits for nothing: no action, no timer."""
    records = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())
    state = fold(records[:9])
    assert state.pending
    assert state.timers
    error = ev.ErrorInfo(error_class="agent_error", message="x")
    endings = [
        _record(ev.RunCompleted, "r", 10, ev.RunCompletedData(state="done")),
        _record(ev.RunFailed, "r", 10, ev.RunFailedData(state="fix", error=error)),
        _record(ev.RunCancelled, "r", 10, ev.RunCancelledData(state="fix")),
    ]
    for ending, status in zip(endings, ["completed", "failed", "cancelled"], strict=True):
        after = evolve(state, ending)
        assert (after.status, after.finished) == (status, True)
        assert (after.pending, after.timers) == ({}, {})


def test_an_item_requested_outside_a_map_folds_as_a_plain_pending_action() -> None:
    """``map.started`` is what starts counting items: an item's request without one (a log
    spliced by a fork) is awaited like any action and starts no map."""
    records = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())
    state = fold(records[:7])
    assert state.map is None
    request = ev.ActionRequestedData(
        action_id="r:8", state=state.state, index=0, capability="fan.out", item=4
    )
    after = evolve(state, _record(ev.ActionRequested, "r", 8, request))
    assert after.map is None
    assert after.pending["r:8"].item == 4
    assert after.next_action == 1


def test_a_stored_batch_decodes_from_bytes_or_text_whitespace_and_all() -> None:
    """A decision is stored as a JSON array of records; one record alone (an object) is
    read too, and so is text that starts with whitespace."""
    records = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())
    batch = ev.encode_batch(records[:3])
    assert ev.decode_batch(batch) == records[:3]
    assert ev.decode_batch(b" \n" + batch + b"\n") == records[:3]
    assert ev.decode_batch(batch.decode()) == records[:3]
    assert ev.decode_batch("\t" + batch.decode()) == records[:3]
    single = ev.encode(records[0])
    assert ev.decode_batch(single) == [records[0]]
    assert ev.decode_batch(single.decode() + " ") == [records[0]]


def test_a_fork_awaits_only_the_work_it_asked_for_afresh() -> None:
    """A fork copies the log with the action then in flight and enters that state again:
    it awaits the action it requested itself, not the copied one (answered to the run it
    was forked from, if ever)."""
    records = ev.decode_lines((GOLDEN / "code-review-fix-failed.jsonl").read_bytes())
    assert list(fold(records[:9]).pending) == ["r-golden-failed:8"]
    forked = analysis.fork(
        records,
        9,
        run_id="r-fork",
        definition=compile_one((GOLDEN / "code-review.yaml").read_text()),
        version=1,
        now="2027-01-01T00:00:00Z",
    )
    requested = [r for r in forked[9:] if isinstance(r, ev.ActionRequested)]
    assert [r.data.action_id for r in requested] == ["r-fork:12"]
    state = fold(forked)
    assert list(state.pending) == ["r-fork:12"]
    assert state.pending["r-fork:12"].state == "fix"


def test_a_child_that_counts_spawns_under_a_parent_that_counts_none() -> None:
    """A child run with a spawn total of its own reports what it spent; its parent counts
    no spawns, so the answer settles the action and the parent still counts none."""
    run = Run(compile_one(GRANDCHILD_CALL), run_id="r-parent")
    run.start()
    assert run.state.spawn is None
    action_id = run.pending_id()
    run.deliver(
        Incoming(
            type="task.completed",
            source="interlock://runs/r-child",
            id="r-child.end",
            data={"made": 1},
            extensions={"actionid": action_id, "attempt": "1", "spawns": "2"},
        )
    )
    completed = next(r for r in run.log if isinstance(r, ev.ActionCompleted))
    assert completed.data.spawns == 2
    assert run.state.status == "completed"
    assert run.state.spawn is None
    assert run.state.pending == {}
    assert run.state.states["call"] == {"output": {"made": 1}}
    assert fold(run.log) == run.state


def test_a_map_item_refused_before_it_was_requested_is_done_with() -> None:
    """The spawn total refuses the third item, which is never requested: the map is past
    it (its next item is the fourth) and holds its failure, awaiting only the two asked."""
    run = Run(compile_one(SPAWN_CAPPED_MAP), run_id="r-fan")
    run.start()
    at = next(i for i, r in enumerate(run.log) if isinstance(r, ev.ActionFailed))
    failed = run.log[at]
    assert isinstance(failed, ev.ActionFailed)
    assert (failed.data.item, failed.data.will_retry) == (2, False)
    assert not any(isinstance(r, ev.ActionRequested) and r.data.item == 2 for r in run.log[:at])
    state = fold(run.log[: at + 1])
    assert state.map is not None
    assert state.map.next == 3
    assert list(state.map.failed) == [2]
    assert sorted(p.item for p in state.pending.values() if p.item is not None) == [0, 1]
