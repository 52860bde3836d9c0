"""The state a DAG run folds to in the middle of the run: what each step reads of the
others (``steps.<name>``), what evidence has proven so far, and the DAG's own settings."""

from __future__ import annotations

import msgspec
from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.spawn import SpawnProgress
from interlock.core.state import Chain, DagProgress, RunState, encode_state, fold
from support.core import Run, compile_one, types

RELEASE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: release}
spec:
  evidence: {events: [release.evidence]}
  initial_state: ship
  states:
    ship:
      dag:
        completion: all_settled
        parallelism: 2
        steps:
          build:
            action:
              capability: ci.build
              input: {publish: "{{ steps.publish.status }}"}
          publish:
            depends_on: [build]
            requires: {receipt: verified, approval: true}
            subject: release/publish
            action: {capability: release.publish}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def _started() -> Run:
    run = Run(compile_one(RELEASE), run_id="rel")
    run.start()
    return run


def test_a_step_not_started_reads_pending_and_the_dag_keeps_its_settings() -> None:
    run = _started()
    build = run.log[-1]
    assert isinstance(build, ev.ActionRequested)
    assert build.data.input == {"publish": "pending"}
    assert run.state.dag == DagProgress(
        steps=["build", "publish"],
        parallelism=2,
        completion="all_settled",
        status={"build": "running"},
    )


def test_evidence_for_one_subject_adds_up_predicate_by_predicate() -> None:
    run = _started()
    run.send("release.evidence", {"release/publish": {"receipt": "verified"}}, event_id="e1")
    run.send("release.evidence", {"release/publish": {"approval": "owner"}}, event_id="e2")
    assert run.state.evidence == {"release/publish": {"receipt": "verified", "approval": "owner"}}
    records = run.answer({})
    assert types(records)[-2:] == ["gate.checked", "action.requested"]
    checked = records[-2]
    assert isinstance(checked, ev.GateChecked)
    assert (checked.data.proven, checked.data.missing) == (True, [])


def test_a_step_answered_without_a_source_shows_none() -> None:
    """A log written before answers carried their ``source`` folds to steps that name no
    one (``"source" in steps.build`` is false), not to a source of null."""
    run = _started()
    run.answer({})
    completed = next(r for r in run.log if isinstance(r, ev.ActionCompleted))
    old = [replace(r, data=replace(r.data, source=None)) if r is completed else r for r in run.log]
    assert completed.data.source == "interlock://agent/test"
    state = fold(old)
    assert state.dag is not None
    assert state.dag.view()["build"] == {"status": "completed", "output": {}}


def test_a_state_that_uses_every_later_field_encodes_whole() -> None:
    """The canonical bytes leave out the fields added later only while they are unset; a
    run that uses all of them (a DAG, evidence, a cost, edge budgets, spawns) keeps all."""
    run = _started()
    run.send("release.evidence", {"release/publish": {"receipt": "verified"}}, event_id="e1")
    assert run.state.dag is not None
    assert run.state.evidence is not None
    state = replace(
        run.state,
        cost=1.5,
        spent={"retry": 1},
        spawn=SpawnProgress.of(ev.SpawnBudget(depth=0, allowance=3)),
        history=ev.HistoryLimits(max_records=500, continue_as_new="never"),
        chain=Chain(previous="r-before", link=1, state="build"),
    )
    # The records' size is measured again by every fold, never pinned (see RunState.size).
    assert msgspec.json.decode(encode_state(state), type=RunState) == replace(state, size=0)


def test_a_dag_steps_output_mapping_writes_the_context() -> None:
    text = RELEASE.replace(
        '              input: {publish: "{{ steps.publish.status }}"}\n',
        "              output: {wheel: built_wheel}\n",
    )
    run = Run(compile_one(text), run_id="rel")
    run.start()
    run.answer({"wheel": "w-1.whl"})
    assert run.state.context == {"built_wheel": "w-1.whl"}
