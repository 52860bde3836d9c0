"""kxm webhook workflow definitions run as written, end to end on a real nats-server: the
seed's `jira-development` definition (a JSON array, applied as it is, and its `interlock
convert` output), started by its webhook event, its coordinator and peer reviewers
scripted, its waits released by signals."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.gateway import Gateway, build_app
from interlock.sdk import AgentError, TaskContext
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.httpserver import HttpServer
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects
from support.flow import (
    API_WAIT,
    REPO,
    ScriptedAgents,
    ScriptedStack,
    eventually,
    of,
    own_workers,
    path,
    worker_orchestrator,
)

FIXTURE = REPO / "tests" / "dialects" / "fixtures" / "kxm-workflows.json"
COORDINATOR = "kxm.coordinator"
REVIEWERS = ["kxm.reviewer-claude", "kxm.reviewer-grok"]
PAYLOAD = {
    "issue": {"key": "PAY-7", "fields": {"summary": "Refunds", "status": {"name": "In Progress"}}}
}


class Agents(ScriptedAgents):
    """The coordinator answers each stage from a queue a test fills; reviewers reply, each
    from a worker of its own (distinct producers)."""

    def __init__(self) -> None:
        super().__init__([COORDINATOR])
        self.queue: defaultdict[str, list[Any]] = defaultdict(list)
        self.asked: list[tuple[str, int]] = []
        self.prompts: list[str] = []
        self.silent: set[str] = set()
        self.held: set[str] = set()
        """Stages the coordinator takes and never answers."""
        self.deliveries: list[str] = []

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        if capability == COORDINATOR:
            self.asked.append((inp["stage"], inp["attempt"]))
            self.prompts.append(inp["prompt"])
            self.deliveries.append(inp["delivery"])
            if inp["stage"] in self.held:
                await asyncio.Event().wait()  # cancelled when the worker stops
            return self.queue[inp["stage"]].pop(0)
        if capability in self.silent:
            raise AgentError("no reply")
        return {"status": "replied", "review": f"ok from {capability}"}


Stack = ScriptedStack[Agents]


BOTH = pytest.mark.parametrize("form", ["as-written", "converted"])
"""The round trip: the file as written and its `interlock convert` output, to one outcome."""


@pytest.fixture
def form() -> str:
    return "as-written"


@pytest.fixture
def files(form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[Path]:
    if form == "as-written":
        return [FIXTURE]
    if form == "without-ttl":
        # The example without ttlMs (and delivery): the hub's defaults apply.
        items = json.loads(FIXTURE.read_text())
        del items[0]["ttlMs"], items[0]["delivery"]
        written = tmp_path / "workflows.json"
        written.write_text(json.dumps(items, indent=2))
        return [written]
    assert interlock_main(["convert", str(FIXTURE), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    return [tmp_path / "jira-development.yaml"]


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, files: list[Path]) -> AsyncIterator[Stack]:
    agents = Agents()
    async with (
        worker_orchestrator(nats_url, subjects, files, agents, worker="kxm", concurrency=4) as (
            client,
            timers,
            _,
        ),
        own_workers(nats_url, subjects, agents, REVIEWERS),
    ):
        yield Stack(client, timers, agents, source="test://kxm")


async def start(stack: Stack, payload: dict[str, Any] = PAYLOAD, delivery: str = "d-1") -> str:
    await stack.client.emit(
        CloudEvent(
            id=delivery,
            source="https://jira.example",
            type="kxm.jira-development.jira_issue_updated",
            time=utc_now(),
            datacontenttype="application/json",
            data=payload,
        )
    )
    runs: list[dict[str, Any]] = []

    async def started() -> bool:
        runs[:] = await stack.client.list_runs("jira-development")
        return bool(runs)

    await eventually(started, "a run started by the webhook")
    return str(runs[0]["run_id"])


async def signal(
    stack: Stack, run_id: str, key: str, status: str, evidence: dict[str, str], id: str
) -> None:
    data = {"signal": key, "status": status, "summary": status, "evidence": evidence}
    await stack.send("kxm.signal", data, id=id, run_id=run_id)


PLAN = {"status": "passed", "evidence": {"approved plan": "plan v1"}}
DIFF = {"status": "passed", "evidence": {"diff": "+refunds"}}
WAIT = {"wait": "ci", "summary": "waiting for CI"}


@BOTH
async def test_the_definition_runs_to_completion(stack: Stack) -> None:
    stack.agents.queue["plan"] = [PLAN]
    stack.agents.queue["implement"] = [DIFF]
    stack.agents.queue["ci"] = [WAIT]
    run_id = await start(stack)
    await stack.in_state(run_id, "ci-wait")
    # A passed signal without the required evidence is refused: the run keeps waiting.
    await signal(stack, run_id, "ci", "passed", {}, id="s1")
    # As the gateway sends it: the signal's key (the stage's id) in the event type.
    data = {"status": "passed", "evidence": {"github.check:ci": "green"}}
    await stack.send("kxm.jira-development.signal.ci", data, id="s2", run_id=run_id)
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs["stages"] == {"plan": "passed", "implement": "passed", "ci": "passed"}
    assert state.outputs["evidence"]["ci"] == {"github.check:ci": "green"}
    assert stack.agents.prompts[0] == "Deliver PAY-7: Refunds"
    records = await stack.records(run_id)
    assert path(records) == [
        "plan", "plan-peers", "implement", "ci", "ci-wait", "completed",
    ]  # fmt: skip
    # The wait's gate said why the first signal was not taken.
    checked = [(g.state, g.proven, g.missing) for g in of(records, ev.GateChecked)]
    assert ("ci-wait", False, ["github.check:ci"]) in checked
    assert ("ci-wait", True, []) in checked


async def test_a_delivery_that_does_not_match_the_filter_starts_nothing(stack: Stack) -> None:
    other = {"issue": {"key": "PAY-8", "fields": {"summary": "x", "status": {"name": "To Do"}}}}
    stack.agents.queue["plan"] = [PLAN]
    await stack.client.emit(
        CloudEvent(
            id="d-0", source="https://jira.example", type="kxm.jira-development.jira_issue_updated",
            time=utc_now(), datacontenttype="application/json", data=other,
        )
    )  # fmt: skip
    run_id = await start(stack, delivery="d-2")
    assert len(await stack.client.list_runs("jira-development")) == 1
    assert stack.agents.prompts[0] == "Deliver PAY-7: Refunds"
    await stack.client.cancel(run_id)


async def test_a_refused_checkpoint_does_not_consume_an_attempt(stack: Stack) -> None:
    stack.agents.queue["plan"] = [
        {"status": "passed", "evidence": {}},  # refused: no "approved plan"
        {"status": "warning", "evidence": {"approved plan": "draft"}},  # attempt 1 used
        PLAN,
    ]
    stack.agents.queue["implement"] = [DIFF]
    stack.agents.queue["ci"] = [WAIT]
    run_id = await start(stack)
    await stack.in_state(run_id, "ci-wait")
    assert stack.agents.asked[:3] == [("plan", 1), ("plan", 1), ("plan", 2)]
    checks = [
        (c.state, c.proven, c.missing) for c in of(await stack.records(run_id), ev.GateChecked)
    ]
    assert checks[0] == ("plan", False, ["approved plan"])  # the refusal, in the log
    assert ("plan", True, []) in checks
    await stack.client.cancel(run_id)


@BOTH
async def test_a_coordinator_that_never_sends_a_status_ends_by_its_budget(stack: Stack) -> None:
    replies = 0

    async def no_status(inp: dict[str, Any], ctx: TaskContext) -> Any:
        nonlocal replies
        replies += 1
        return {"summary": "looked into it"}  # no status, no wait

    stack.agents.script(COORDINATOR, no_status)
    run_id = await start(stack)
    state = await stack.client.wait(run_id, 120)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message.startswith(
        "more than budget.edges.replies-without-status (1000) transitions: plan -> plan"
    )
    records = await stack.records(run_id)
    assert of(records, ev.GuardFailed) == []  # not a guard error: a refusal
    refusals = [t for t in of(records, ev.TransitionFired) if t.from_state == "plan"]
    assert len(refusals) == 1000 == replies - 1  # one per reply; the last one ended the run
    assert {t.set["refused"] for t in refusals} == {
        "stage plan: the coordinator's reply has no status (passed, warning or failed) and "
        "is not a wait: refused, the stage asked again"
    }
    asked = {r.input["attempt"] for r in of(records, ev.ActionRequested)}
    assert asked == {1}  # a refusal costs no attempt


@BOTH
async def test_too_few_peer_replies_refuse_the_stage(stack: Stack) -> None:
    stack.agents.silent.add("kxm.reviewer-grok")
    stack.agents.queue["plan"] = [PLAN, PLAN]
    run_id = await start(stack)
    await eventually(lambda: len(stack.agents.asked) >= 2, "the plan asked again")
    assert stack.agents.asked[:2] == [("plan", 1), ("plan", 1)]
    records = await stack.records(run_id)
    # The refusal names the requirement that was short, what it needs and who answered.
    refusal = next(t for t in of(records, ev.TransitionFired) if t.from_state == "plan-peers")
    # (grok's failure settles it whether or not claude has answered yet: 0 or 1 answered)
    assert re.fullmatch(
        "stage plan: too few peer replies for 'peer reviews' \\(minProducers 2\\): parallel "
        "'plan-peers' needs 2 distinct producers, [01] answered; last action failure: no reply",
        refusal.set["refused"],
    ), refusal.set
    sources = {c.source for c in of(records, ev.ActionCompleted) if c.source}
    assert sources  # who replied is recorded
    await stack.client.cancel(run_id)


async def test_failed_ci_loops_back_until_the_edge_budget_fails_the_run(stack: Stack) -> None:
    stack.agents.queue["plan"] = [PLAN]
    stack.agents.queue["implement"] = [DIFF, DIFF, DIFF]
    stack.agents.queue["ci"] = [WAIT, WAIT, WAIT]
    run_id = await start(stack)
    for n in range(3):
        await stack.run_until(
            run_id,
            lambda s, n=n: s.state == "ci-wait" and len(stack.agents.asked) == 3 + 2 * n,
            f"wait #{n + 1} for CI",
        )
        await signal(stack, run_id, "ci", "failed", {}, id=f"f{n}")
    state = await stack.finished(run_id)
    assert state.status == "failed"
    # Six declared transitions (the definition's maxTransitions) are spent, and so are the
    # stage's and the edge's two back-edges: the third failure fails the run.
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == (
        "more than budget.edges.run (6) transitions: ci-wait -> implement on kxm.signal"
    )
    records = await stack.records(run_id)
    spent = [t.budget for t in of(records, ev.TransitionFired) if t.budget]
    assert spent.count(["run", "stage:ci", "edge:ci:failed"]) == 2
    # Each back-edge entered implement afresh: its attempts start again at 1.
    assert [a for a in stack.agents.asked if a[0] == "implement"] == [("implement", 1)] * 3


async def test_a_wait_expires_after_24_hours(stack: Stack) -> None:
    stack.agents.queue["plan"] = [PLAN]
    stack.agents.queue["implement"] = [DIFF]
    stack.agents.queue["ci"] = [WAIT]
    run_id = await start(stack)
    await stack.in_state(run_id, "ci-wait")
    await stack.advance(run_id, 24 * 3600 - 1)
    assert (await stack.client.state(run_id)).state == "ci-wait"
    await stack.advance(run_id, 2)
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.outputs["reason"] == "stage ci: the wait expired"


async def test_implement_escalates_and_a_signal_resumes_it(stack: Stack) -> None:
    stack.agents.queue["plan"] = [PLAN]
    stack.agents.queue["implement"] = [
        {"status": "failed", "evidence": {}},
        {"status": "failed", "evidence": {}},
        DIFF,
    ]
    stack.agents.queue["ci"] = [WAIT]
    run_id = await start(stack)
    await stack.in_state(run_id, "implement-escalated")
    await signal(stack, run_id, "audit_escalation", "passed", {}, id="esc")
    await stack.in_state(run_id, "ci-wait")
    assert [a for a in stack.agents.asked if a[0] == "implement"] == [
        ("implement", 1), ("implement", 2), ("implement", 3),
    ]  # fmt: skip
    await stack.client.cancel(run_id)


# --- the Runtime form (kxm.workflow.v1) -----------------------------------------------------

RUNTIME = REPO / "tests" / "dialects" / "fixtures" / "kxm-bug-fix.yaml"
CRITICS = ["kxm.critic-a", "kxm.critic-b"]


class RuntimeAgents(ScriptedAgents):
    def __init__(self) -> None:
        super().__init__(["kxm.gate", "kxm.implementer"])  # each critic: its own worker
        self.gates: defaultdict[str, list[bool]] = defaultdict(list)
        self.implement: list[Any] = []
        self.steps: list[str] = []

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        self.steps.append(inp["step"])
        if capability == "kxm.gate":
            return {"ok": self.gates[inp["gate"]].pop(0)}
        if capability == "kxm.implementer":
            return self.implement.pop(0)
        return {"review": "fine"}


RuntimeStack = ScriptedStack[RuntimeAgents]


@pytest.fixture
async def runtime(
    form: str,
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> AsyncIterator[RuntimeStack]:
    path = RUNTIME
    if form == "converted":
        assert interlock_main(["convert", str(RUNTIME), "-o", str(tmp_path)]) == 0
        capsys.readouterr()
        path = tmp_path / "kxm-bug-fix.yaml"
    agents = RuntimeAgents()
    async with (
        worker_orchestrator(
            nats_url, subjects, [path], agents, worker="kxm-runtime", concurrency=4
        ) as (client, timers, _),
        own_workers(nats_url, subjects, agents, CRITICS),
    ):
        yield RuntimeStack(client, timers, agents, source="test://kxm")


FIX = {"outcome": "done", "evidence": {"diff": "+fix"}, "cost": 1.5}


@BOTH
async def test_runtime_workflow_runs_every_step_kind(runtime: RuntimeStack) -> None:
    runtime.agents.gates["repro"] = [False]  # the reproduction fails: confirmed
    runtime.agents.gates["tests"] = [True]
    runtime.agents.implement = [{"outcome": "done", "evidence": {}}, FIX]  # first is refused
    run_id = await runtime.client.start("kxm-bug-fix", {})
    await runtime.in_state(run_id, "approve")
    await runtime.send("kxm.approval", {"outcome": "approved"}, id="ok", run_id=run_id)
    state = await runtime.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"status": "completed", "outcome": "approved"}
    assert runtime.agents.steps == [
        "reproduce",
        "implement",
        "implement",
        "verify",
        "review",
        "review",
    ]
    assert state.cost == 1.5  # run.cost, summed by the engine from each answer


async def test_a_rejection_ends_the_run_cancelled(runtime: RuntimeStack) -> None:
    runtime.agents.gates["repro"] = [False]
    runtime.agents.gates["tests"] = [True]
    runtime.agents.implement = [FIX]
    run_id = await runtime.client.start("kxm-bug-fix", {})
    await runtime.in_state(run_id, "approve")
    await runtime.send("kxm.approval", {"outcome": "rejected"}, id="no", run_id=run_id)
    state = await runtime.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "cancelled"


async def test_failing_tests_loop_back_within_the_edge_budget(runtime: RuntimeStack) -> None:
    runtime.agents.gates["repro"] = [False]
    runtime.agents.gates["tests"] = [False, False, False]
    runtime.agents.implement = [FIX, FIX, FIX]
    run_id = await runtime.client.start("kxm-bug-fix", {})
    state = await runtime.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == (
        "more than budget.edges.edge:verify:implementation-failure (2) transitions: "
        "verify -> implement on task.completed"
    )
    assert runtime.agents.steps.count("implement") == 3


async def test_the_model_cost_budget_is_summed_from_answers(runtime: RuntimeStack) -> None:
    runtime.agents.gates["repro"] = [False]
    runtime.agents.gates["tests"] = [False, True]
    runtime.agents.implement = [FIX, {**FIX, "cost": 4.0}]
    run_id = await runtime.client.start("kxm-bug-fix", {})
    state = await runtime.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.outputs["reason"] == "maxModelCost 5 exceeded at implement"


async def test_a_missing_reproduction_fails_the_run(runtime: RuntimeStack) -> None:
    runtime.agents.gates["repro"] = [True]  # the bug does not reproduce
    run_id = await runtime.client.start("kxm-bug-fix", {})
    state = await runtime.finished(run_id)
    assert state.status == "failed"
    assert state.outputs["reason"] == "reproduce: repro-missing (failed)"


# --- through the HTTP gateway: a signed Jira delivery starts it, a signed signal releases it --


def _jira(body: bytes, delivery: str, secret: str) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Atlassian-Webhook-Identifier": delivery,
        "X-Hub-Signature": f"sha256={digest}",
    }


async def test_signed_webhooks_start_and_signal_the_definition(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JIRA_WEBHOOK_SECRET", "jira start secret")
    monkeypatch.setenv("WORKFLOW_SIGNAL_SECRET", "jira signal secret")
    agents = Agents()
    agents.queue["plan"] = [PLAN]
    agents.queue["implement"] = [DIFF]
    agents.queue["ci"] = [WAIT]
    async with (
        worker_orchestrator(nats_url, subjects, [FIXTURE], agents, worker="kxm", concurrency=4) as (
            client,
            timers,
            _,
        ),
        own_workers(nats_url, subjects, agents, REVIEWERS),
    ):
        stack = Stack(client, timers, agents)
        nc = await nats.connect(nats_url)
        jetstream(nc, timeout=API_WAIT)
        gateway = Gateway(nc, subjects)
        await gateway.start()
        server = HttpServer(build_app(gateway), 0)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as http:
                body = json.dumps({"webhookEvent": "jira:issue_updated", **PAYLOAD}).encode()
                forged = await http.post(
                    "/webhooks/jira-development", content=body, headers=_jira(body, "j-0", "nope")
                )
                assert forged.status_code == 401
                r = await http.post(
                    "/webhooks/jira-development",
                    content=body,
                    headers=_jira(body, "j-1", "jira start secret"),
                )
                assert r.status_code == 202, r.text
                run_id = r.json()["events"][0]["started"][0]["run_id"]
                await stack.in_state(run_id, "ci-wait")
                signal_body = json.dumps(
                    {
                        "run_id": run_id,
                        "signal": "ci",
                        "status": "passed",
                        "summary": "green",
                        "evidence": {"github.check:ci": "ok"},
                    }
                ).encode()
                path = f"/webhooks/jira-development/runs/{run_id}/signals/ci"
                r = await http.post(
                    path,
                    content=signal_body,
                    headers=_jira(signal_body, "s-1", "jira signal secret"),
                )
                assert r.status_code == 202, r.text
            state = await stack.finished(run_id)
            assert state.status == "completed"
            assert state.outputs["evidence"]["ci"] == {"github.check:ci": "ok"}
        finally:
            await server.stop()
            await gateway.stop()
            await nc.close()


async def test_a_signal_passing_a_stage_with_a_peer_policy_still_asks_the_peers(
    stack: Stack,
) -> None:
    stack.agents.queue["plan"] = [{"wait": "plan-ok", "summary": "waiting for sign-off"}]
    stack.agents.queue["implement"] = [DIFF]
    stack.agents.queue["ci"] = [WAIT]
    run_id = await start(stack)
    await stack.in_state(run_id, "plan-wait")
    # A "peer reviews" string does not satisfy the peer-reply key: the reviewers do.
    evidence = {"approved plan": "v2", "peer reviews": "trust me"}
    await signal(stack, run_id, "plan-ok", "passed", evidence, id="p1")
    await stack.in_state(run_id, "ci-wait")
    assert path(await stack.records(run_id))[:4] == ["plan", "plan-wait", "plan-peers", "implement"]
    await stack.client.cancel(run_id)


@pytest.mark.parametrize("form", ["without-ttl"])
async def test_without_ttl_ms_the_prompt_expires_after_the_hubs_default(stack: Stack) -> None:
    stack.agents.held.add("plan")
    run_id = await start(stack)
    await stack.run_until(run_id, lambda s: bool(s.pending), "the plan prompt in flight")
    await stack.advance(run_id, 24 * 3600 - 1)
    assert (await stack.client.state(run_id)).status == "running"
    await stack.advance(run_id, 2)
    state = await stack.finished(run_id)
    assert state.status == "failed"
    failed = of(await stack.records(run_id), ev.ActionFailed)
    assert [f.error.error_class for f in failed] == ["timeout"]
    # followUp, the default delivery, is handed to the coordinator with its prompt.
    assert stack.agents.deliveries == ["followUp"]
