"""A run explained and replayed by its own version reproduces what the orchestrator
decided outside the definition, taken as recorded: a limited capability's request that
waited and was admitted, or was admitted at once in the append that asked for it; a run
paused, holding an answer, and resumed; a run started while its workflow was paused."""

from __future__ import annotations

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.capacity import admitted, admitted_at_once, queued
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, link
from interlock.core.engine import resume, started
from interlock.core.limits import admitted as run_admitted
from interlock.core.runpause import pause
from interlock.core.state import fold
from support.core import Run

AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: llm-agent}
spec:
  capabilities:
    - name: llm.complete
      timeout_seconds: 30
      concurrency: {limit: 2, key: input.account}
      rate: {limit: 60, per: 1m, key: input.account}
"""

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: asks}
spec:
  inputs:
    account: {type: string, required: true}
  concurrency:
    - {key: inputs.account, limit: 1}
  initial_state: work
  states:
    work:
      actions:
        - capability: llm.complete
          input: {account: "{{ inputs.account }}"}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def definition() -> Definition:
    compiled = compile_sources([("agent.yaml", AGENT), ("wf.yaml", WORKFLOW)])
    assert not compiled.diagnostics, compiled.diagnostics
    (agent,) = compiled.agents
    return link(compiled.workflows[0], agent.capabilities)


def admitted_run() -> Run:
    """A run queued for its workflow's slot, then admitted, its request held."""
    run = Run(definition(), run_id="r1")
    records, _ = started(run.definition, run_id="r1", inputs={"account": "acme"}, now=run.now())
    run._apply(records)
    run._apply(run_admitted(run.definition, run.state, run.now()))
    return run


def action(run: Run) -> tuple[str, int]:
    requested = next(r for r in reversed(run.log) if isinstance(r, ev.ActionRequested))
    return requested.data.action_id, requested.data.attempt


def reproduced(run: Run) -> None:
    report = analysis.explain(run.log, run.definition)
    assert report["reproduces"], report.get("mismatch")
    replayed = analysis.replay(run.log, run.definition)
    assert replayed["agree"], replayed.get("divergence")


def test_a_request_that_waited_for_its_limits_then_was_admitted_is_reproduced() -> None:
    run = admitted_run()
    action_id, attempt = action(run)
    d, now = run.definition, run.now()
    for limit in ("cap:llm.complete", "cap:llm.complete:rate"):
        run._apply(
            queued(
                d, run.state, now, action_id=action_id, attempt=attempt, limit=limit,
                key="acme", place=1,
            )
        )  # fmt: skip
    run._apply(admitted(d, run.state, run.now(), action_id=action_id, attempt=attempt))
    run.answer({"text": "ok"}, action_id=action_id)
    assert run.state.status == "completed"
    reproduced(run)


def test_a_request_admitted_at_once_in_its_own_append_is_reproduced() -> None:
    run = admitted_run()
    action_id, attempt = action(run)
    at_once = admitted(
        run.definition, run.state, run.now(), action_id=action_id, attempt=attempt, at_once=True
    )
    run._apply(at_once)
    run.answer({"text": "ok"}, action_id=action_id)
    reproduced(run)


def test_a_request_admitted_at_once_in_its_own_record_is_reproduced() -> None:
    run = Run(definition(), run_id="r1")
    records, _ = started(run.definition, run_id="r1", inputs={"account": "acme"}, now=run.now())
    run._apply(records)
    decided = run_admitted(run.definition, run.state, run.now())
    index = next(i for i, r in enumerate(decided) if isinstance(r, ev.ActionRequested))
    went = admitted_at_once(run.definition, (decided, fold(decided, run.state)), run.now(), index)
    assert went is not None
    run._apply(went[0])
    assert not any(isinstance(r, ev.ActionAdmitted) for r in run.log)
    run.answer({"text": "ok"}, action_id=action(run)[0])
    assert run.state.status == "completed"
    reproduced(run)


def test_a_run_paused_holding_its_answer_then_resumed_is_reproduced() -> None:
    run = admitted_run()
    action_id, attempt = action(run)
    run._apply(admitted(run.definition, run.state, run.now(), action_id=action_id, attempt=attempt))
    run._apply(pause(run.state, reason="vendor", now=run.now()))
    assert [type(r) for r in run.answer({"text": "ok"}, action_id=action_id)] == [ev.EventHeld]
    run._apply(resume(run.definition, run.state, run.now()))
    assert run.state.status == "completed"
    reproduced(run)
    steps = analysis.explain(run.log, run.definition)["steps"]
    assert [s["input"]["kind"] for s in steps][-3:] == ["pause", "event", "resume"]


def test_a_run_started_while_its_workflow_was_paused_is_reproduced() -> None:
    run = Run(definition(), run_id="r1")
    records, _ = started(
        run.definition, run_id="r1", inputs={"account": "acme"}, now=run.now(), paused=True
    )
    run._apply(records)
    (queued_run,) = [r for r in run.log if isinstance(r, ev.RunQueued)]
    assert queued_run.data.slots[0].limit == "default/asks@paused"
    run._apply(run_admitted(run.definition, fold(run.log), run.now()))
    action_id, attempt = action(run)
    run._apply(admitted(run.definition, run.state, run.now(), action_id=action_id, attempt=attempt))
    run.answer({"text": "ok"}, action_id=action_id)
    assert run.state.status == "completed"
    reproduced(run)
