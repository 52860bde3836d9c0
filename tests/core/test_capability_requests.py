"""Capability limits in the core: a request of a limited capability is recorded with its
keys and no deadline, waits (``action.queued``) and is admitted once with its deadline
counted from then; the record that ends it names the lines it leaves; the limits are
checked with file:line:col and a rule."""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.capacity import admitted, admitted_at_once, queued
from interlock.core.compiler import compile_sources
from interlock.core.record_text import summarize
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus, TimerPurpose
from support.core import Run, short

AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: llm-agent}
spec:
  capabilities:
    - name: llm.complete
      timeout_seconds: 30
      concurrency: {limit: 2, key: input.account}
      rate: {limit: 60, per: 1m, key: input.account, burst: 3}
    - name: plain
"""

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: asks}
spec:
  inputs:
    account: {type: string, required: true}
    urgent: {type: boolean, default: false}
  initial_state: work
  states:
    work:
      actions:
        - capability: llm.complete
          priority: "inputs.urgent ? 10 : 1"
          input: {account: "{{ inputs.account }}"}
        - capability: plain
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def linked_run(inputs: dict[str, object]) -> Run:
    from interlock.core.definition import link

    compiled = compile_sources([("agent.yaml", AGENT), ("wf.yaml", WORKFLOW)])
    assert not compiled.diagnostics, compiled.diagnostics
    (agent,) = compiled.agents
    run = Run(link(compiled.workflows[0], agent.capabilities), run_id="r1")
    run.start(inputs)
    return run


def test_a_limited_request_is_recorded_with_its_keys_and_no_deadline() -> None:
    run = linked_run({"account": "acme", "urgent": True})
    requested = run.log[-1]
    assert isinstance(requested, ev.ActionRequested)
    assert requested.data.limits == [
        ev.SlotClaim(limit="cap:llm.complete", key="acme", size=2, priority=10),
        ev.SlotClaim(
            limit="cap:llm.complete:rate", key="acme", size=60, priority=10, per_s=60.0, burst=3
        ),
    ]
    assert requested.data.deadline is None
    assert requested.data.timeout_s == 30
    assert not run.state.timers  # no deadline runs while it waits
    pending = run.state.pending[requested.data.action_id]
    assert pending.held
    # Nobody was sent it, so no answer is taken for it.
    assert run.answer({"text": "forged"}) == []


def test_queued_then_admitted_once_with_the_deadline_from_then() -> None:
    run = linked_run({"account": "acme"})
    action_id = run.pending_id()
    records = queued(
        run.definition,
        run.state,
        run.now(),
        action_id=action_id,
        attempt=1,
        limit="cap:llm.complete",
        key="acme",
        place=3,
    )
    assert [short(r) for r in records] == ["action.queued"]
    run._apply(records)
    # Said once: the same again records nothing.
    again = queued(
        run.definition,
        run.state,
        run.now(),
        action_id=action_id,
        attempt=1,
        limit="cap:llm.complete",
        key="acme",
        place=2,
    )
    assert again == []
    now = run.now()
    records = admitted(run.definition, run.state, now, action_id=action_id, attempt=1)
    assert [short(r) for r in records] == ["action.admitted", "timer.scheduled"]
    first = records[0]
    assert isinstance(first, ev.ActionAdmitted)
    assert first.data.deadline == "2026-01-01T00:00:34.000Z"  # 30 s after its admission at 4 s
    run._apply(records)
    assert admitted(run.definition, run.state, run.now(), action_id=action_id, attempt=1) == []
    # Answered: the completion names the lines it leaves.
    done = run.answer({"text": "ok"})
    completed = done[0]
    assert isinstance(completed, ev.ActionCompleted)
    assert completed.data.freed is not None
    assert completed.data.freed.attempt == 1
    assert [c.limit for c in completed.data.freed.limits] == [
        "cap:llm.complete",
        "cap:llm.complete:rate",
    ]
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_admitted_at_once_the_request_carries_its_admission_and_folds_as_recorded() -> None:
    run = linked_run({"account": "acme"})
    index = next(i for i, r in enumerate(run.log) if isinstance(r, ev.ActionRequested))
    now = run.now()
    went = admitted_at_once(run.definition, (run.log, run.state), now, index)
    assert went is not None
    records, state = went
    # The request says when it was admitted, its deadline counted from then; its timeout
    # timer follows the decision's records; nothing else changes, no action.admitted.
    request = records[index]
    assert isinstance(request, ev.ActionRequested)
    assert request.data.admitted_at == now
    assert request.data.deadline == "2026-01-01T00:00:32.000Z"  # 30 s after 2 s
    assert records[:index] == run.log[:index]
    assert records[index + 1 : len(run.log)] == run.log[index + 1 :]
    (timer,) = records[len(run.log) :]
    assert isinstance(timer, ev.TimerScheduled)
    assert (timer.data.purpose, timer.data.fire_at) == (
        TimerPurpose.ACTION_TIMEOUT,
        request.data.deadline,
    )
    assert summarize(request).endswith("admitted at once, dispatched")  # explain's line
    # The state given is the one the records fold to (snapshots and the cache rely on it).
    assert encode_state(fold(records)) == encode_state(state)
    assert not state.pending[request.data.action_id].held
    # Admitted once: not again, at once or by the relay.
    assert admitted_at_once(run.definition, (records, state), run.now(), index) is None
    run.log, run.state = records, state
    assert (
        admitted(run.definition, state, run.now(), action_id=request.data.action_id, attempt=1)
        == []
    )
    # Answered as any dispatched request; its end names the lines it leaves.
    (completed, *_) = run.answer({"text": "ok"}, action_id=request.data.action_id)
    assert isinstance(completed, ev.ActionCompleted)
    assert completed.data.freed is not None
    assert len(completed.data.freed.limits) == 2


def test_a_cancelled_run_names_the_lines_of_its_requests() -> None:
    run = linked_run({"account": "acme"})
    action_id = run.pending_id()
    (cancelled,) = run.cancel()
    assert isinstance(cancelled, ev.RunCancelled)
    assert [f.action_id for f in cancelled.data.freed] == [action_id]
    assert run.state.status == RunStatus.CANCELLED


def test_a_paused_request_loses_its_deadline_until_admitted() -> None:
    run = linked_run({"account": "acme"})
    run._apply(
        admitted(run.definition, run.state, run.now(), action_id=run.pending_id(), attempt=1)
    )
    run.answer({"text": "ok"})
    plain = run.log[-1]
    assert isinstance(plain, ev.ActionRequested)
    assert plain.data.limits == []
    assert plain.data.deadline is None  # "plain" has no timeout
    # Held for its paused capability: the pause's line is one it leaves when it ends.
    records = queued(
        run.definition,
        run.state,
        run.now(),
        action_id=plain.data.action_id,
        attempt=1,
        limit="cap:plain@paused",
        key="paused",
        place=1,
    )
    run._apply(records)
    assert run.state.pending[plain.data.action_id].held
    (cancelled,) = run.cancel()
    assert isinstance(cancelled, ev.RunCancelled)
    assert [c.limit for f in cancelled.data.freed for c in f.limits] == ["cap:plain@paused"]


def test_a_timer_from_before_the_wait_does_not_time_the_request_out() -> None:
    text = AGENT.replace("    - name: plain\n", "    - name: plain\n      timeout_seconds: 5\n")
    compiled = compile_sources([("agent.yaml", text), ("wf.yaml", WORKFLOW)])
    from interlock.core.definition import link

    run = Run(link(compiled.workflows[0], compiled.agents[0].capabilities), run_id="r1")
    run.start({"account": "acme"})
    run._apply(
        admitted(run.definition, run.state, run.now(), action_id=run.pending_id(), attempt=1)
    )
    run.answer({"text": "ok"})
    plain = run.pending_id()
    (timer,) = [t for t, v in run.state.timers.items() if v.action_id == plain]
    run._apply(
        queued(
            run.definition,
            run.state,
            run.now(),
            action_id=plain,
            attempt=1,
            limit="cap:plain@paused",
            key="paused",
            place=1,
        )
    )
    fired = run.fire(TimerPurpose.ACTION_TIMEOUT, timer)
    assert [short(r) for r in fired] == ["timer.fired"]
    assert plain in run.state.pending
    records = admitted(run.definition, run.state, run.now(), action_id=plain, attempt=1)
    admitted_record = records[0]
    assert isinstance(admitted_record, ev.ActionAdmitted)
    assert admitted_record.data.deadline is not None  # 5 s from now, as the request had


def test_limits_are_checked_where_they_are_written() -> None:
    bad = AGENT.replace("key: input.account}", "key: run.id}", 1).replace("per: 1m", "per: 0s")
    found = [f"{d.line}:{d.col} {d.rule}" for d in compile_sources([("a.yaml", bad)]).diagnostics]
    assert found == ["8:36 capability-key", "9:30 bad-duration"]


def test_a_key_that_reads_nothing_and_fails_every_request_is_refused() -> None:
    long = '"' + "k" * 300 + '"'
    bad = AGENT.replace("key: input.account}", f"key: '{long}'}}", 1)
    found = [
        f"{d.line}:{d.col} {d.rule} {d.message}"
        for d in compile_sources([("a.yaml", bad)]).diagnostics
    ]
    assert found == [
        "8:36 capability-key the key is always 300 characters long, not at most 256: every "
        "request would fail"
    ]


def test_a_key_that_cannot_be_computed_fails_the_run() -> None:
    from interlock.core.definition import link

    text = WORKFLOW.replace('input: {account: "{{ inputs.account }}"}', "input: {other: 1}")
    compiled = compile_sources([("agent.yaml", AGENT), ("wf.yaml", text)])
    assert not compiled.diagnostics, compiled.diagnostics
    run = Run(link(compiled.workflows[0], compiled.agents[0].capabilities), run_id="r1")
    run.start({"account": "acme"})
    failed = run.log[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "schema_error"
    assert "the key of cap:llm.complete's limit cannot be computed" in failed.data.error.message
    assert not any(isinstance(r, ev.ActionRequested) for r in run.log)


def test_a_request_turned_away_from_a_full_line_fails_and_is_retried() -> None:
    """``max_waiting`` is in the request's claims; a request its line turns away fails
    (``platform_error``, code ``capacity_line_full``, retryable): its retry policy tries
    again after its backoff, the record frees what it held, and saying it twice records
    nothing twice."""
    from interlock.core.definition import link
    from interlock.core.turnaway import LINE_FULL, turned_away

    agent = AGENT.replace(
        "concurrency: {limit: 2, key: input.account}",
        "concurrency: {limit: 2, key: input.account, max_waiting: 5}",
    )
    workflow = WORKFLOW.replace(
        '          input: {account: "{{ inputs.account }}"}\n',
        '          input: {account: "{{ inputs.account }}"}\n'
        "          retry: {max_attempts: 2, backoff: {initial: 1s}}\n",
    )

    compiled = compile_sources([("agent.yaml", agent), ("wf.yaml", workflow)])
    assert not compiled.diagnostics, compiled.diagnostics
    (linked,) = compiled.agents
    run = Run(link(compiled.workflows[0], linked.capabilities), run_id="r1")
    run.start({"account": "acme"})
    requested = run.log[-1]
    assert isinstance(requested, ev.ActionRequested)
    assert [c.max_waiting for c in requested.data.limits] == [5, 0]
    action_id = run.pending_id()
    now = run.now()
    records = turned_away(
        run.definition, run.state, now, action_id=action_id, attempt=1, message="full"
    )
    assert [short(r) for r in records] == ["action.failed", "timer.scheduled"]
    failed = records[0]
    assert isinstance(failed, ev.ActionFailed)
    assert failed.data.will_retry
    assert failed.data.error == ev.ErrorInfo(
        error_class="platform_error", message="full", retryable=True, code=LINE_FULL
    )
    assert failed.data.freed is not None
    assert failed.data.freed.stopping_until is None  # never dispatched: nothing to stop
    timer = records[1]
    assert isinstance(timer, ev.TimerScheduled)
    assert timer.data.purpose == TimerPurpose.RETRY
    run._apply(records)
    assert (
        turned_away(run.definition, run.state, now, action_id=action_id, attempt=1, message="full")
        == []
    )


def test_max_waiting_is_checked_at_its_file_line_and_column() -> None:
    agent = AGENT.replace(
        "concurrency: {limit: 2, key: input.account}",
        "concurrency: {limit: 2, key: input.account, max_waiting: 0}",
    ).replace("burst: 3}", "burst: 3, max_waiting: 250001}")
    found = [str(d) for d in compile_sources([("agent.yaml", agent)]).diagnostics]
    assert found == [
        "agent.yaml:8:64: invalid-value: spec.capabilities.0.concurrency.max_waiting: "
        "0 is less than the minimum of 1",
        "agent.yaml:9:77: invalid-value: spec.capabilities.0.rate.max_waiting: "
        "250001 is greater than the maximum of 250000",
    ]
