"""ctxmesh Workflows written from the CRD reference alone (tests/dialects/written), run end
to end on a real nats-server as written and as `interlock convert` writes them, with
scripted agents."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from flow_support import REPO, RecordingAgents, ScriptedStack, path, worker_orchestrator

from interlock.cli.main import main as interlock_main
from interlock.transport.subjects import Subjects

WRITTEN = REPO / "tests" / "dialects" / "written"
CAPABILITIES = ["scorer", "handler"]
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
