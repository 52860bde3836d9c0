"""ctxmesh Workflows written from the CRD reference alone (tests/dialects/written), run end
to end on a real nats-server as written and as `interlock convert` writes them, with
scripted agents."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.sdk import TaskContext
from interlock.transport.subjects import Subjects
from support.flow import REPO, RecordingAgents, ScriptedStack, of, path, worker_orchestrator

WRITTEN = REPO / "tests" / "dialects" / "written"
CAPABILITIES = ["scorer", "handler", "triage-agent", "answer-agent", "billing-agent"]
CAPABILITIES += ["human-handoff-agent"]  # the kubectl List's (ctxmesh-kubectl-list.yaml)
Stack = ScriptedStack[RecordingAgents]


@pytest.fixture(params=["as-written", "converted"])
def files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Path]:
    originals = sorted(WRITTEN.glob("ctxmesh-*.yaml"))
    if request.param == "as-written":
        return originals
    assert interlock_main(["convert", *map(str, originals), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    return sorted(tmp_path.glob("*.yaml"))


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, files: list[Path]) -> AsyncIterator[Stack]:
    agents = RecordingAgents(CAPABILITIES)
    async with worker_orchestrator(
        nats_url, subjects, files, agents, worker="written", concurrency=4
    ) as (client, timers, _):
        yield Stack(client, timers, agents)


@pytest.mark.parametrize(
    ("answer", "route", "inputs"),
    [
        (
            {"score": 0.75, "note": "fine", "items": []},
            ["score-batch", "high-value", "done"],
            [{"score": 0.75, "note": "fine"}],
        ),
        (
            {"score": 0.9, "items": ["a", "b"]},  # no note: has() is false
            ["score-batch", "each-item", "done"],
            [{"item": "a", "score": 0.9}, {"item": "b", "score": 0.9}],
        ),
    ],
)
async def test_a_step_named_with_a_dash_is_read_by_index(
    stack: Stack, answer: dict[str, Any], route: list[str], inputs: list[dict[str, Any]]
) -> None:
    stack.agents.answer("scorer", answer)
    stack.agents.answer("handler", {"ok": True})
    run_id = await stack.client.start("my-team/score-then-route", {})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert path(await stack.records(run_id)) == route
    assert stack.agents.inputs["handler"] == inputs


@pytest.mark.parametrize(
    ("amount", "answer"),
    [(80, {"limit": 100, "rush": 0}), (80.0, {"limit": 100.0, "rush": 0.0})],
    ids=["80", "80.0"],
)
async def test_numbers_compare_as_go_reads_json_however_spelled(
    stack: Stack, amount: float, answer: dict[str, Any]
) -> None:
    # input.amount <= 100.0 with 80: CEL's int and double never compare, Go's JSON has
    # doubles only. The branch is the same whichever way the JSON spelled the numbers.
    stack.agents.answer("scorer", answer)
    stack.agents.answer("handler", {"ok": True})
    run_id = await stack.client.start("my-team/amount-router", {"amount": amount})
    state = await stack.finished(run_id)
    records = await stack.records(run_id)
    assert path(records) == ["check", "small", "done"]
    assert of(records, ev.GuardFailed) == []
    (scorer_input,) = stack.agents.inputs["scorer"]
    assert json.dumps(scorer_input) == '{"amount": 80, "third": 26.666666666666668}'
    assert json.dumps(stack.agents.inputs["handler"]) == '[{"amount": 80}]'
    assert state.outputs == {"step": "small", "output": {"ok": True}}


async def test_a_kubectl_list_of_workflows_runs_each_of_them(stack: Stack) -> None:
    """``kubectl get -o yaml`` of several Workflows is a v1 List, with what the cluster
    added to each (uid, managedFields, status): each item runs as the Workflow it is."""
    stack.agents.answer("triage-agent", {"topic": "billing"})
    stack.agents.answer("billing-agent", {"refund": "R-1"})
    stack.agents.answer("answer-agent", {"answer": "42"})
    run_id = await stack.client.start("my-team/support-listed", {"message": "refund please"})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert path(await stack.records(run_id)) == ["classify", "billing", "done"]
    assert state.outputs == {"step": "billing", "output": {"refund": "R-1"}}
    assert stack.agents.inputs["triage-agent"] == [{"message": "refund please"}]
    run_id = await stack.client.start("my-team/triage-listed", {})
    state = await stack.finished(run_id)
    assert state.outputs == {"step": "answer", "output": {"answer": "42"}}
    assert stack.agents.inputs["answer-agent"] == [{"topic": "billing"}]


async def test_a_step_merged_from_another_with_a_merge_key_runs_as_written(
    stack: Stack,
) -> None:
    stack.agents.answer("scorer", {"score": 0.5})
    stack.agents.answer("handler", {"ok": True})
    run_id = await stack.client.start("my-team/merged-steps", {})
    state = await stack.finished(run_id)
    assert state.status == "completed", state.error
    assert path(await stack.records(run_id)) == ["first-pass", "second-pass", "report", "done"]
    # second-pass took the agent, retries and schema of first-pass, and its own input
    assert stack.agents.inputs["scorer"] == [{"pass": 1}, {"pass": 2}]
    assert stack.agents.inputs["handler"] == [{"first": 0.5, "second": 0.5}]


async def test_a_branch_taken_because_a_guard_errored_says_so(
    stack: Stack,
    nats_url: str,
    subjects: Subjects,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack.agents.answer("scorer", {"limit": 100})  # no rush: its guard cannot be evaluated
    stack.agents.answer("handler", {"ok": True})
    run_id = await stack.client.start("my-team/amount-router", {"amount": 80})
    await stack.finished(run_id)
    records = await stack.records(run_id)
    (failed,) = of(records, ev.GuardFailed)
    assert failed.transition == 0
    fired = [t for t in of(records, ev.TransitionFired) if t.from_state == "check"]
    assert [(t.to_state, t.transition, t.guard_errors) for t in fired] == [("small", 1, [0])]
    # describe says the branch was decided by the error, and which error.
    monkeypatch.setenv("INTERLOCK_URL", nats_url)
    monkeypatch.setenv("INTERLOCK_PREFIX", subjects.prefix)
    code = await asyncio.to_thread(interlock_main, ["describe", "run", run_id])
    out = capsys.readouterr().out
    assert code == 0
    assert "guards that failed to evaluate" in out
    assert "decided by this error: on[1] -> small" in out
    code = await asyncio.to_thread(interlock_main, ["describe", "run", run_id, "-o", "json"])
    (error,) = json.loads(capsys.readouterr().out)["guard_errors"]
    assert (error["state"], error["transition"], error["taken"], error["to_state"]) == (
        "check",
        0,
        1,
        "small",
    )
    assert "rush" in error["error"]


# --- a kxm Runtime workflow (kxm-fix-flaky.yaml) ------------------------------------------


class KxmAgents(RecordingAgents):
    """The implementer answers done; the gate runner answers from ``gates``."""

    def __init__(self) -> None:
        super().__init__(["kxm.implementer", "kxm.gate"])
        self.gates: list[bool] = []

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        if capability == "kxm.gate":
            return {"ok": self.gates.pop(0)}
        return {"outcome": "done"}


@pytest.fixture
async def kxm_stack(
    request: pytest.FixtureRequest,
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> AsyncIterator[ScriptedStack[KxmAgents]]:
    path = WRITTEN / "kxm-fix-flaky.yaml"
    if request.param == "converted":
        assert interlock_main(["convert", str(path), "-o", str(tmp_path)]) == 0
        path = tmp_path / "kxm-fix-flaky.yaml"
    capsys.readouterr()
    agents = KxmAgents()
    async with worker_orchestrator(
        nats_url, subjects, [path], agents, worker="kxm-written", concurrency=4
    ) as (client, timers, _):
        yield ScriptedStack(client, timers, agents)


KXM = pytest.mark.parametrize("kxm_stack", ["as-written", "converted"], indirect=True)


@KXM
async def test_runtime_step_fields_reach_the_agent_and_the_gate(
    kxm_stack: ScriptedStack[KxmAgents],
) -> None:
    kxm_stack.agents.gates = [True]
    run_id = await kxm_stack.client.start("kxm-fix-flaky", {})
    state = await kxm_stack.finished(run_id)
    assert state.status == "completed", state.error
    (implement,) = kxm_stack.agents.inputs["kxm.implementer"]
    assert implement["instructions"] == "Touch only the tests/ folder and name the root cause."
    (gate,) = kxm_stack.agents.inputs["kxm.gate"]
    assert gate["repositories"] == ["example/app", "example/fixtures"]
    assert "model" not in implement  # kept, not acted on


@KXM
async def test_max_attempts_ends_the_run_with_budget_step_attempts(
    kxm_stack: ScriptedStack[KxmAgents],
) -> None:
    kxm_stack.agents.gates = [False, False, False]
    run_id = await kxm_stack.client.start("kxm-fix-flaky", {})
    state = await kxm_stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == (
        "budget_step_attempts: step 'implement' would be attempted more than its "
        "maxAttempts (2) times"
    )
    assert len(kxm_stack.agents.inputs["kxm.implementer"]) == 2  # maxAttempts: 2


def test_an_unknown_step_key_is_a_warning_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = WRITTEN / "kxm-fix-flaky.yaml"
    assert interlock_main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert "ok  workflow default/kxm-fix-flaky" in captured.out
    assert captured.err.splitlines()[0] == (
        f"{path}:16:5: warning: kxm.unknown-key: step 'implement': key 'model' is not one this "
        "loader knows; it is kept (annotation kxm.step.implement.model) and not acted on"
    )
    assert interlock_main(["convert", str(path)]) == 0
    converted = capsys.readouterr().out
    assert "kxm.step.implement.model: '\"fast\"'" in converted
    assert "# step 'implement': 'model' is not a field this loader knows" in converted
