"""A publisher's attack on a batched trigger's window, as it would send it: its own
credential (as ``interlock creds issue publisher`` makes it) and plain nats-py, events
of a type it may publish into the key other tenants share, with ids of 60,000
characters (a CloudEvent id has no bound in the specification; in binary mode it is a
header, outside the bound on an event's payload). A window keeps every event's id: 20
such events made its entry larger than the server takes, every write of it failed
(``maximum payload exceeded``), the events of each write were retried, and the other
tenants' events of that key waited behind them, then shared their runs. Ids over 256
bytes are dead-lettered at intake (``id-too-long``), and the others' batch closes and
starts its run, of their events only, once each; ids at the bound are taken."""

from __future__ import annotations

import asyncio

import pytest

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.core.bounds import MAX_EVENT_ID_BYTES
from support.auth import SUBJECTS, Secured, publish_event, publisher, secured, secured_server
from support.runtime import DeadLetters, cli_env, eventually, run_cli

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROWS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: rows}
spec:
  triggers:
    - event: acme.row
      batch: {key: data.table, max_events: 20, max_wait: 1h}
      input: {table: '{{ data.table }}'}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.go, goto: done}
    done: {type: terminal}
"""


async def started(secured: Secured) -> list[ev.RunStartedData]:
    client = secured.operator
    out = []
    for row in await client.list_runs(workflow="rows"):
        records, _ = await client.runs.log.read(row["run_id"])
        first = records[0]
        assert isinstance(first, ev.RunStarted)
        out.append(first.data)
    return out


async def test_long_ids_are_refused_and_the_shared_window_closes(secured: Secured) -> None:
    applied = await secured.operator.apply([("rows.yaml", ROWS)])
    applied.compiled.raise_for_errors()
    nc, refusals = await publisher(secured, "acme.>", "long-id-publisher")

    async def row(event_id: str) -> None:
        await publish_event(nc, event_id, "acme.row", {"table": "shared"})

    long_ids = [f"{n}-" + "x" * 60_000 for n in range(20)]
    at_bound = "y" * (MAX_EVENT_ID_BYTES - 6)
    theirs = [f"tenant-{n}" for n in range(10)] + [f"{at_bound}-{n:04d}" for n in range(10)]
    try:
        async with DeadLetters(secured.operator.js, SUBJECTS) as letters:
            for event_id in long_ids:
                await row(event_id)
            for event_id in theirs:
                await row(event_id)
            reasons = []
            for _ in long_ids:
                letter = await letters.next()
                reasons.append((letter.headers or {}).get("Interlock-Dead-Letter-Reason"))
            assert reasons == ["id-too-long"] * len(long_ids)

            async def one_run() -> list[ev.RunStartedData] | None:
                found = await started(secured)
                return found or None

            (run,) = await eventually(one_run, what="the other tenants' batch's run")
            assert run.window is not None
            assert run.window.events == theirs
            assert run.window.closed_by == "max_events"
    finally:
        await nc.close()
    assert not refusals.errors
    assert len(await started(secured)) == 1  # once


async def test_emit_refuses_a_long_id_before_publishing(secured: Secured) -> None:
    creds = secured.issue(Role("publisher", events=("acme.>",)), "emitting-publisher")
    env = cli_env(secured.url, SUBJECTS.prefix, INTERLOCK_CREDS=str(creds))
    before = (await secured.operator.js.stream_info(SUBJECTS.events_stream)).state.messages
    long_id = "z" * (MAX_EVENT_ID_BYTES + 1)
    args = ["emit", "acme.row", "--source", "/p", "--id", long_id, "--data", '{"table": "t"}']
    done = await asyncio.to_thread(run_cli, *args, env=env)
    assert done.returncode == 2, done.stderr
    assert "256" in done.stderr
    assert "id" in done.stderr
    after = (await secured.operator.js.stream_info(SUBJECTS.events_stream)).state.messages
    assert after == before  # nothing published
    done = await asyncio.to_thread(
        run_cli, *args[:4], "--id", long_id[1:], *args[6:], "--wait", "0", env=env
    )
    assert done.returncode == 0, done.stderr
