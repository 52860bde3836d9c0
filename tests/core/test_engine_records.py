"""What the engine writes in the records that the golden runs leave out: a fork's marker and
a migration's, a fail message that is not text, correlation keys read from an event's
attributes, and a map's or a loop's result where a transition reads it."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.engine import Incoming, event_correlation_key, migrate, resume_fork
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

REVIEW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: review, namespace: team-a}
spec:
  inputs: {n: {type: any, default: 1}}
  initial_state: review
  states:
    review:
      actions: [{capability: review, input: {n: "{{ inputs.n }}"}, timeout: 30s}]
      on:
        - {event: task.completed, guard: result.ok == true, goto: done}
        - {event: task.completed, goto: rejected}
    done: {type: terminal}
    rejected:
      type: terminal
      fail: {message: "{{ inputs.n }}", class: agent_error}
"""


def review_run(n: object = 1) -> Run:
    run = Run(compile_one(REVIEW), run_id="rv")
    run.start({"n": n})
    return run


def test_a_fork_marker_names_the_origin_and_the_version_it_goes_on_under() -> None:
    run = review_run()
    other = compile_one(REVIEW.replace("timeout: 30s", "timeout: 60s"))
    assert other.spec_hash != run.definition.spec_hash
    records = resume_fork(
        other,
        run.state,
        origin_run_id="rv-origin",
        origin_seq=4,
        version=3,
        now="2027-02-02T00:00:00Z",
    )
    assert types(records) == ["run.forked", "state.entered", "action.requested", "timer.scheduled"]
    marker = records[0]
    assert isinstance(marker, ev.RunForked)
    assert marker.data == ev.RunForkedData(
        origin_run_id="rv-origin",
        origin_seq=4,
        workflow="review",
        namespace="team-a",
        version=3,
        spec_hash=other.spec_hash,
        state="review",
    )
    assert marker.time == "2027-02-02T00:00:00Z"
    # The work is asked for again under the new definition, with a fresh deadline.
    requested = records[2]
    assert isinstance(requested, ev.ActionRequested)
    assert requested.data.timeout_s == 60.0
    assert requested.data.deadline == "2027-02-02T00:01:00.000Z"


def test_a_migration_record_says_from_what_to_what_and_up_to_where() -> None:
    run = review_run()
    other = compile_one(REVIEW.replace("timeout: 30s", "timeout: 60s"))
    [record] = migrate(other, run.state, version=5, now="2027-02-02T00:00:00Z")
    assert isinstance(record, ev.RunMigrated)
    assert record.time == "2027-02-02T00:00:00Z"
    assert record.subject == "rv"
    assert record.data == ev.RunMigratedData(
        from_version=1,
        from_spec_hash=run.definition.spec_hash,
        version=5,
        spec_hash=other.spec_hash,
        checked_through=run.state.seq,
    )
    run.cancel()
    assert migrate(other, run.state, version=5, now="2027-02-02T00:00:00Z") == []
    assert (
        resume_fork(
            other, run.state, origin_run_id="x", origin_seq=1, version=5, now="2027-02-02T00:00:00Z"
        )
        == []
    )


def test_a_fail_message_that_is_not_text_is_written_as_json() -> None:
    """Documented: a message value that is not a string is written as JSON."""
    for n, message in [([1, "two", None], '[1,"two",null]'), (None, "null"), (True, "true")]:
        run = review_run(n)
        run.answer({"ok": False})
        assert run.state.status == RunStatus.FAILED
        assert run.state.error == ev.ErrorInfo(error_class="agent_error", message=message)
    run = review_run("plain text")
    run.answer({"ok": False})
    assert run.state.error is not None
    assert run.state.error.message == "plain text"


CORRELATED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: order}
spec:
  inputs: {order: {type: string, required: true}}
  correlate:
    key: "{{ inputs.order }}"
    events:
      parcel.shipped: event.subject
      parcel.lost: data.ref
  initial_state: wait
  states:
    wait: {on: [{event: parcel.shipped, goto: done}]}
    done: {type: terminal}
"""


def test_a_correlation_key_may_come_from_the_events_attributes_and_null_is_no_key() -> None:
    definition = compile_one(CORRELATED)
    shipped = Incoming(type="parcel.shipped", source="s", id="1", subject="42")
    assert event_correlation_key(definition, shipped) == "42"
    unnamed = Incoming(type="parcel.shipped", source="s", id="2")  # no subject, no key
    assert event_correlation_key(definition, unnamed) is None
    lost = Incoming(type="parcel.lost", source="s", id="3", data={"ref": None})
    assert event_correlation_key(definition, lost) is None
    numbered = Incoming(type="parcel.lost", source="s", id="4", data={"ref": 42})
    assert event_correlation_key(definition, numbered) == "42"


PARENT = ev.ParentRef(run_id="r-parent", action_id="r-parent:3", attempt=2)


def test_a_child_runs_end_names_its_parent_however_it_ends() -> None:
    """The parent's action is answered from the child's last record: completed, failed by
    a ``fail`` state, failed by the engine (an expression, a budget) or cancelled."""

    def child(n: object = 1) -> Run:
        run = Run(compile_one(REVIEW), run_id="child")
        run.start({"n": n}, parent=PARENT)
        return run

    completed = child()
    completed.answer({"ok": True})
    failed = child()
    failed.answer({"ok": False})
    broken = child()
    broken.answer({"ok": "yes"})  # the guard fails closed, the second entry is taken
    cancelled = child()
    cancelled.cancel("no longer needed")
    ends = [run.log[-1] for run in (completed, failed, broken, cancelled)]
    assert [type(r) for r in ends] == [ev.RunCompleted, ev.RunFailed, ev.RunFailed, ev.RunCancelled]
    assert [r.data.parent for r in ends] == [PARENT] * 4  # type: ignore[union-attr]
    assert [r.data.state for r in ends] == ["done", "rejected", "rejected", "review"]  # type: ignore[union-attr]
    # Failed by the engine: an output that cannot be rendered.
    broken_output = compile_one(
        REVIEW.replace(
            "done: {type: terminal}", 'done: {type: terminal, outputs: {x: "{{ inputs.n.a }}"}}'
        )
    )
    engine_failed = Run(broken_output, run_id="child")
    engine_failed.start({"n": 1}, parent=PARENT)
    engine_failed.answer({"ok": True})
    end = engine_failed.log[-1]
    assert isinstance(end, ev.RunFailed)
    assert (end.data.state, end.data.parent) == ("done", PARENT)
    assert end.data.error.error_class == "expression_error"
