"""ctxmesh Workflow resources run as written, end to end on a real nats-server: the seed's
examples (tests/dialects/fixtures) applied as they are, and their `interlock convert`
output, reach the same outcome with scripted agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import REPO, RecordingAgents, ScriptedStack, path, worker_orchestrator

from interlock.cli.main import main as interlock_main
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects

FIXTURES = REPO / "tests" / "dialects" / "fixtures"
CAPABILITIES = ["triage-agent", "answer-agent", "billing-agent", "human-handoff-agent"]
Stack = ScriptedStack[RecordingAgents]


@pytest.fixture(params=["as-written", "converted"])
def files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Path]:
    originals = sorted(FIXTURES.glob("ctxmesh-*.yaml"))
    if request.param == "as-written":
        return originals
    assert interlock_main(["convert", *map(str, originals), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    return sorted(tmp_path.glob("*.yaml"))


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, files: list[Path]) -> AsyncIterator[Stack]:
    agents = RecordingAgents(CAPABILITIES)
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="ctxmesh-worker", concurrency=4
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


async def test_support_flow_routes_a_tool_error_to_the_fallback(stack: Stack) -> None:
    stack.agents.answer("triage-agent", {"topic": "billing"})

    async def billing(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise AgentError("the invoice tool is down", code="tool_error")

    stack.agents.script("billing-agent", billing)
    stack.agents.answer("human-handoff-agent", {"ticket": "T-1"})
    run_id = await stack.client.start("my-team/support-flow", {"message": "refund please"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"step": "fallback", "output": {"ticket": "T-1"}}
    assert path(await stack.records(run_id)) == ["classify", "billing", "fallback", "done"]
    assert stack.agents.inputs["triage-agent"] == [{"message": "refund please"}]


async def test_support_flow_takes_the_default_branch(stack: Stack) -> None:
    stack.agents.answer("triage-agent", {"topic": "shipping"})
    stack.agents.answer("answer-agent", {"answer": "on its way"})
    run_id = await stack.client.start("my-team/support-flow", {"message": "where is it"})
    state = await stack.finished(run_id)
    assert state.outputs == {"step": "general", "output": {"answer": "on its way"}}


async def test_triage_then_answer_passes_the_topic_on(stack: Stack) -> None:
    stack.agents.answer("triage-agent", {"topic": "billing"})
    stack.agents.answer("answer-agent", {"answer": "42"})
    run_id = await stack.client.start("my-team/triage-then-answer", {})
    state = await stack.finished(run_id)
    assert state.outputs == {"step": "answer", "output": {"answer": "42"}}
    assert stack.agents.inputs["answer-agent"] == [{"topic": "billing"}]
