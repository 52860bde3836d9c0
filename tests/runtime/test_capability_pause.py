"""Pausing a capability on a real nats-server, through the CLI as an operator types it:
nothing more of it is dispatched (its requests wait, recorded as queued, their deadlines not
running); resumed, every request goes on, in order, once; interlock queues says so."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from interlock.client.queues import list_queues
from interlock.core import events as ev
from interlock.core.rfc3339 import parse_time
from interlock.runtime.timers import ClockTimers, ManualClock
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.concurrency import all_freed, calling, requests
from support.runtime import (
    TIMEOUT,
    Stack,
    cli_env,
    connect,
    eventually,
    run_cli,
    running_stack,
    serving,
    yaml,
)

AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: napagent
    spec:
      capabilities:
        - name: nap
          timeout_seconds: 5
        - name: nap.capped
          concurrency: {limit: 1}
        - name: nap.rated
          rate: {limit: 1, per: 1m}
    """
)

WORKFLOW = calling("napping", "nap", "nap.capped")


async def cli(nats_url: str, subjects: Subjects, *args: str) -> Any:
    return await asyncio.to_thread(run_cli, *args, env=cli_env(nats_url, subjects.prefix))


async def paused(stack: Stack, nats_url: str, subjects: Subjects, capability: str) -> None:
    """``interlock pause capability`` of ``capability``, once the orchestrator holds it."""
    done = await cli(nats_url, subjects, "pause", "capability", capability)
    assert done.returncode == 0, done.stderr
    pauses = stack.orchestrator.flow.admission.pauses

    async def seen() -> bool:
        return pauses.holds_capability(capability)

    await eventually(seen, what="the orchestrator sees the pause")


async def test_a_paused_capability_dispatches_nothing_and_loses_nothing(
    nats_url: str, subjects: Subjects
) -> None:
    handled: list[tuple[str, int]] = []
    async with running_stack(nats_url, subjects, [AGENT, WORKFLOW], worker=False) as stack:
        # One task at a time: the second actions are asked in the order the first ones end,
        # so the first ones end in order (with several at once, 2 could end before 1).
        worker = Worker("napagent", concurrency=1, grace_period=0.1)

        @worker.capability("nap")
        async def nap(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            handled.append(("nap", inp["n"]))
            return inp

        @worker.capability("nap.capped")
        async def capped(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            handled.append(("nap.capped", inp["n"]))
            return inp

        async with serving(nats_url, subjects, worker):
            for name in ("nap", "nap.capped"):
                done = await cli(nats_url, subjects, "pause", "capability", name)
                assert done.returncode == 0, done.stderr
                assert f"paused capability {name}" in done.stdout
            pauses = stack.orchestrator.flow.admission.pauses

            async def seen() -> bool:
                return pauses.holds_capability("nap") and pauses.holds_capability("nap.capped")

            await eventually(seen, what="the orchestrator sees both pauses")
            runs = [await stack.client.start("napping", {"n": n}) for n in range(3)]

            async def all_held() -> bool:
                for run_id in runs:
                    found = await stack.records(run_id)
                    if not any(isinstance(r, ev.ActionQueued) for r in found):
                        return False
                return True

            await eventually(all_held, what="three requests held")
            await asyncio.sleep(0.3)  # nothing is dispatched meanwhile
            assert handled == []
            (queued,) = [r for r in await stack.records(runs[0]) if isinstance(r, ev.ActionQueued)]
            assert (queued.data.limit, queued.data.timeout_s) == ("cap:nap@paused", 5)
            # describe shows the request held, and no timeout of it: none runs while held
            # (the one scheduled as it was asked for changes nothing when it fires).
            described = await cli(nats_url, subjects, "describe", "run", runs[0], "--json")
            assert described.returncode == 0, described.stderr
            shown_run = json.loads(described.stdout)
            (held,) = shown_run["pending"]
            assert held["held"] == "cap:nap@paused"
            assert [t for t in shown_run["timers"] if t["purpose"] == "action-timeout"] == []
            assert any(isinstance(r, ev.TimerScheduled) for r in await stack.records(runs[0]))
            # explain says so too: the answer it waits for is held, its first timer void.
            explained = await cli(nats_url, subjects, "explain", runs[0])
            tail = explained.stdout.split("\nwaiting in state ")[1]
            assert f"(action {held['action_id']}, attempt 1, held: cap:nap@paused)" in tail
            assert "timer action-timeout" not in tail, tail
            shown = await cli(nats_url, subjects, "queues", "--capability", "nap", "--json")
            assert shown.returncode == 0, shown.stderr
            (line,) = json.loads(shown.stdout)
            assert (line["limit"], line["queued"], line["kind"], line["paused"]) == (
                "cap:nap@paused",
                3,
                "paused",
                True,
            )
            # A paused capability nobody waits for yet is shown too, with its limit.
            shown = await cli(nats_url, subjects, "queues", "--capability", "nap.capped")
            rows = [row.split(maxsplit=5) for row in shown.stdout.splitlines()[1:]]
            assert [row[:5] for row in rows] == [
                ["cap:nap.capped", "-", "0/1", "0", "-"],
                ["cap:nap.capped@paused", "paused", "0/0", "0", "-"],
            ]
            # PAUSED: since when (the pause's own time on both lines), and why.
            (since,) = {row[5] for row in rows}
            assert re.fullmatch(r"since \S+Z: paused by an operator", since), shown.stdout

            done = await cli(nats_url, subjects, "resume", "capability", "nap")
            assert "resumed capability nap" in done.stdout

            # On to the next action, held by its own paused capability.
            async def capped_held() -> bool:
                queued = await list_queues(stack.client, capability="nap.capped")
                return any(q.queued == 3 for q in queued)

            await eventually(capped_held, what="the second actions held in turn")
            assert sorted(handled) == [("nap", 0), ("nap", 1), ("nap", 2)]
            done = await cli(nats_url, subjects, "resume", "capability", "nap.capped")
            assert done.returncode == 0
            outcomes = [await stack.wait(r) for r in runs]
            assert {o.status for o in outcomes} == {"completed"}
            assert [n for c, n in handled if c == "nap.capped"] == [0, 1, 2]  # in order
            # Its own version explains and replays it: the waits were the orchestrator's.
            explained = await cli(nats_url, subjects, "explain", runs[1])
            assert explained.returncode == 0, explained.stderr
            assert "does not reproduce" not in explained.stdout, explained.stdout
            assert "waits until capability nap is resumed" in explained.stdout
            replayed = await cli(nats_url, subjects, "replay", runs[1], "--against", "1")
            assert replayed.returncode == 0, replayed.stdout
            assert "agree" in replayed.stdout
            seen_requests = await requests(stack.client.nc, subjects)
            assert len(seen_requests.counts) == 6  # every request held: admitted once each
            for counts in seen_requests.counts.values():
                assert counts["action.admitted"] == 1, counts
            await all_freed(stack.orchestrator.flow.admission.slots)
            again = await cli(nats_url, subjects, "resume", "capability", "nap")
            assert "was not paused" in again.stdout
            missing = await cli(nats_url, subjects, "pause", "capability", "nope")
            assert missing.returncode == 1
            assert "no AgentDef declares capability 'nope'" in missing.stderr


def one_action(name: str, capability: str) -> Any:
    return yaml(
        f"""\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: {name}
        spec:
          inputs:
            n: {{type: integer, required: true}}
          initial_state: work
          states:
            work:
              actions:
                - capability: {capability}
                  input: {{n: "{{{{ inputs.n }}}}"}}
              on:
                - {{event: task.completed, goto: done}}
            done:
              type: terminal
        """
    )


CAPPED = one_action("capped", "nap.capped")
RATED = one_action("rated", "nap.rated")


async def test_a_request_in_a_limits_line_stays_held_when_its_capability_is_paused(
    nats_url: str, subjects: Subjects
) -> None:
    """Paused while a request waits for the limit's slot: when the slot frees, the
    request is not admitted (nor dispatched) until the capability is resumed."""
    handled: list[int] = []
    gate = asyncio.Event()
    async with running_stack(nats_url, subjects, [AGENT, CAPPED], worker=False) as stack:
        nc = await connect(nats_url)
        worker = Worker("napagent", concurrency=8, grace_period=0.1)

        @worker.capability("nap.capped")
        async def capped(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            handled.append(inp["n"])
            if inp["n"] == 0:
                await gate.wait()
            return inp

        task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            first = await stack.client.start("capped", {"n": 0})

            async def working() -> bool:
                return handled == [0]

            await eventually(working, what="the first request at work")
            second = await stack.client.start("capped", {"n": 1})

            async def in_line(limit: str) -> bool:
                found = await stack.records(second)
                return any(isinstance(r, ev.ActionQueued) and r.data.limit == limit for r in found)

            await eventually(lambda: in_line("cap:nap.capped"), what="the second in line")
            await paused(stack, nats_url, subjects, "nap.capped")
            gate.set()  # the first completes: its slot frees while the capability is paused
            assert (await stack.wait(first)).status == "completed"
            await eventually(lambda: in_line("cap:nap.capped@paused"), what="held for the pause")
            await asyncio.sleep(0.3)  # nothing is dispatched meanwhile
            assert handled == [0]
            assert not any(isinstance(r, ev.ActionAdmitted) for r in await stack.records(second))

            done = await cli(nats_url, subjects, "resume", "capability", "nap.capped")
            assert done.returncode == 0, done.stderr
            assert (await stack.wait(second)).status == "completed"
            assert handled == [0, 1]
            seen_requests = await requests(stack.client.nc, subjects)
            for counts in seen_requests.counts.values():
                assert counts["action.admitted"] == 1, counts
            await all_freed(stack.orchestrator.flow.admission.slots)
        finally:
            gate.set()
            await worker.stop(force=True)
            await task
            await nc.close()


async def test_a_request_given_a_rate_token_stays_held_when_its_capability_is_paused(
    nats_url: str, subjects: Subjects
) -> None:
    """Paused while a request waits for its rate's next token: when the token comes (the
    line's timer, its clock simulated), the request keeps it, held until the resume."""
    clock = ManualClock("2026-01-01T00:00:00Z")
    timers = ClockTimers(clock)
    handled: list[int] = []
    manifests = [AGENT, RATED]
    async with running_stack(
        nats_url, subjects, manifests, worker=False, clock=clock, timers=timers
    ) as stack:
        worker = Worker("napagent", concurrency=8, grace_period=0.1)

        @worker.capability("nap.rated")
        async def rated(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            handled.append(inp["n"])
            return inp

        async with serving(nats_url, subjects, worker):
            first = await stack.client.start("rated", {"n": 0})
            assert (await stack.wait(first)).status == "completed"
            second = await stack.client.start("rated", {"n": 1})

            async def in_line(limit: str) -> bool:
                found = await stack.records(second)
                return any(isinstance(r, ev.ActionQueued) and r.data.limit == limit for r in found)

            await eventually(lambda: in_line("cap:nap.rated:rate"), what="waiting for a token")
            await paused(stack, nats_url, subjects, "nap.rated")
            assert await timers.advance(60.0) == 1  # the next token, to the paused request
            await eventually(lambda: in_line("cap:nap.rated@paused"), what="held for the pause")
            await asyncio.sleep(0.3)  # nothing is dispatched meanwhile
            assert handled == [0]
            assert not any(isinstance(r, ev.ActionAdmitted) for r in await stack.records(second))

            done = await cli(nats_url, subjects, "resume", "capability", "nap.rated")
            assert done.returncode == 0, done.stderr
            assert (await stack.wait(second)).status == "completed"
            assert handled == [0, 1]  # with the token it was given: no second one waited for
            assert timers.pending == 0


async def test_explain_says_a_held_requests_first_timeout_changed_nothing(
    nats_url: str, subjects: Subjects
) -> None:
    """The action-timeout a request scheduled as it was asked for is void while its paused
    capability holds it: it fires (its clock simulated past the 5 s) and changes nothing,
    and explain says so, where it said the timer "moved the run without a guard"."""
    clock = ManualClock("2026-01-01T00:00:00Z")
    timers = ClockTimers(clock)
    async with running_stack(
        nats_url, subjects, [AGENT, WORKFLOW], worker=False, clock=clock, timers=timers
    ) as stack:
        worker = Worker("napagent", concurrency=8, grace_period=0.1)

        @worker.capability("nap")
        async def nap(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            return inp

        @worker.capability("nap.capped")
        async def capped(inp: dict[str, int], ctx: TaskContext) -> dict[str, int]:
            return inp

        async with serving(nats_url, subjects, worker):
            await paused(stack, nats_url, subjects, "nap")
            run_id = await stack.client.start("napping", {"n": 0})

            async def recorded(kind: type[Any]) -> bool:
                return any(isinstance(r, kind) for r in await stack.records(run_id))

            await eventually(lambda: recorded(ev.ActionQueued), what="the request held")

            async def scheduled() -> bool:
                return timers.pending == 1

            await eventually(scheduled, what="its first action-timeout scheduled")
            (timeout,) = [
                r for r in await stack.records(run_id) if isinstance(r, ev.TimerScheduled)
            ]
            # (the run's records are timed by the client's clock, the timers by this one)
            due = (parse_time(timeout.data.fire_at) - clock.moment).total_seconds()
            assert await timers.advance(due + 1) == 1  # that timeout, void while it is held
            await eventually(lambda: recorded(ev.TimerFired), what="the void timer fired")
            done = await cli(nats_url, subjects, "resume", "capability", "nap")
            assert done.returncode == 0, done.stderr
            assert (await stack.wait(run_id)).status == "completed"
            explained = await cli(nats_url, subjects, "explain", run_id)
            assert explained.returncode == 0, explained.stderr
            assert (
                "=> no transition: the action-timeout timer changed nothing: what it timed had "
                "ended, or was held and had not started"
            ) in explained.stdout, explained.stdout
            assert "without a guard" not in explained.stdout
