"""The ctxmesh ports in examples/ports/ validate and run end to end on a real nats-server.

Each test starts one ported workflow through the real orchestrator (in process, timers on
a :class:`ManualClock`) with the capabilities answered by a real SDK worker whose handlers
the test scripts, and checks the outcome the ctxmesh seed describes for that workflow: the
data flow between steps, which branch was taken, where a failure was routed, and a map's
results in input order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.sdk import AgentError, TaskContext
from interlock.transport.subjects import Subjects
from support.flow import (
    RecordingAgents,
    ScriptedStack,
    check_header_command,
    eventually,
    of,
    path,
    port_files,
    worker_orchestrator,
)

AGENTS, WORKFLOWS = port_files("ctxmesh")
CAPABILITIES = [
    "triage",
    "answer",
    "billing",
    "human-handoff",
    "plan",
    "research",
    "summarize",
    "review",
]


# --- every port validates ------------------------------------------------------------------


def test_the_ports_are_the_seed_examples_and_more() -> None:
    assert [p.name for p in WORKFLOWS] == [
        "ctxmesh-research-digest.yaml",
        "ctxmesh-support-flow.yaml",
        "ctxmesh-triage-then-answer.yaml",
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_each_port_validates_with_the_command_in_its_header(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    check_header_command(path, AGENTS, monkeypatch, capsys)


# --- the stack -----------------------------------------------------------------------------


class Stack(ScriptedStack[RecordingAgents]):
    async def start(self, workflow: str, inputs: dict[str, Any]) -> str:
        return await self.client.start(f"my-team/{workflow}", inputs)


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = RecordingAgents(CAPABILITIES)
    async with worker_orchestrator(
        nats_url, subjects, [AGENTS, *WORKFLOWS], agents, worker="ctxmesh-agents", concurrency=16
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


# --- triage-then-answer: two linear steps ----------------------------------------------------


async def test_triage_then_answer_feeds_the_topic_to_the_answer_step(stack: Stack) -> None:
    stack.agents.answer("triage", {"topic": "billing"})

    async def answer(inp: dict[str, Any], ctx: TaskContext) -> Any:
        return {"answer": f"about {inp['topic']}"}

    stack.agents.script("answer", answer)
    run_id = await stack.start("triage-then-answer", {"message": "I was charged twice"})
    state = await stack.finished(run_id)
    assert state.status == "completed"
    assert state.outputs == {"topic": "billing", "answer": "about billing"}
    assert stack.agents.inputs["triage"] == [{"message": "I was charged twice"}]
    assert stack.agents.inputs["answer"] == [{"topic": "billing"}]  # input: steps.classify...
    assert path(await stack.records(run_id)) == ["classify", "answer", "done"]


async def test_triage_then_answer_fails_when_the_referenced_output_is_missing(
    stack: Stack,
) -> None:
    # The seed's outputSchema does not require `topic`: an answer without it is valid, and
    # the answer step's input expression then fails the run, naming the value.
    stack.agents.answer("triage", {})
    run_id = await stack.start("triage-then-answer", {"message": "hello"})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "expression_error"
    assert "topic" in state.error.message
    assert "answer" not in stack.agents.inputs  # the step never reached its agent


# --- support-flow: branches, default, catch --------------------------------------------------


async def test_support_flow_routes_billing_to_the_billing_agent(stack: Stack) -> None:
    stack.agents.answer("triage", {"topic": "billing"})
    stack.agents.answer("billing", {"answer": "refund issued"})
    run_id = await stack.start("support-flow", {"message": "charged twice"})
    state = await stack.finished(run_id)
    assert state.outputs == {"route": "billing", "answer": "refund issued"}
    records = await stack.records(run_id)
    assert path(records) == ["classify", "billing", "billed"]
    first = of(records, ev.TransitionFired)[0]
    assert (first.to_state, first.transition) == ("billing", 0)  # branches[0]
    assert stack.agents.inputs["billing"] == [{"message": "charged twice"}]


async def test_support_flow_takes_the_default_when_no_branch_matches(stack: Stack) -> None:
    stack.agents.answer("triage", {"topic": "shipping"})
    stack.agents.answer("answer", {"answer": "it ships tomorrow"})
    run_id = await stack.start("support-flow", {"message": "where is my parcel?"})
    state = await stack.finished(run_id)
    assert state.outputs == {"route": "general", "answer": "it ships tomorrow"}
    records = await stack.records(run_id)
    assert path(records) == ["classify", "general", "answered"]
    assert of(records, ev.TransitionFired)[0].transition == 1  # the default entry
    assert "billing" not in stack.agents.inputs


async def test_support_flow_a_guard_that_errors_is_recorded_and_the_default_taken(
    stack: Stack,
) -> None:
    stack.agents.answer("triage", {})  # valid for the schema, but no topic to compare
    stack.agents.answer("answer", {"answer": "generic help"})
    run_id = await stack.start("support-flow", {"message": "?"})
    state = await stack.finished(run_id)
    assert state.outputs == {"route": "general", "answer": "generic help"}
    [guard] = of(await stack.records(run_id), ev.GuardFailed)
    assert (guard.state, guard.transition, guard.guard) == (
        "classify",
        0,
        'result.topic == "billing"',
    )


async def test_support_flow_a_failing_billing_agent_is_caught_and_handed_off(
    stack: Stack,
) -> None:
    async def tool_down(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise AgentError("tool_error: refunds API unavailable")

    stack.agents.answer("triage", {"topic": "billing"})
    stack.agents.script("billing", tool_down)
    stack.agents.answer("human-handoff", {"ticket": "HD-7"})
    run_id = await stack.start("support-flow", {"message": "charged twice"})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "route": "fallback",
        "ticket": "HD-7",
        "reason": "tool_error: refunds API unavailable",
    }
    records = await stack.records(run_id)
    assert path(records) == ["classify", "billing", "fallback", "handed_off"]
    [failure] = of(records, ev.ActionFailed)
    assert failure.error.error_class == "agent_error"  # ctxmesh's tool_error
    caught = of(records, ev.TransitionFired)[1]
    assert (caught.from_state, caught.to_state, caught.event_type, caught.transition) == (
        "billing",
        "fallback",
        "task.failed",
        -1,  # a catch entry
    )
    assert stack.agents.inputs["human-handoff"] == [
        {"message": "charged twice", "reason": "tool_error: refunds API unavailable"}
    ]


async def test_support_flow_any_other_failure_class_is_caught_by_the_star(stack: Stack) -> None:
    stack.agents.answer("triage", {"topic": "billing"})
    stack.agents.answer("billing", {"text": "no `answer` key"})  # breaks the output_schema
    stack.agents.answer("human-handoff", {"ticket": "HD-8"})
    run_id = await stack.start("support-flow", {"message": "charged twice"})
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert state.outputs["route"] == "fallback"
    [failure] = of(await stack.records(run_id), ev.ActionFailed)
    assert failure.error.error_class == "schema_error"


# --- research-digest: map (do + join) and loop -----------------------------------------------


def script_research(stack: Stack, *, reorder: bool = False) -> list[int]:
    """Research answers each question; with ``reorder`` the first waits until the third has
    started, so the items finish out of order. Returns [items in flight, most at a time]."""
    in_flight = [0, 0]  # now, most

    async def research(inp: dict[str, Any], ctx: TaskContext) -> Any:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        try:
            if reorder and inp["position"] == 0:
                await eventually(
                    lambda: any(i["position"] == 2 for i in stack.agents.inputs["research"]),
                    "the third item started",
                )
            return {"finding": f"finding on {inp['question']}"}
        finally:
            in_flight[0] -= 1

    stack.agents.script("research", research)
    return in_flight


async def summarize(inp: dict[str, Any], ctx: TaskContext) -> Any:
    return {"digest": " + ".join(f["finding"] for f in inp["findings"])}


async def test_research_digest_maps_in_input_order_joins_and_loops_until_approved(
    stack: Stack,
) -> None:
    stack.agents.answer("plan", {"questions": ["q0", "q1", "q2"]})
    in_flight = script_research(stack, reorder=True)
    stack.agents.script("summarize", summarize)

    async def review(inp: dict[str, Any], ctx: TaskContext) -> Any:
        return {"approved": inp["round"] == 2, "notes": f"round {inp['round']}"}

    stack.agents.script("review", review)
    run_id = await stack.start("research-digest", {"question": "why?"})
    state = await stack.finished(run_id)
    findings = [{"finding": f"finding on q{i}"} for i in range(3)]
    assert state.outputs == {
        "digest": "finding on q0 + finding on q1 + finding on q2",
        "findings": findings,  # input order, though item 0 finished last
        "review": {"approved": True, "notes": "round 2"},
    }
    assert in_flight[1] == 2  # map.parallelism
    assert stack.agents.inputs["summarize"] == [{"findings": findings}]  # the join
    assert [i["round"] for i in stack.agents.inputs["review"]] == [1, 2]
    records = await stack.records(run_id)
    [started] = of(records, ev.MapStarted)
    assert (started.items, started.parallelism, started.completion) == (
        ["q0", "q1", "q2"],
        2,
        "all",
    )
    completions = [c.item for c in of(records, ev.ActionCompleted) if c.item is not None]
    assert completions[-1] == 0  # finished last, yet first in the result
    assert path(records) == ["plan", "research", "summarize", "polish", "done"]


async def test_research_digest_a_loop_out_of_iterations_is_caught(stack: Stack) -> None:
    stack.agents.answer("plan", {"questions": ["q0"]})
    script_research(stack)
    stack.agents.script("summarize", summarize)
    stack.agents.answer("review", {"approved": False, "notes": "too vague"})
    run_id = await stack.start("research-digest", {"question": "why?"})
    state = await stack.finished(run_id)
    assert state.outputs == {"digest": "finding on q0", "approved": False, "notes": "too vague"}
    assert len(stack.agents.inputs["review"]) == 3  # loop.maxIterations
    failure = of(await stack.records(run_id), ev.TransitionFired)[-1]
    assert (failure.from_state, failure.to_state, failure.event_type) == (
        "polish",
        "unapproved",
        "task.failed",
    )


async def test_research_digest_a_failed_item_fails_the_map_fast(stack: Stack) -> None:
    stack.agents.answer("plan", {"questions": ["q0", "q1"]})

    async def research(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["position"] == 1:
            raise AgentError("no sources found")
        await asyncio.Event().wait()  # item 0 never answers: the map cancels it

    stack.agents.script("research", research)
    run_id = await stack.start("research-digest", {"question": "why?"})
    state = await stack.finished(run_id)
    assert state.outputs == {"error": "item 1 of map 'research' failed: no sources found"}
    records = await stack.records(run_id)
    [cancelled] = of(records, ev.ActionCancelled)
    item_0 = next(r for r in of(records, ev.ActionRequested) if r.item == 0)
    assert (cancelled.action_id, cancelled.reason) == (item_0.action_id, "map failed fast")
    assert "summarize" not in stack.agents.inputs


async def test_research_digest_more_items_than_the_fan_out_budget_run_none(
    stack: Stack,
) -> None:
    stack.agents.answer("plan", {"questions": [f"q{i}" for i in range(6)]})  # max_fan_out: 5
    run_id = await stack.start("research-digest", {"question": "why?"})
    state = await stack.finished(run_id)
    assert state.outputs is not None
    assert "budget.max_fan_out (5)" in state.outputs["error"]
    assert "research" not in stack.agents.inputs
