"""A Workfile that reads a step that may not have run inside larger expressions (its
outputs, a later step's `when`), run end to end on a real nats-server, as written and as
`interlock convert` writes it: the step reads as null, as the Workfile says, where the run
failed with an expression_error once that step was skipped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from interlock.cli.main import main as interlock_main
from interlock.transport.subjects import Subjects
from support.flow import REPO, RecordingAgents, ScriptedStack, path, worker_orchestrator

FILE = REPO / "tests" / "dialects" / "written" / "workfile-escalation.yaml"
Stack = ScriptedStack[RecordingAgents]


@pytest.fixture(params=["as-written", "converted"])
def files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Path]:
    if request.param == "as-written":
        return [FILE]
    assert interlock_main(["convert", str(FILE), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    return sorted(tmp_path.glob("*.yaml"))


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, files: list[Path]) -> AsyncIterator[Stack]:
    agents = RecordingAgents(["mail.classify", "ticket.open", "mail.reply"])
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="workfile-skipped", concurrency=2
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_a_skipped_step_reads_as_null_inside_an_expression(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "billing"})
    stack.agents.answer("mail.reply", {"sent": True})
    run_id = await stack.client.start("mail-escalation", {"subject": "invoice"})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert state.outputs == {"line": "billing / not escalated", "escalated": None}
    assert path(await stack.records(run_id))[:2] == ["classify", "acknowledge"]
    assert stack.agents.inputs["mail.reply"] == [{"text": "filed as billing"}]


async def test_a_step_that_ran_reads_as_its_result(stack: Stack) -> None:
    stack.agents.answer("mail.classify", {"category": "urgent"})
    stack.agents.answer("ticket.open", {"id": "T-9"})
    run_id = await stack.client.start("mail-escalation", {"subject": "outage"})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert state.outputs == {"line": "urgent / T-9", "escalated": "T-9"}
    assert path(await stack.records(run_id))[:2] == ["classify", "escalate"]
    assert "mail.reply" not in stack.agents.inputs
