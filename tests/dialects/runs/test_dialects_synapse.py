"""synapse workflow artifacts run as written, end to end on a real nats-server: each seed
example applied as it is (and its `interlock convert` output), its steps answered by a
scripted worker serving the task classes and `task` (unclassified steps)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import (
    REPO,
    WAIT,
    ScriptedAgents,
    ScriptedStack,
    eventually,
    of,
    worker_orchestrator,
)

FIXTURES = REPO / "tests" / "dialects" / "fixtures"
EVIDENCE = json.loads((REPO / "tests" / "dialects" / "synapse-evidence.json").read_text())


class Agents(ScriptedAgents):
    """Answers every task with its id, unless a test cancels it (synapse's `cancelled`)."""

    def __init__(self) -> None:
        super().__init__(["ci", "release", "task"])
        self.tasks: list[tuple[str, str]] = []
        self.cancel: set[str] = set()
        self.hold: dict[str, asyncio.Event] = {}

    def received(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> None:
        self.tasks.append((capability, inp["task"]))

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["task"] in self.hold:
            await asyncio.wait_for(self.hold[inp["task"]].wait(), WAIT)
        if inp["task"] in self.cancel:
            raise AgentError(f"{inp['task']} cancelled")
        return {"task": inp["task"]}


Stack = ScriptedStack[Agents]
Factory = Callable[[str], contextlib.AbstractAsyncContextManager[Stack]]


@pytest.fixture(params=["as-written", "converted"])
def stack_for(
    request: pytest.FixtureRequest,
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> Factory:
    @contextlib.asynccontextmanager
    async def make(name: str) -> AsyncIterator[Stack]:
        path = FIXTURES / name
        if request.param == "converted":
            target = tmp_path / name.replace(".json", "")
            assert interlock_main(["convert", str(path), "-o", str(target)]) == 0
            capsys.readouterr()
            path = target / "release.yaml" if "release" in name else target / "ingest.yaml"
        agents = Agents()
        async with worker_orchestrator(
            nats_url, subjects, [path], agents, worker="synapse", concurrency=8
        ) as (client, timers, _):
            yield Stack(client, timers, agents, source="test://synapse")

    return make


async def test_release_runs_each_step_on_its_class(stack_for: Factory) -> None:
    async with stack_for("synapse-release.json") as stack:
        run_id = await stack.client.start("release", {})
        state = await stack.finished(run_id)
        assert state.outputs == {
            "complete": True,
            "timed_out": False,
            "state": {"done": 3, "skipped": 0},
            "tasks": {"release/build": "done", "release/test": "done", "release/publish": "done"},
            "interrupted": [],
            "assignments": [
                {"task": "release/build", "agent": "interlock://agent/synapse"},
                {"task": "release/test", "agent": "interlock://agent/synapse"},
                {"task": "release/publish", "agent": "interlock://agent/synapse"},
            ],
        }
        assert stack.agents.tasks == [
            ("ci", "release/build"),
            ("task", "release/test"),
            ("release", "release/publish"),
        ]


async def test_a_cancelled_dependency_still_satisfies_a_plain_edge(stack_for: Factory) -> None:
    async with stack_for("synapse-release.json") as stack:
        stack.agents.cancel.add("release/build")
        run_id = await stack.client.start("release", {})
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == {
            "release/build": "cancelled",
            "release/test": "done",
            "release/publish": "done",
        }
        # Only a task that ended done was answered: the cancelled one has no assignment.
        assert [a["task"] for a in state.outputs["assignments"]] == [
            "release/test",
            "release/publish",
        ]


@pytest.mark.parametrize(
    ("cancel", "expected"),
    [
        (
            False,
            {"release/test": "done", "release/deploy": "done", "release/rollback": "cancelled"},
        ),
        (
            True,
            {
                "release/test": "cancelled",
                "release/deploy": "cancelled",
                "release/rollback": "done",
            },
        ),
    ],
)
async def test_conditional_edges_branch_on_the_outcome(
    stack_for: Factory, cancel: bool, expected: dict[str, str]
) -> None:
    async with stack_for("synapse-release-branch.json") as stack:
        if cancel:
            stack.agents.cancel.add("release/test")
        run_id = await stack.client.start("release", {})
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == expected
        assert state.outputs["state"] == {"done": 2, "skipped": 1}


async def _held(stack: Stack, run_id: str, step: str) -> None:
    async def held() -> bool:
        records = await stack.records(run_id)
        return any(r.step == step and not r.proven for r in of(records, ev.GateChecked))

    await eventually(held, f"{step} held by its evidence gate")


async def test_publish_waits_until_the_evidence_proves_every_predicate(stack_for: Factory) -> None:
    async with stack_for("synapse-release-evidence.json") as stack:
        run_id = await stack.client.start("release", {})
        await _held(stack, run_id, "publish")
        partial = {"release/publish": {"receipt": "verified", "policy": "pass"}}
        await stack.send("synapse.evidence", partial, id="e1", run_id=run_id)
        await stack.send("synapse.evidence", EVIDENCE, id="e2", run_id=run_id)
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == {"release/test": "done", "release/publish": "done"}
        records = await stack.records(run_id)
        # Both snapshots are recorded, and what each left the gate missing; only the second
        # proved the predicates.
        assert [r.event["id"] for r in of(records, ev.EvidenceRecorded)] == ["e1", "e2"]
        checks = [(r.proven, r.missing) for r in of(records, ev.GateChecked)]
        assert checks == [
            (False, ["receipt", "policy", "approval"]),
            (False, ["approval"]),
            (True, []),
        ]
        assert ("release", "release/publish") not in stack.agents.tasks
        assert stack.agents.tasks[-1] == ("task", "release/publish")


async def test_evidence_sent_before_the_step_is_active_still_counts(stack_for: Factory) -> None:
    async with stack_for("synapse-release-evidence.json") as stack:
        proceed = asyncio.Event()
        stack.agents.hold["release/test"] = proceed
        run_id = await stack.client.start("release", {})
        await stack.send("synapse.evidence", EVIDENCE, id="early", run_id=run_id)

        async def kept() -> bool:
            return bool(of(await stack.records(run_id), ev.EvidenceRecorded))

        await eventually(kept, "the early evidence recorded")
        proceed.set()
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == {"release/test": "done", "release/publish": "done"}
        checks = [(r.proven, r.missing) for r in of(await stack.records(run_id), ev.GateChecked)]
        assert checks == [(True, [])]


async def test_fan_out_runs_the_shards_together_and_joins_them(stack_for: Factory) -> None:
    async with stack_for("synapse-ingest.json") as stack:
        stack.agents.cancel.add("ingest/shard#eu")
        run_id = await stack.client.start("ingest", {})
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == {
            "ingest/shard#us": "done",
            "ingest/shard#eu": "cancelled",
            "ingest/shard#apac": "done",
            "ingest/merge": "done",
        }
        requested = of(await stack.records(run_id), ev.ActionRequested)
        assert [r.input["task"] for r in requested[:3]] == [
            "ingest/shard#us",
            "ingest/shard#eu",
            "ingest/shard#apac",
        ]


async def test_evidence_sent_with_interlock_signal_reports_what_it_did(
    stack_for: Factory,
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As docs/porting/synapse.md says to send it: `interlock signal RUN synapse.evidence
    # --data @evidence.json`. The run records it; the command says so, and what the gate
    # it was checked by now proves, and exits 0.
    monkeypatch.setenv("INTERLOCK_URL", nats_url)
    monkeypatch.setenv("INTERLOCK_PREFIX", subjects.prefix)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"release/publish": {"receipt": "verified", "policy": "pass"}}))
    full = tmp_path / "evidence.json"
    full.write_text(json.dumps(EVIDENCE))
    async with stack_for("synapse-release-evidence.json") as stack:
        run_id = await stack.client.start("release", {})
        await _held(stack, run_id, "publish")
        argv = ["signal", run_id, "synapse.evidence", "--data"]
        code = await asyncio.to_thread(interlock_main, [*argv, f"@{partial}"])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert out.out.splitlines() == [
            f"synapse.evidence recorded by run {run_id} (in state run) as evidence",
            "  gate of step publish (release/publish): not proven yet, missing approval",
        ]
        code = await asyncio.to_thread(interlock_main, [*argv, f"@{full}", "-o", "json"])
        told = json.loads(capsys.readouterr().out)
        assert code == 0
        assert told["outcome"] == "recorded"
        assert told["gates"] == [
            {"state": "run", "step": "publish", "subject": "release/publish", "proven": True}
        ]
        state = await stack.finished(run_id)
        assert state.outputs["tasks"]["release/publish"] == "done"


async def test_a_deadline_ends_the_run_timed_out_with_the_board_as_it_stood(
    stack_for: Factory,
) -> None:
    # synapse workflow run --deadline 120: evidence that never comes holds publish; at the
    # deadline the run ends complete: false, timed_out: true.
    async with stack_for("synapse-release-evidence.json") as stack:
        run_id = await stack.client.start("release", {}, deadline_s=120)
        await _held(stack, run_id, "publish")
        await stack.advance(run_id, 121)
        state = await stack.finished(run_id)
        assert state.status == "completed"
        assert state.outputs == {
            "complete": False,
            "timed_out": True,
            "state": {"done": 1, "skipped": 0},
            "tasks": {"release/test": "done", "release/publish": "open"},
            "interrupted": [],
            "assignments": [{"task": "release/test", "agent": "interlock://agent/synapse"}],
        }
        records = await stack.records(run_id)
        assert [t.purpose for t in of(records, ev.TimerFired)] == ["run-deadline"]
        (started,) = of(records, ev.RunStarted)
        assert started.deadline_s == 120


async def test_a_step_in_flight_at_the_deadline_is_interrupted(stack_for: Factory) -> None:
    async with stack_for("synapse-release.json") as stack:
        stack.agents.hold["release/build"] = asyncio.Event()  # never answered
        run_id = await stack.client.start("release", {}, deadline_s=30)
        await eventually(lambda: bool(stack.agents.tasks), "build taken")
        await stack.advance(run_id, 31)
        state = await stack.finished(run_id)
        assert state.outputs["tasks"] == {
            "release/build": "in_progress",
            "release/test": "open",
            "release/publish": "open",
        }
        assert state.outputs["interrupted"] == ["release/build"]
        cancelled = of(await stack.records(run_id), ev.ActionCancelled)
        assert len(cancelled) == 1  # its agent is told


async def test_deadline_zero_posts_nothing(
    stack_for: Factory,
    nats_url: str,
    subjects: Subjects,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # "A --deadline 0 run therefore posts and writes nothing": no task is asked for, and the
    # result never invents a board (state null).
    monkeypatch.setenv("INTERLOCK_URL", nats_url)
    monkeypatch.setenv("INTERLOCK_PREFIX", subjects.prefix)
    async with stack_for("synapse-release.json") as stack:
        argv = ["start", "release", "--deadline", "0", "--wait", "-o", "json"]
        code = await asyncio.to_thread(interlock_main, argv)
        out = capsys.readouterr()
        assert code == 0, out.err
        result = json.loads(out.out)
        assert result["outputs"] == {
            "complete": False,
            "timed_out": True,
            "state": None,
            "tasks": {
                "release/build": "open",
                "release/test": "open",
                "release/publish": "open",
            },
            "interrupted": [],
            "assignments": [],
        }
        records = await stack.records(result["run_id"])
        assert of(records, ev.ActionRequested) == []
        assert stack.agents.tasks == []
        with pytest.raises(SystemExit) as refused:
            interlock_main(["start", "release", "--deadline", "-1"])
        assert refused.value.code == 2
        assert "a deadline is 0 to 315360000 seconds, not -1.0" in capsys.readouterr().err
