"""Pausing a capability as each role, with the credential `interlock creds issue` gives it:
the operator's pauses and resumes (its requests held, recorded, then let go), an agent's and
a publisher's are refused by NATS at once with one line, the pause left as it was."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_role_cli import EXIT_DENIED, cli, issued

from interlock.core import events as ev
from support.auth import Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def held_request(secured: Secured) -> str:
    """A run of ``guarded`` whose request of ``held`` is held by its capability's pause
    (the orchestrator follows the pause a moment after it is written: runs started before
    that are dispatched as usual)."""
    for _ in range(50):
        run_id = await secured.operator.start("guarded", {})
        for _ in range(50):
            records = await secured.operator.read(run_id)
            if any(isinstance(r, ev.ActionQueued) for r in records):
                return run_id
            if any(isinstance(r, ev.ActionRequested) for r in records):
                await asyncio.sleep(0.05)  # its request: held, or on its way out
        await asyncio.sleep(0.1)
    raise AssertionError("no request of the paused capability was held")


async def test_only_an_operator_pauses_a_capability(secured: Secured) -> None:
    operator = secured.auth.operator
    for role in ("agent", "publisher"):
        creds = await issued(secured, role)
        code, out, errs, took = await cli(secured, creds, "pause", "capability", "held")
        assert code == EXIT_DENIED, (role, out, errs)
        lines = errs.strip().splitlines()
        assert len(lines) == 1, errs
        assert lines[0].startswith("interlock: permission denied: "), errs
        assert took < 30
    code, out, errs, _ = await cli(secured, operator, "queues", "--capability", "held", "--json")
    assert code == 0, errs
    assert '"paused": true' not in out  # the refused pauses left nothing

    code, out, errs, _ = await cli(
        secured, operator, "pause", "capability", "held", "--reason", "vendor outage"
    )
    assert code == 0, errs
    assert "paused capability held" in out
    run_id = await held_request(secured)
    (queued,) = [r for r in await secured.operator.read(run_id) if isinstance(r, ev.ActionQueued)]
    assert queued.data.limit == "cap:held@paused"
    for role in ("agent", "publisher"):
        creds = await issued(secured, role)
        code, out, errs, _ = await cli(secured, creds, "resume", "capability", "held")
        assert code == EXIT_DENIED, (role, out, errs)
    code, out, errs, _ = await cli(secured, operator, "queues", "--capability", "held")
    assert code == 0, errs
    (row,) = [line.split() for line in out.splitlines() if line.startswith("cap:held@paused")]
    assert row[-4:-2] == ["since", row[-3]], out  # PAUSED: since when, and why
    assert row[-3].endswith("Z:"), out
    assert row[-2:] == ["vendor", "outage"], out
    assert int(row[3]) >= 1, out  # QUEUED: the held request
    code, out, errs, _ = await cli(secured, operator, "queues", "--capability", "held", "--json")
    lines = [q for q in json.loads(out) if q["paused"]]
    assert lines, out
    assert {q["paused_reason"] for q in lines} == {"vendor outage"}, out
    assert all(q["paused_since"].endswith("Z") for q in lines), out

    code, out, errs, _ = await cli(secured, operator, "resume", "capability", "held")
    assert code == 0, errs
    for _ in range(600):
        records = await secured.operator.read(run_id)
        if any(isinstance(r, ev.ActionAdmitted) for r in records):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the held request was not let go")
    assert sum(isinstance(r, ev.ActionAdmitted) for r in records) == 1
