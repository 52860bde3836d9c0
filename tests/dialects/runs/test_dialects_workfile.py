"""Workfiles run as written, end to end on a real nats-server: started by their trigger,
through a stop step, a call step into another Workfile, and a wait that an event ends;
the `interlock convert` output runs to the same outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.transport.subjects import Subjects
from support.flow import (
    REPO,
    RecordingAgents,
    ScriptedStack,
    dialect_files,
    eventually,
    of,
    path,
    worker_orchestrator,
)

FIXTURES = REPO / "tests" / "dialects" / "fixtures"
CAPABILITIES = ["mail.classify", "ticket.open", "payment.transfer"]
Stack = ScriptedStack[RecordingAgents]


@pytest.fixture(params=["as-written", "converted"])
def files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Path]:
    converted = dialect_files("workfile-*.yaml", request.param, tmp_path)
    capsys.readouterr()
    return converted


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, files: list[Path]) -> AsyncIterator[Stack]:
    agents = RecordingAgents(CAPABILITIES)
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="workfile-worker", concurrency=4
    ) as (client, timers, _):
        yield Stack(client, timers, agents, source="test://workfile")


async def test_inbox_triage_runs_from_its_trigger_and_records_its_identity(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.answer("ticket.open", {"url": "https://t/1"})
    run_id = await stack.client.start(
        "inbox-triage",
        {"sender": "ada@vip.example", "subject": "invoice", "priority_domains": ["vip.example"]},
    )
    state = await stack.finished(run_id)
    assert state.outputs == {"ticket_url": "https://t/1", "category": "billing"}
    ticket = stack.agents.inputs["ticket.open"][0]
    assert ticket["priority"] == "high"
    assert ticket["category"] == "billing"
    records = await stack.records(run_id)
    started = of(records, ev.RunStarted)[0]
    assert started.context["workfile"] == {
        "format": 1,
        "name": "inbox_triage",
        "owner": "support-team",
        "version": 7,
    }
    # The absent optional input reads as null.
    assert stack.agents.inputs["mail.classify"][0]["note"] is None
    # run.started_at is a timestamp: `run.started_at + duration('4h')` is 4 hours later.
    due = datetime.fromisoformat(ticket["due"].replace("Z", "+00:00"))
    began = next(r for r in records if isinstance(r, ev.RunStarted)).time
    assert due - datetime.fromisoformat(began.replace("Z", "+00:00")) == timedelta(hours=4)


async def test_inbox_triage_starts_from_its_trigger(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "spam"})
    await stack.send("email.received", {"sender": "x@y.z", "subject": "hello"}, id="mail-1")
    runs: list[dict[str, Any]] = []

    async def started() -> bool:
        runs[:] = await stack.client.list_runs("inbox-triage")
        return bool(runs)

    await eventually(started, "a run started by email.received")
    state = await stack.finished(runs[0]["run_id"])
    assert state.outputs == {"ticket_url": None, "category": "spam"}


async def test_inbox_triage_stops_on_spam_with_the_projection(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "spam"})
    run_id = await stack.client.start("inbox-triage", {"sender": "x@y.z", "subject": "win"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"ticket_url": None, "category": "spam"}
    assert path(await stack.records(run_id)) == ["classify", "stopped"]


async def test_expense_approval_waits_then_calls_the_payout(stack: Stack) -> None:
    stack.agents.answer("payment.transfer", {"transfer_id": "tr-9"})
    run_id = await stack.client.start("expense-approval", {"requester": "bob", "amount": 12.5})
    await stack.in_state(run_id, "awaiting_approval")
    # The requester cannot approve his own expense: the run keeps waiting.
    await stack.send("approval.granted", {"approver": "bob"}, id="a1", run_id=run_id)
    await stack.send("approval.granted", {"approver": "ada"}, id="a2", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.outputs == {"approver": "ada", "transfer_id": "tr-9"}
    assert stack.agents.inputs["payment.transfer"] == [{"amount": 12.5, "to": "bob"}]


async def test_expense_approval_denied_has_no_transfer(stack: Stack) -> None:
    run_id = await stack.client.start("expense-approval", {"requester": "bob", "amount": 3})
    await stack.in_state(run_id, "awaiting_approval")
    await stack.send("approval.denied", {}, id="d1", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.outputs == {"approver": None, "transfer_id": None}
    assert path(await stack.records(run_id)) == ["awaiting_approval", "denied"]


async def test_a_required_input_is_checked_before_the_run_starts(stack: Stack) -> None:
    from interlock.runtime.errors import InvalidInputs

    with pytest.raises(InvalidInputs):
        await stack.client.start("inbox-triage", {"sender": "x@y.z"})


CALLER = """\
name: caller
steps:
  - notify: {call: notify_owner}
  - log: {agent: audit.log, with: {ref: "{{ notify.message_id }}"}}
"""


async def test_apply_checks_a_path_into_a_stored_workfiles_outputs(
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("INTERLOCK_URL", nats_url)
    monkeypatch.setenv("INTERLOCK_PREFIX", subjects.prefix)
    callee, caller = tmp_path / "notify.yaml", tmp_path / "caller.yaml"
    caller.write_text(CALLER)

    async def apply(path: Path) -> tuple[int, str]:
        code = await asyncio.to_thread(interlock_main, ["apply", str(path)])
        return code, capsys.readouterr().err

    # The called Workfile, applied first, declares no outputs: the path into its result is
    # an error when the caller is applied on its own, at the path's place.
    callee.write_text("name: notify_owner\nsteps:\n  - send: {agent: mail.send}\n")
    assert (await apply(callee))[0] == 0
    code, err = await apply(caller)
    assert code == 1
    assert (
        f"{caller}:4:41: workfile.call-outputs: notify.message_id: the called Workfile "
        "notify-owner declares no outputs (its result is empty)"
    ) in err
    # Its next version declares another output: still refused, naming what it declares.
    callee.write_text(callee.read_text() + "outputs: {sent: '{{ send.ok }}'}\n")
    assert (await apply(callee))[0] == 0
    code, err = await apply(caller)
    assert code == 1
    assert "has no output 'message_id' (it declares: sent)" in err
    # Once it declares the output read, the caller is applied.
    callee.write_text(
        "name: notify_owner\nsteps:\n  - send: {agent: mail.send}\n"
        "outputs: {message_id: '{{ send.id }}'}\n"
    )
    assert (await apply(callee))[0] == 0
    assert (await apply(caller))[0] == 0
