"""The kxm port (examples/ports/kxm-jira-development.yaml) validates and runs end to end.

Each test runs the ported webhook workflow on a real nats-server through an in-process
orchestrator whose timers run on a :class:`ManualClock` (waits of 24 hours come due when the
test advances the clock), with the coordinator and the reviewers answered by a real SDK
worker in this process, and checks the outcome kxm's documentation gives for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.state import RunState
from interlock.runtime.flow import child_run_id
from interlock.sdk import AgentError, TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.flow import PORTS, REPO, ScriptedStack, of, worker_orchestrator

AGENTS = PORTS / "kxm-agents.yaml"
WORKFLOW = PORTS / "kxm-jira-development.yaml"
JIRA = "https://jira.example.com"
Checkpoint = dict[str, Any]


def test_the_validate_command_in_the_header_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command = (
        f"#   interlock validate {WORKFLOW.relative_to(REPO)} --agents {AGENTS.relative_to(REPO)}"
    )
    assert command in WORKFLOW.read_text().splitlines()
    monkeypatch.chdir(REPO)
    assert interlock_main(command.removeprefix("#   interlock ").split()) == 0, capsys.readouterr()


# --- the stack ------------------------------------------------------------------------------


def passed(stage: str, attempt: int) -> Checkpoint:
    """The coordinator's checkpoint when a stage attempt goes well."""
    evidence = {"plan": {"approved plan": "plan v1"}, "implement": {"diff": f"diff-{attempt}"}}
    return {"status": "passed", "summary": "done", "evidence": evidence[stage]}


class Agents:
    """The coordinator and the reviewers, in this process. The coordinator passes every
    attempt unless a test queues its checkpoints for a stage (``checkpoints[stage]``, one
    per attempt); a reviewer replies unless it is listed in ``silent`` (once)."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, list[Checkpoint]] = {}
        self.silent: set[str] = set()
        self.calls: list[tuple[str, int]] = []
        """(stage, attempt) of every coordinator request, in order."""
        self.reviews: list[str] = []
        """The reviewer of every review request, in order."""

    def register(self, worker: Worker) -> None:
        worker.capability("kxm.coordinate")(self.coordinate)
        worker.capability("kxm.peer.review")(self.review)

    async def coordinate(self, inp: dict[str, Any], ctx: TaskContext) -> Any:
        stage, attempt = inp["stage"], inp["attempt"]
        self.calls.append((stage, attempt))
        queued = self.checkpoints.get(stage)
        return queued.pop(0) if queued else passed(stage, attempt)

    async def review(self, inp: dict[str, Any], ctx: TaskContext) -> Any:
        self.reviews.append(inp["reviewer"])
        if inp["reviewer"] in self.silent:
            self.silent.discard(inp["reviewer"])  # silent once
            raise AgentError(f"{inp['reviewer']} did not reply")
        return {"reviewer": inp["reviewer"], "reply": f"{inp['plan']}: looks right"}

    def stages(self) -> list[str]:
        return [stage for stage, _ in self.calls]


class Stack(ScriptedStack[Agents]):
    async def signal(self, run_id: str, key: str, data: dict[str, Any], id: str) -> None:
        """kxm's signed callback for ``key``: an event of type kxm.signal.<key> to the run."""
        await self.send(f"kxm.signal.{key}", data, id=id, run_id=run_id, source="test://ci")

    async def start(self, issue: str = "PAY-7") -> str:
        return await self.client.start("kxm-jira-development", {"issue": issue, "summary": "x"})


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = Agents()
    async with worker_orchestrator(
        nats_url, subjects, [AGENTS, WORKFLOW], agents, worker="kxm-worker", concurrency=8
    ) as (client, timers, _):
        yield Stack(client, timers, agents, source=JIRA)


def jira_issue(status: str) -> dict[str, Any]:
    return {
        "issue": {"key": "PAY-42", "fields": {"summary": "Refunds", "status": {"name": status}}}
    }


def back_edges(n: int) -> Callable[[RunState], bool]:
    """Whether the run has taken the ci -> implement back-edge ``n`` times."""
    return lambda state: state.context.get("ci_back_edges") == n


CI_GREEN = {"status": "passed", "summary": "green", "evidence": {"github.check:ci": "run 991"}}
CI_RED = {"status": "failed", "summary": "red", "evidence": {"github.check:ci": "run 990"}}


# --- the whole definition -------------------------------------------------------------------


async def test_an_in_progress_jira_issue_runs_plan_implement_and_ci(stack: Stack) -> None:
    definition, _ = await stack.client.registry.latest("kxm-jira-development")
    # The filter: an issue moved to another status starts no run.
    await stack.send("jira.issue_updated", jira_issue("To Do"), id="d-1", source=JIRA)
    await stack.send("jira.issue_updated", jira_issue("In Progress"), id="d-2", source=JIRA)
    run_id = derive_run_id(definition, JIRA, "d-2")
    await stack.in_state(run_id, "ci")
    assert await stack.records(derive_run_id(definition, JIRA, "d-1")) == []

    # A passed signal without the required evidence is refused: ci keeps waiting.
    await stack.signal(run_id, "ci", {"status": "passed", "evidence": {}}, id="s-1")
    await stack.run_until(run_id, lambda s: any(k.endswith("s-1") for k in s.seen), "s-1 taken")
    assert (await stack.client.state(run_id)).state == "ci"
    await stack.signal(run_id, "ci", CI_GREEN, id="s-2")
    state = await stack.finished(run_id)
    assert state.outputs == {
        "status": "completed",
        "issue": "PAY-42",
        "approved plan": "plan v1",
        "diff": "diff-1",
        "github.check:ci": "run 991",
        "ci back-edges": 0,
    }
    assert stack.agents.calls == [("plan", 1), ("implement", 1)]
    assert sorted(stack.agents.reviews) == ["reviewer-claude", "reviewer-grok"]
    # The plan attempt ran as a child run whose outputs carry both peer replies.
    records = await stack.records(run_id)
    [plan] = [r for r in of(records, ev.ActionRequested) if r.state == "plan"]
    child = await stack.client.state(child_run_id(plan.action_id, 1))
    assert child.outputs is not None
    assert [r["reviewer"] for r in child.outputs["evidence"]["peer reviews"]] == [
        "reviewer-claude",
        "reviewer-grok",
    ]


async def test_a_plan_attempt_missing_a_peer_reply_is_retried(stack: Stack) -> None:
    # Attempt 1: grok does not reply. Attempt 2: the coordinator itself only warns.
    # Attempt 3 passes, with both replies.
    stack.agents.silent.add("reviewer-grok")
    stack.agents.checkpoints["plan"] = [
        passed("plan", 1),
        {"status": "warning", "summary": "plan unclear"},
    ]
    run_id = await stack.start()
    await stack.in_state(run_id, "ci")
    assert [c for c in stack.agents.calls if c[0] == "plan"] == [
        ("plan", 1),
        ("plan", 2),
        ("plan", 3),
    ]
    assert sorted(stack.agents.reviews) == ["reviewer-claude"] * 2 + ["reviewer-grok"] * 2
    records = await stack.records(run_id)
    attempts = [r for r in of(records, ev.ActionRequested) if r.state == "plan"]
    assert [r.iteration for r in attempts] == [1, 2, 3]
    results = [c.result for c in of(records, ev.ActionCompleted) if c.state == "plan"]
    assert [r["status"] for r in results] == ["failed", "warning", "passed"]


async def test_a_plan_never_passed_in_three_attempts_fails_the_run(stack: Stack) -> None:
    stack.agents.checkpoints["plan"] = [{"status": "failed"}] * 3
    run_id = await stack.start()
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == "loop 'plan' did not finish in max_iterations (3)"
    assert stack.agents.stages() == ["plan"] * 3
    assert stack.agents.reviews == []  # a plan that did not pass is not sent to review


# --- the CI back-edge -----------------------------------------------------------------------


async def test_a_failed_ci_loops_back_to_implement_at_most_twice(stack: Stack) -> None:
    run_id = await stack.start()
    for n in (1, 2):
        await stack.in_state(run_id, "ci")
        await stack.signal(run_id, "ci", CI_RED, id=f"red-{n}")
        await stack.run_until(run_id, back_edges(n), f"back-edge {n}")
    await stack.in_state(run_id, "ci")
    await stack.signal(run_id, "ci", CI_RED, id="red-3")
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error == ev.ErrorInfo(
        error_class="workflow_failed",
        message="transition_budget_exhausted: ci -> implement taken twice",
    )
    assert state.outputs == {
        "status": "failed",
        "issue": "PAY-7",
        "reason": "transition_budget_exhausted: ci -> implement taken twice",
    }
    assert stack.agents.stages() == ["plan", "implement", "implement", "implement"]
    fired = of(await stack.records(run_id), ev.TransitionFired)
    assert [(f.from_state, f.to_state) for f in fired if f.from_state == "ci"] == [
        ("ci", "implement"),
        ("ci", "implement"),
        ("ci", "failed"),
    ]


async def test_a_green_ci_after_a_back_edge_completes_with_the_new_diff(stack: Stack) -> None:
    run_id = await stack.start()
    await stack.in_state(run_id, "ci")
    await stack.signal(run_id, "ci", CI_RED, id="red")
    await stack.run_until(run_id, back_edges(1), "a back-edge")
    await stack.in_state(run_id, "ci")
    await stack.signal(run_id, "ci", CI_GREEN, id="green")
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert (state.outputs["status"], state.outputs["ci back-edges"]) == ("completed", 1)
    # The back-edge reset implement's attempts: the new diff is attempt 1's.
    assert state.outputs["diff"] == "diff-1"
    assert stack.agents.calls[-1] == ("implement", 1)


async def test_a_wait_for_ci_expires_after_24_hours(stack: Stack) -> None:
    run_id = await stack.start()
    await stack.in_state(run_id, "ci")
    await stack.advance(run_id, 24 * 3600 - 1)
    assert (await stack.client.state(run_id)).state == "ci"
    await stack.advance(run_id, 1)
    state = await stack.finished(run_id)
    assert (state.status, state.error and state.error.message) == ("failed", "wait for ci expired")
    assert state.outputs == {"status": "failed", "issue": "PAY-7", "reason": "wait for ci expired"}


# --- escalation (autoResumeLimit) -----------------------------------------------------------


async def test_implement_escalates_after_two_attempts_and_resumes_on_the_signal(
    stack: Stack,
) -> None:
    stack.agents.checkpoints["implement"] = [{"status": "failed"}, {"status": "warning"}]
    run_id = await stack.start()
    await stack.in_state(run_id, "implement_escalated")
    assert stack.agents.stages() == ["plan", "implement", "implement"]
    await stack.signal(run_id, "audit_escalation", {"status": "passed"}, id="cleared")
    await stack.in_state(run_id, "ci")
    # The third and last attempt (maxAttempts 3) ran after the escalation was cleared.
    assert stack.agents.stages() == ["plan", "implement", "implement", "implement"]
    await stack.signal(run_id, "ci", CI_GREEN, id="green")
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert state.outputs["status"] == "completed"
    fired = of(await stack.records(run_id), ev.TransitionFired)
    assert [(f.from_state, f.event_type, f.to_state) for f in fired][1:3] == [
        ("implement", "task.failed", "implement_escalated"),
        ("implement_escalated", "kxm.signal.audit_escalation", "implement_resumed"),
    ]


async def test_an_escalation_nobody_clears_fails_the_run_after_24_hours(stack: Stack) -> None:
    stack.agents.checkpoints["implement"] = [{"status": "failed"}, {"status": "failed"}]
    run_id = await stack.start()
    await stack.in_state(run_id, "implement_escalated")
    await stack.advance(run_id, 24 * 3600)
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.outputs == {
        "status": "failed",
        "issue": "PAY-7",
        "reason": "escalation of stage implement not cleared within 24h",
    }
    assert stack.agents.stages() == ["plan", "implement", "implement"]
