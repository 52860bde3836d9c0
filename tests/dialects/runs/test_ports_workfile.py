"""The Workfile ports in examples/ports/ validate and run end to end on a real nats-server.

Each test runs one ported workflow through the real orchestrator (in process, timers on a
:class:`ManualClock`, so a 48-hour wait and a retry backoff are advanced, not slept), with
the capabilities answered by a real SDK worker whose handlers the test scripts, and checks
what the Workfile seed requires: typed inputs checked before a run exists (defaults bound),
a trigger starting a run, the `outputs` projection on every successful end (a stop step
included; a step that did not run gives null), no outputs when a run fails, deadlines
derived from `run.started_at`, and a call step binding the called file's outputs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.errors import InvalidInputs
from interlock.runtime.flow import child_run_id
from interlock.sdk import AgentError, RetryableError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import (
    RecordingAgents,
    ScriptedStack,
    check_header_command,
    of,
    path,
    port_files,
    worker_orchestrator,
)

AGENTS, WORKFLOWS = port_files("workfile")
CAPABILITIES = ["mail.classify", "ticket.open", "payment.transfer"]
SOURCE = "test://workfile"


# --- every port validates ------------------------------------------------------------------


def test_the_ports() -> None:
    assert [p.name for p in WORKFLOWS] == [
        "workfile-expense-approval.yaml",
        "workfile-inbox-triage.yaml",
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_each_port_validates_with_the_command_in_its_header(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    check_header_command(path, AGENTS, monkeypatch, capsys)


# --- the stack -----------------------------------------------------------------------------

Stack = ScriptedStack[RecordingAgents]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = RecordingAgents(CAPABILITIES)
    async with worker_orchestrator(
        nats_url, subjects, [AGENTS, *WORKFLOWS], agents, worker="workfile-agents", concurrency=8
    ) as (client, timers, _):
        yield Stack(client, timers, agents, source=SOURCE)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- inbox_triage: steps, a stop step, the outputs projection ---------------------------------


async def test_inbox_triage_started_by_its_trigger_opens_a_ticket(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.answer("ticket.open", {"url": "https://desk/T-1"})
    email = {"sender": "ceo@acme.com", "subject": "invoice", "priority_domains": ["acme.com"]}
    await stack.send("email.received", email, id="mail-1")  # `on:` starts the run
    definition, _ = await stack.client.registry.latest("inbox-triage")
    run_id = derive_run_id(definition, SOURCE, "mail-1")
    state = await stack.run_until(run_id, lambda s: s.finished, "the triggered run finished")
    assert state.outputs == {"ticket_url": "https://desk/T-1", "category": "billing"}
    records = await stack.records(run_id)
    assert path(records) == ["classify", "ticket", "done"]
    [started] = of(records, ev.RunStarted)
    assert started.trigger is not None
    assert started.trigger["id"] == "mail-1"
    assert started.spec_hash == definition.spec_hash  # pins owner and version
    [ticket] = stack.agents.inputs["ticket.open"]
    assert (ticket["category"], ticket["priority"]) == ("billing", "high")
    due = instant(ticket["due"]) - instant(state.started_at)  # run.started_at + 4h
    assert timedelta(hours=4) - timedelta(seconds=1) < due <= timedelta(hours=4)


async def test_inbox_triage_an_absent_optional_input_binds_its_default(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.answer("ticket.open", {"url": "https://desk/T-2"})
    run_id = await stack.client.start("inbox-triage", {"sender": "a@b.org", "subject": "hi"})
    state = await stack.finished(run_id)
    assert state.inputs["priority_domains"] == []
    assert stack.agents.inputs["ticket.open"][0]["priority"] == "normal"
    assert state.outputs == {"ticket_url": "https://desk/T-2", "category": "billing"}


async def test_inbox_triage_a_stop_step_still_evaluates_the_outputs(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "spam"})
    run_id = await stack.client.start("inbox-triage", {"sender": "x@spam.biz", "subject": "$$$"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"ticket_url": None, "category": "spam"}  # ticket never ran
    assert path(await stack.records(run_id)) == ["classify", "stopped"]
    assert "ticket.open" not in stack.agents.inputs


async def test_inbox_triage_inputs_are_validated_before_the_run_starts(stack: Stack) -> None:
    given = {"sender": "a@b.org", "priority_domains": "acme.com"}
    with pytest.raises(InvalidInputs) as refused:
        await stack.client.start("inbox-triage", given, run_id="r-refused")
    assert refused.value.problems == [
        "input 'subject' is required (string)",
        "input 'priority_domains' must be list[string], got string",
    ]
    assert await stack.records("r-refused") == []  # no run was created
    assert not stack.agents.inputs


async def test_inbox_triage_recovers_from_a_transient_failure_by_retrying(stack: Stack) -> None:
    async def flaky(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if ctx.attempt == 1:
            raise RetryableError("desk unavailable")
        return {"url": "https://desk/T-3"}

    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.script("ticket.open", flaky)
    run_id = await stack.client.start("inbox-triage", {"sender": "a@b.org", "subject": "hi"})
    await stack.run_until(
        run_id,
        lambda s: any(t.purpose == "retry" for t in s.timers.values()) and not s.pending,
        "the retry backoff",
    )
    await stack.advance(run_id, 10)  # backoff.initial
    state = await stack.finished(run_id)
    assert state.outputs == {"ticket_url": "https://desk/T-3", "category": "billing"}
    attempts = [r.attempt for r in of(await stack.records(run_id), ev.ActionRequested)]
    assert attempts == [1, 1, 2]  # classify, then ticket twice


async def test_inbox_triage_a_failed_run_evaluates_no_outputs(stack: Stack) -> None:
    async def refuse(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise AgentError("desk refused the ticket")

    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.script("ticket.open", refuse)
    run_id = await stack.client.start("inbox-triage", {"sender": "a@b.org", "subject": "hi"})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert (state.error.error_class, state.error.message) == (
        "agent_error",
        "desk refused the ticket",
    )
    assert state.outputs is None
    assert not of(await stack.records(run_id), ev.RunCompleted)


# --- expense_approval: states, initial, a wait with a deadline, a call step -------------------


async def start_approval(stack: Stack, amount: float = 42.5) -> str:
    run_id = await stack.client.start("expense-approval", {"requester": "bob", "amount": amount})
    await stack.run_until(run_id, lambda s: s.state == "awaiting_approval", "the wait")
    return run_id


async def test_expense_approval_granted_calls_the_payout_workfile(stack: Stack) -> None:
    stack.agents.answer("payment.transfer", {"transfer_id": "TR-9"})
    run_id = await start_approval(stack)
    await stack.send("approval.granted", {"approver": "ada"}, id="a-1", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.outputs == {"decision": "approved", "approver": "ada", "transfer_id": "TR-9"}
    assert path(await stack.records(run_id)) == ["awaiting_approval", "paying", "paid"]
    assert stack.agents.inputs["payment.transfer"] == [{"amount": 42.5, "to": "bob"}]
    [call] = of(await stack.records(run_id), ev.ActionRequested)
    child = await stack.client.state(child_run_id(call.action_id, 1))
    assert (child.workflow, child.status, child.outputs) == (
        "expense-payout",
        "completed",
        {"transfer_id": "TR-9"},  # the called file's projection, bound by the call step
    )
    assert child.parent is not None
    assert child.parent.run_id == run_id


async def test_expense_approval_an_approval_by_the_requester_is_not_taken(stack: Stack) -> None:
    stack.agents.answer("payment.transfer", {"transfer_id": "TR-10"})
    run_id = await start_approval(stack)
    await stack.send("approval.granted", {"approver": "bob"}, id="self", run_id=run_id)
    await stack.send("approval.denied", {"reason": "over budget"}, id="d-1", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.outputs == {"decision": "denied", "reason": "over budget", "transfer_id": None}
    assert "payment.transfer" not in stack.agents.inputs


async def test_expense_approval_expires_after_48_hours(stack: Stack) -> None:
    run_id = await start_approval(stack)
    await stack.advance(run_id, 47 * 3600)
    assert (await stack.client.state(run_id)).state == "awaiting_approval"
    await stack.advance(run_id, 3600)
    state = await stack.finished(run_id)
    assert state.outputs == {"decision": "expired", "transfer_id": None}
    fired = of(await stack.records(run_id), ev.TransitionFired)[-1]
    assert (fired.event_type, fired.to_state) == ("state.timeout", "expired")


async def test_expense_approval_a_failed_call_fails_the_run(stack: Stack) -> None:
    stack.agents.answer("payment.transfer", {"transfer_id": "TR-11"})
    run_id = await start_approval(stack, amount=0)  # the transfer refuses a zero amount
    await stack.send("approval.granted", {"approver": "ada"}, id="a-2", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "schema_error"  # from the child's transfer
    assert state.outputs is None
    [call] = of(await stack.records(run_id), ev.ActionRequested)
    child = await stack.client.state(child_run_id(call.action_id, 1))
    assert child.status == "failed"
