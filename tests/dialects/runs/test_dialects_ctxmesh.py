"""ctxmesh Workflow resources run as written, end to end on a real nats-server: the seed's
examples (tests/dialects/fixtures) applied as they are, and their `interlock convert`
output, reach the same outcome with scripted agents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import (
    REPO,
    RecordingAgents,
    ScriptedStack,
    dialect_files,
    of,
    path,
    worker_orchestrator,
)

FIXTURES = REPO / "tests" / "dialects" / "fixtures"
CAPABILITIES = ["triage-agent", "answer-agent", "billing-agent", "human-handoff-agent"]
Stack = ScriptedStack[RecordingAgents]


@pytest.fixture(params=["as-written", "converted"])
def files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Path]:
    converted = dialect_files("ctxmesh-*.yaml", request.param, tmp_path)
    capsys.readouterr()
    return converted


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
    # ctxmesh's status read back: specHash and observedGeneration are the stored spec hash
    # and version (`interlock get workflow`), and the run pins that hash.
    stored = await stack.client.registry.stored_latest("my-team/triage-then-answer")
    (started,) = of(await stack.records(run_id), ev.RunStarted)
    assert (started.spec_hash, started.version) == (stored.spec_hash, stored.version)
    assert stored.spec_hash.startswith("sha256:")


async def test_interlock_apply_takes_the_file_as_written(
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("INTERLOCK_URL", nats_url)
    monkeypatch.setenv("INTERLOCK_PREFIX", subjects.prefix)
    # A real contract for one of the agents, applied first, is not replaced by the implied one.
    real = tmp_path / "registry.yaml"
    real.write_text(
        "apiVersion: interlock.io/v1\nkind: AgentDef\n"
        "metadata: {name: triage, namespace: my-team}\n"
        "spec: {capabilities: [{name: triage-agent, timeout_seconds: 5}]}\n"
    )
    fixture = FIXTURES / "ctxmesh-support-flow.yaml"
    code = await asyncio.to_thread(interlock_main, ["apply", str(real)])
    assert code == 0
    code = await asyncio.to_thread(interlock_main, ["apply", str(fixture)])
    out = capsys.readouterr().out
    assert code == 0
    assert "applied  workflow my-team/support-flow (version 1)" in out
    assert "agentdef my-team/billing-agent" in out
    assert "agentdef my-team/triage-agent" not in out
    broken = tmp_path / "broken.yaml"
    broken.write_text(fixture.read_text().replace("to: billing", "to: nowhere"))
    code = await asyncio.to_thread(interlock_main, ["apply", str(broken)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{broken}:23:15: ctxmesh.unknown-step: to 'nowhere' names no step" in err
    assert "nothing was applied" in err
