"""Debounced triggers driven as an outside system drives them: a publisher's own
credential (as ``interlock creds issue publisher`` makes it) and ``interlock emit``. A
burst becomes one run with its last event; the publisher cannot reach another namespace's
window, neither by a type it may not publish nor by a key of the same text."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from interlock.client.queues import list_queues
from interlock.core import events as ev
from support.auth import Secured, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))

FLOWS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: bursts}
spec:
  triggers:
    - event: acme.push
      debounce: {key: data.repo, period: 4s, max_wait: 60s}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.go, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: rivals, namespace: globex}
spec:
  triggers:
    - event: globex.push
      debounce: {key: data.repo, period: 1s}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: globex.go, goto: done}
    done: {type: terminal}
"""


async def cli(secured: Secured, creds: Path | None, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_URL"] = secured.url
    if creds is not None:
        env["INTERLOCK_CREDS"] = str(creds)
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK, *args, cwd=secured.data, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, errs = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), errs.decode()


async def test_a_publishers_burst_starts_one_run_and_reaches_no_other_namespace(
    secured: Secured,
) -> None:
    (await secured.operator.apply([("flows.yaml", FLOWS)])).compiled.raise_for_errors()
    creds = secured.data / "burst-publisher.creds"
    code, _, errs = await cli(
        secured, None,
        "creds", "issue", "publisher", "--events", "acme.>", "--name", "burst-publisher",
        "-o", str(creds), "--keys", str(secured.data / "keys"),
    )  # fmt: skip
    assert code == 0, errs
    ids = ["b1", "b2", "b3"]
    for event_id in ids:
        code, out, errs = await cli(
            secured, creds,
            "emit", "acme.push", "--source", "https://acme.example", "--id", event_id,
            "--data", '{"repo": "globex/app"}', "--wait", "0",
        )  # fmt: skip
        assert code == 0, errs
        assert out.startswith(f"sent acme.push id={event_id}"), out
    # Another namespace's trigger: its type is not the publisher's to send.
    code, _, errs = await cli(
        secured, creds,
        "emit", "globex.push", "--source", "https://acme.example", "--data",
        '{"repo": "globex/app"}', "--wait", "0",
    )  # fmt: skip
    assert code == 5, errs
    assert "may not publish to il.events.globex.push" in errs

    async def started() -> list[ev.RunStartedData] | None:
        out = []
        for row in await secured.operator.list_runs():
            if row["workflow"] in ("bursts", "rivals"):
                records = await secured.operator.read(row["run_id"])
                first = records[0]
                assert isinstance(first, ev.RunStarted)
                out.append(first.data)
        return out or None

    found = await eventually(started, within=30, what="the burst's run")
    await asyncio.sleep(1)  # a second run, were there one, would be there by now
    [run] = await started() or []
    assert (run.namespace, run.workflow) == ("default", "bursts")
    assert run.trigger is not None
    assert run.trigger["id"] == "b3"
    assert run.window is not None
    assert (run.window.key, run.window.events) == ("globex/app", ids)
    assert found == [run]
    assert not [q for q in await list_queues(secured.operator) if "globex" in q.limit]
