"""A kxm webhook definition with a stage no transition leads to (both stages before it
end the run): the hub loads it and never runs it, so interlock validates it with a
warning, leaves that stage out, and runs the rest end to end on a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from interlock.sdk import TaskContext
from interlock.transport.subjects import Subjects
from support.dialects import run_cli
from support.flow import REPO, RecordingAgents, ScriptedStack, path, worker_orchestrator

FILE = REPO / "tests" / "dialects" / "written" / "kxm-early-end.json"
COORDINATOR = "kxm.coordinator"
Stack = ScriptedStack[RecordingAgents]


def test_a_stage_never_entered_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["validate", str(FILE)], capsys)
    assert code == 0, err
    assert "ok  workflow default/triage" in out
    line = next(n for n, text in enumerate(FILE.read_text().splitlines(), 1) if "notify" in text)
    assert err.splitlines() == [
        f"{FILE}:{line}:15: warning: kxm.unreachable-stage: stage 'notify' is never entered: "
        "no transition of a stage a run enters leads to it (the hub loads it and never runs "
        "it); it is left out"
    ]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = RecordingAgents([COORDINATOR])
    async with worker_orchestrator(
        nats_url, subjects, [FILE], agents, worker="kxm-entered", concurrency=2
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_the_stages_entered_run_and_the_run_ends_where_they_say(stack: Stack) -> None:
    answers = {
        "check": {"status": "failed", "summary": "a duplicate of PAY-3"},
        "fix": {"status": "passed", "evidence": {"diff": "closed as a duplicate"}},
    }

    async def coordinator(inp: dict[str, Any], ctx: TaskContext) -> Any:
        return answers[inp["stage"]]

    stack.agents.script(COORDINATOR, coordinator)
    run_id = await stack.client.start("triage", {"issue": {"key": "PAY-7"}})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert path(await stack.records(run_id))[:2] == ["check", "fix"]
    assert [i["stage"] for i in stack.agents.inputs[COORDINATOR]] == ["check", "fix"]
    assert stack.agents.inputs[COORDINATOR][0]["prompt"] == "Triage PAY-7"
    assert state.outputs["stages"] == {"check": "pending", "fix": "passed", "notify": "pending"}
