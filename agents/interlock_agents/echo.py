"""The ``echo`` agent: capability ``echo`` returns its input; ``review`` is a fixed reviewer.

``review`` is deterministic so demos and tests can steer a workflow from its input: the
score is the input's ``score`` (default 8) and the summary counts the lines of ``diff``.
"""

from __future__ import annotations

from typing import Any

from interlock.sdk import Worker
from interlock_agents import capability_schemas

DEFAULT_SCORE = 8

worker = Worker("echo", concurrency=16)


@worker.capability("echo", **capability_schemas("echo", "echo"))
async def echo(inp: dict[str, Any]) -> dict[str, Any]:
    """Return the input unchanged."""
    return inp


@worker.capability("review", **capability_schemas("echo", "review"))
async def review(inp: dict[str, Any]) -> dict[str, Any]:
    """Score = ``inp["score"]`` (default 8); summary = how many diff lines were read."""
    score = inp.get("score", DEFAULT_SCORE)
    diff = inp.get("diff", "")
    lines = len(diff.splitlines()) if isinstance(diff, str) else 0
    return {"score": score, "summary": f"echo reviewed {lines} line(s) of diff: score {score}"}
