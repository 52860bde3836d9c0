"""Rates of triggers on a real nats-server, with time on an advanceable clock: events over
a trigger's rate start their runs later, in order, never more than ``limit`` in any
``per`` (``queue``), or are dead-lettered (``drop``); keys keep rates of their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from interlock.client.queues import list_queues
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.rfc3339 import parse_time
from interlock.runtime.client import InterlockClient
from interlock.runtime.timers import ClockTimers
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.flow import WAIT, clock_orchestrator
from support.runtime import DeadLetters, cli_env, eventually, run_cli


def workflow(rate: str) -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: calls}}
spec:
  triggers:
    - event: com.example.call
      rate: {rate}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {{event: go, goto: done}}
    done:
      type: terminal
"""


class Stack:
    def __init__(self, client: InterlockClient, timers: ClockTimers) -> None:
        self.client, self.timers = client, timers
        self.sent = 0

    async def call(self, customer: str, n: int = 1) -> list[str]:
        ids = []
        for _ in range(n):
            self.sent += 1
            await self.client.emit(
                CloudEvent(
                    id=f"c{self.sent}",
                    source="/api",
                    type="com.example.call",
                    data={"customer": customer, "n": self.sent},
                )
            )
            ids.append(f"c{self.sent}")
        return ids

    async def admitted(self) -> dict[str, str]:
        """Trigger event id -> when its run entered its first state, of the runs that
        have (by their logs)."""
        out = {}
        for row in await self.client.list_runs():
            records, _ = await self.client.runs.log.read(row["run_id"])
            first = records[0]
            assert isinstance(first, ev.RunStarted)
            assert first.data.trigger is not None
            entered = [r for r in records if isinstance(r, ev.StateEntered)]
            if entered:
                out[str(first.data.trigger["id"])] = entered[0].time
        return out

    async def runs(self) -> int:
        return len(await self.client.list_runs())

    async def settled(self, count: int, admitted: int) -> dict[str, str]:
        async def there() -> dict[str, str] | None:
            if await self.runs() < count:
                return None
            found = await self.admitted()
            return found if len(found) == admitted else None

        found = await eventually(there, within=WAIT, what=f"{admitted} of {count} runs admitted")
        assert isinstance(found, dict)
        return found


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    async with clock_orchestrator(nats_url, subjects, index_hold=0) as (client, timers, _):
        yield Stack(client, timers)


async def test_events_over_the_rate_start_later_in_order(stack: Stack) -> None:
    await stack.client.apply([("calls.yaml", workflow("{limit: 2, per: 10s, key: data.customer}"))])
    start = stack.timers.clock.moment
    ids = await stack.call("acme", 5)
    other = await stack.call("globex")
    first = await stack.settled(6, 3)
    assert set(first) == {ids[0], ids[1], other[0]}
    for seconds, admitted in ((10, 5), (10, 6)):
        await stack.timers.advance(seconds)
        found = await stack.settled(6, admitted)
    waited = {k: (parse_time(v) - start).total_seconds() for k, v in found.items()}
    assert [waited[i] for i in ids] == [0, 0, 10, 10, 20]
    assert waited[other[0]] == 0
    # No 10 s ever held more than two starts of acme.
    times = sorted(waited[i] for i in ids)
    assert all(times[k + 2] - times[k] >= 10 for k in range(len(times) - 2))
    # explain and replay re-drive each run to its log, its wait for the rate included.
    definition, _ = await stack.client.registry.latest("calls")
    said, why = [], []
    for row in await stack.client.list_runs():
        records, _ = await stack.client.runs.log.read(row["run_id"])
        report = analysis.explain(records, definition)
        assert report["reproduces"], report.get("mismatch")
        said += [r["summary"] for step in report["steps"] for r in step["records"]]
        why += [step["why_none"] for step in report["steps"] if step["fired"] is None]
    assert sum("by the rate of default/calls#trigger1 for key 'acme'" in s for s in said) == 3
    # What each wait and its end was: the rate's timer, then the admission, after how long.
    assert why.count("the rate timer came due: the run goes on to its admission") == 3
    assert said.count("run.queued for no slot (admitted next)") == 3  # no limit to wait for
    assert sorted(s.rsplit("(after ", 1)[1] for s in said if s.startswith("run.admitted")) == [
        "10.0s in line)",
        "10.0s in line)",
        "20.0s in line)",
    ]


async def test_a_queued_run_says_why_it_waits(
    stack: Stack, nats_url: str, subjects: Subjects
) -> None:
    await stack.client.apply([("calls.yaml", workflow("{limit: 1, per: 1h}"))])
    await stack.call("acme", 2)
    await stack.settled(2, 1)
    waiting = [r["run_id"] for r in await stack.client.list_runs() if r["status"] == "running"]
    described = None
    for run_id in waiting:
        records, _ = await stack.client.runs.log.read(run_id)
        if not any(isinstance(r, ev.StateEntered) for r in records):
            done = await asyncio.to_thread(
                run_cli, "describe", "run", run_id, env=cli_env(nats_url, subjects.prefix)
            )
            described, queued = done.stdout, run_id
    assert described is not None
    assert "by the rate of default/calls#trigger1 for key '' (1 per 3600s)" in described
    # The run list says what it waits for: its trigger's rate (the index is written behind).
    listed = await eventually(
        lambda: _listed_waiting(nats_url, subjects), within=WAIT, what="the run list's line"
    )
    assert "running (queued)" in listed
    assert "rate of #trigger1" in listed
    shown = await asyncio.to_thread(
        run_cli, "queues", "--workflow", "calls", env=cli_env(nats_url, subjects.prefix)
    )
    line = shown.stdout.splitlines()[1].split()
    assert line[:4] == ["default/calls#trigger1@rate", "-", "1/1", "1"], shown.stdout
    # Its turn: the rate's timer takes it on, with no limit to wait for, and logs says so.
    await stack.timers.advance(3600)
    await stack.settled(2, 2)
    logged = await asyncio.to_thread(
        run_cli, "logs", queued, env=cli_env(nats_url, subjects.prefix)
    )
    assert "run queued       for no slot (admitted next)\n" in logged.stdout, logged.stdout


async def test_events_over_the_rate_are_dropped_with_a_dead_letter(
    stack: Stack, nats_url: str, subjects: Subjects
) -> None:
    await stack.client.apply([("calls.yaml", workflow("{limit: 1, per: 1m, on_limit: drop}"))])
    async with DeadLetters(stack.client.js, subjects) as letters:
        await stack.call("acme", 3)
        dropped = [await letters.next(), await letters.next()]
    assert [m.headers and m.headers.get("Interlock-Dead-Letter-Reason") for m in dropped] == [
        "rate-limited"
    ] * 2
    await stack.settled(1, 1)
    listed = await asyncio.to_thread(
        run_cli,
        "dead-letters",
        "list",
        "--reason",
        "rate-limited",
        env=cli_env(nats_url, subjects.prefix),
    )
    assert listed.stdout.count("rate-limited") == 2, listed.stdout
    assert "default/calls#trigger1 starts at most 1 run per 60s" in listed.stdout
    # interlock emit of one more says that it is dropped, where it said that no
    # orchestrator had started its run.
    said = await asyncio.to_thread(
        run_cli, "emit", "com.example.call", "--source", "/api", "--id", "c-cli",
        "--data", '{"customer": "acme"}', env=cli_env(nats_url, subjects.prefix),
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert (
        "dead-lettered (rate-limited) by default/calls: default/calls#trigger1 starts at most "
        "1 run per 60s for key '': this event is over it and is dropped (on_limit: drop)"
    ) in said.stdout, said.stdout
    assert "not started" not in said.stdout
    # A minute on, the rate has room again.
    await stack.timers.advance(60)
    await stack.call("acme")
    await stack.settled(2, 2)


async def test_a_run_past_its_rate_still_waits_for_its_concurrency_slot(stack: Stack) -> None:
    limited = workflow("{limit: 1, per: 10s}").replace(
        "  initial_state:", "  concurrency: [{key: '\"all\"', limit: 1}]\n  initial_state:"
    )
    await stack.client.apply([("calls.yaml", limited)])
    ids = await stack.call("acme", 2)
    await stack.settled(2, 1)
    await stack.timers.advance(10)  # its rate lets the second go on: to its slot, held

    async def in_line() -> bool:
        found = await list_queues(stack.client)
        return any(q.limit == "default/calls#1" and q.queued == 1 for q in found)

    await eventually(in_line, within=WAIT, what="the second run in line for the slot")
    assert set(await stack.admitted()) == {ids[0]}
    definition, _ = await stack.client.registry.latest("calls")
    assert await stack.client.cancel(derive_run_id(definition, "/api", ids[0]), "done")
    found = await stack.settled(2, 2)
    assert set(found) == set(ids)


async def _listed_waiting(nats_url: str, subjects: Subjects) -> str | None:
    """``interlock runs --waiting slot``'s table once it lists a run, else None."""
    done = await asyncio.to_thread(
        run_cli, "runs", "--waiting", "slot", env=cli_env(nats_url, subjects.prefix)
    )
    assert done.returncode == 0, done.stderr
    return done.stdout if len(done.stdout.splitlines()) > 1 else None
