"""The synapse ports (examples/ports/synapse-*.yaml) validate and run end to end.

Each test runs one ported workflow on a real nats-server through an in-process orchestrator
whose timers run on a :class:`ManualClock`, with the capabilities answered by a real SDK
worker in this process, and checks the outcome synapse's documentation gives for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.runtime.flow import child_run_id
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import (
    REPO,
    WAIT,
    Handler,
    ScriptedAgents,
    ScriptedStack,
    of,
    port_files,
    worker_orchestrator,
)

AGENTS, WORKFLOWS = port_files("synapse")
CAPABILITIES = ["ci", "release", "task"]


# --- the ports validate ---------------------------------------------------------------------


def test_each_synapse_example_is_ported() -> None:
    assert [p.name for p in WORKFLOWS] == [
        "synapse-ingest.yaml",
        "synapse-release-branch.yaml",
        "synapse-release-evidence.yaml",
        "synapse-release.yaml",
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_validate_command_in_each_header_passes(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agents = AGENTS.relative_to(REPO)
    command = f"#   interlock validate examples/ports/{path.name} --agents {agents}"
    assert command in path.read_text().splitlines()
    monkeypatch.chdir(REPO)
    argv = command.removeprefix("#   interlock ").split()
    assert interlock_main(argv) == 0, capsys.readouterr()


# --- the stack ------------------------------------------------------------------------------


class Agents(ScriptedAgents):
    """Synapse's workers, in this process: each answers with the task it was given unless a
    test scripts its capability."""

    def __init__(self) -> None:
        super().__init__(CAPABILITIES)
        self.tasks: list[tuple[str, str]] = []
        """(capability, task id) in the order the handlers started."""
        self.inputs: dict[str, dict[str, Any]] = {}
        """Task id -> the input it was given."""

    def received(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> None:
        self.tasks.append((capability, inp["task"]))
        self.inputs[inp["task"]] = inp

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        return {"task": inp["task"]}


Stack = ScriptedStack[Agents]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = Agents()
    async with worker_orchestrator(
        nats_url, subjects, [AGENTS, *WORKFLOWS], agents, worker="synapse-worker", concurrency=8
    ) as (client, timers, _):
        yield Stack(client, timers, agents, source="test://synapse")


async def cancel(inp: dict[str, Any], ctx: TaskContext) -> Any:
    """A worker that gives the task up: synapse's `cancelled`."""
    raise AgentError(f"{inp['task']} cancelled")


# --- release: build -> test -> publish (synapse-release.yaml) --------------------------------


async def test_release_runs_each_step_on_its_class_in_dependency_order(stack: Stack) -> None:
    run_id = await stack.client.start("synapse-release", {})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "release/build": "done",
        "release/test": "done",
        "release/publish": "done",
    }
    # build went to a `ci` worker, test to anyone, publish to a `release` worker.
    assert stack.agents.tasks == [
        ("ci", "release/build"),
        ("task", "release/test"),
        ("release", "release/publish"),
    ]
    assert stack.agents.inputs["release/build"]["title"] == "Build the wheel"
    requested = of(await stack.records(run_id), ev.ActionRequested)
    assert [r.state for r in requested] == ["build", "test", "publish"]


async def test_a_plain_edge_is_satisfied_by_a_cancelled_dependency(stack: Stack) -> None:
    stack.agents.script("ci", cancel)
    run_id = await stack.client.start("synapse-release", {})
    state = await stack.finished(run_id)
    # Synapse: "any terminal status of the dependency satisfies it".
    assert state.outputs == {
        "release/build": "cancelled",
        "release/test": "done",
        "release/publish": "done",
    }
    [failed] = of(await stack.records(run_id), ev.ActionFailed)
    assert (failed.state, failed.error.error_class) == ("build", "agent_error")


# --- evidence requirements (synapse-release-evidence.yaml) ----------------------------------

PROVEN = {"receipt": "verified", "policy": "pass", "approval": "owner"}


async def test_publish_is_held_until_the_evidence_proves_every_predicate(stack: Stack) -> None:
    tests_running, finish_tests = asyncio.Event(), asyncio.Event()

    async def slow_tests(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["task"] != "release/test":
            return {"task": inp["task"]}
        tests_running.set()
        await finish_tests.wait()
        return {"passed": 120}

    stack.agents.script("task", slow_tests)
    run_id = await stack.client.start("synapse-release-evidence", {"release": "1.4.0"})
    await asyncio.wait_for(tests_running.wait(), WAIT)
    # A snapshot written while the tests still run, and missing the approval: it waits
    # (parked under the release's key) and does not prove the requirement.
    partial = {k: v for k, v in PROVEN.items() if k != "approval"}
    await stack.send(
        "synapse.evidence",
        {"release": "1.4.0", "evidence": {"release/publish": partial}},
        id="snapshot-1",
    )
    finish_tests.set()
    await stack.in_state(run_id, "publish_gate")
    await stack.run_until(
        run_id,
        lambda s: any(key.endswith("snapshot-1") for key in s.seen),
        "the early snapshot offered to the gate",
    )
    # A complete snapshot for another release does not reach this run.
    await stack.send(
        "synapse.evidence",
        {"release": "1.5.0", "evidence": {"release/publish": PROVEN}},
        id="other-release",
    )
    # The wrong approver does not prove `approval: owner`.
    await stack.send(
        "synapse.evidence",
        {"release": "1.4.0", "evidence": {"release/publish": {**PROVEN, "approval": "bot"}}},
        id="snapshot-2",
    )
    await stack.run_until(
        run_id, lambda s: any(k.endswith("snapshot-2") for k in s.seen), "snapshot 2 recorded"
    )
    assert (await stack.client.state(run_id)).state == "publish_gate"
    assert ("release", "release/publish") not in stack.agents.tasks

    await stack.send(
        "synapse.evidence",
        {"release": "1.4.0", "evidence": {"release/publish": PROVEN, "release/test": {}}},
        id="snapshot-3",
    )
    state = await stack.finished(run_id)
    assert state.outputs == {
        "complete": True,
        "timed_out": False,
        "release/test": "done",
        "release/publish": "done",
        "evidence": PROVEN,
    }
    received = [r.event["id"] for r in of(await stack.records(run_id), ev.EventReceived)]
    assert received == ["snapshot-1", "snapshot-2", "snapshot-3"]


async def test_evidence_that_never_comes_ends_the_run_at_the_deadline(stack: Stack) -> None:
    run_id = await stack.client.start("synapse-release-evidence", {"release": "2.0.0"})
    await stack.in_state(run_id, "publish_gate")
    await stack.advance(run_id, 119)
    assert (await stack.client.state(run_id)).state == "publish_gate"
    await stack.advance(run_id, 1)
    state = await stack.finished(run_id)
    assert state.outputs == {"complete": False, "timed_out": True, "release/test": "done"}
    assert [t for _, t in stack.agents.tasks] == ["release/test"]  # publish never routed
    # One budget over the whole run, as synapse's --deadline: the run's own timer.
    fired = of(await stack.records(run_id), ev.TimerFired)
    assert [f.purpose for f in fired] == ["run-deadline"]


# --- conditional edges (synapse-release-branch.yaml) -----------------------------------------


async def test_a_test_that_finishes_done_deploys_and_skips_the_rollback(stack: Stack) -> None:
    run_id = await stack.client.start("synapse-release-branch", {})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "release/test": "done",
        "release/deploy": "done",
        "release/rollback": "cancelled",
    }
    assert [t for _, t in stack.agents.tasks] == ["release/test", "release/deploy"]


async def test_a_cancelled_test_rolls_back_and_never_deploys(stack: Stack) -> None:
    async def flaky_suite(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["task"] == "release/test":
            raise AgentError("suite aborted")
        return {"task": inp["task"]}

    stack.agents.script("task", flaky_suite)
    run_id = await stack.client.start("synapse-release-branch", {})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "release/test": "cancelled",
        "release/deploy": "cancelled",
        "release/rollback": "done",
        "reason": "suite aborted",
    }
    assert [t for _, t in stack.agents.tasks] == ["release/test", "release/rollback"]
    fired = of(await stack.records(run_id), ev.TransitionFired)
    assert [(f.from_state, f.event_type, f.to_state) for f in fired] == [
        ("test", "task.failed", "rollback"),
        ("rollback", "task.completed", "rolled_back"),
    ]


# --- fan-out and join (synapse-ingest.yaml) -----------------------------------------------


def shards(cancelled: str | None = None) -> Handler:
    """Shard workers (the one for ``cancelled`` gives up), and a merge of the shards done."""

    async def handle(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["task"] == "ingest/merge":
            return {"merged": [s["region"] for s in inp["shards"] if s["status"] == "done"]}
        region = inp["task"].removeprefix("ingest/shard#")
        if region == cancelled:
            raise AgentError(f"{region} source offline")
        return {"rows": len(region)}

    return handle


async def test_each_item_runs_in_parallel_and_merge_joins_them_all(stack: Stack) -> None:
    stack.agents.script("task", shards())
    run_id = await stack.client.start("synapse-ingest", {})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "shards": [
            {"region": "us", "status": "done", "rows": 2},
            {"region": "eu", "status": "done", "rows": 2},
            {"region": "apac", "status": "done", "rows": 4},
        ],
        "ingest/merge": "done",
        "merged": {"merged": ["us", "eu", "apac"]},
    }
    shard_tasks = [t for _, t in stack.agents.tasks[:3]]
    assert sorted(shard_tasks) == ["ingest/shard#apac", "ingest/shard#eu", "ingest/shard#us"]
    assert stack.agents.tasks[3] == ("task", "ingest/merge")
    assert stack.agents.inputs["ingest/shard#eu"]["title"] == "Ingest shard [eu]"
    records = await stack.records(run_id)
    [started] = of(records, ev.MapStarted)
    assert started.items == ["us", "eu", "apac"]
    for requested in of(records, ev.ActionRequested)[:3]:
        child = await stack.client.state(child_run_id(requested.action_id, 1))
        assert (child.workflow, child.status) == ("synapse-ingest-shard", "completed")


async def test_a_cancelled_shard_still_lets_the_plain_join_merge(stack: Stack) -> None:
    stack.agents.script("task", shards(cancelled="eu"))
    run_id = await stack.client.start("synapse-ingest", {})
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert state.outputs["shards"][1] == {
        "region": "eu",
        "status": "cancelled",
        "reason": "eu source offline",
    }
    assert state.outputs["merged"] == {"merged": ["us", "apac"]}
    assert stack.agents.tasks[-1] == ("task", "ingest/merge")
