"""Capability limits with two orchestrators, with one killed (SIGKILL) mid-run, and with an
agent killed mid-task: never more requests at work than the limit at any instant (as the
RUNS stream orders the records), no slot leaked, no request lost or dispatched twice; a
killed agent's slot is freed when its attempt times out."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.runtime.concurrency import Slots
from interlock.runtime.service import Orchestrator
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.concurrency import KEYS, Requests, all_freed, calling, nap_agent, nap_worker, requests
from support.runtime import (
    REPO,
    cli_env,
    client_for,
    connect,
    eventually,
    interlock_bg,
    serve,
    started,
    yaml,
)

NAP_AGENT = nap_agent(limit=2)

NAPPING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: napping
    spec:
      inputs:
        customer: {type: string, required: true}
        n: {type: integer, required: true}
      initial_state: work
      states:
        work:
          actions:
            - capability: nap
              input: {customer: "{{ inputs.customer }}", n: "{{ inputs.n }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def check(seen: Requests, count: int) -> None:
    """Every request admitted once and ended once, never more than 2 at work per key."""
    assert len(seen.counts) == count, len(seen.counts)
    for request, counts in seen.counts.items():
        assert counts.get("action.admitted") == 1, (request, counts)
        assert counts.get(ev.PREFIX + "action.completed") == 1, (request, counts)
    assert set(seen.most) == {("cap:nap", k) for k in KEYS}, seen.most
    assert max(seen.most.values()) == 2, seen.most  # bound, and never passed


async def test_two_orchestrators_share_a_capability_limit_exactly(
    nats_url: str, subjects: Subjects
) -> None:
    from support.runtime import running_stack

    handled: list[int] = []
    most: Counter[str] = Counter()
    async with (
        running_stack(nats_url, subjects, [NAP_AGENT, NAPPING], worker=False) as s,
        nap_worker(nats_url, subjects, handled, most),
    ):
        second_nc = await connect(nats_url)
        second = Orchestrator(second_nc, subjects)
        await second.start()
        try:
            starts = [
                s.client.start("napping", {"customer": KEYS[n % 3], "n": n}) for n in range(30)
            ]
            run_ids = list(await asyncio.gather(*starts))
            outcomes = await asyncio.gather(*(s.wait(r, 60) for r in run_ids))
            assert {o.status for o in outcomes} == {"completed"}
            assert sorted(handled) == list(range(30))  # each request handed out once
            assert max(most.values()) == 2, most  # as the worker saw it, too
            assert s.orchestrator.counters["actions_dispatched"] > 0
            assert second.counters["actions_dispatched"] > 0
            check(await requests(s.client.nc, subjects), 30)
            await all_freed(s.orchestrator.flow.admission.slots)
        finally:
            await second.stop()
            await second_nc.close()


async def test_an_orchestrator_killed_mid_run_leaks_no_slot_and_loses_no_request(
    nats_url: str, subjects: Subjects
) -> None:
    handled: list[int] = []
    most: Counter[str] = Counter()
    first = serve(nats_url, subjects.prefix)
    second: Any = None
    try:
        async with (
            client_for(nats_url, subjects) as client,
            nap_worker(nats_url, subjects, handled, most),
        ):
            applied = await client.apply([("agent", NAP_AGENT), ("wf", NAPPING)])
            assert applied.compiled.ok
            await started(first)
            second = serve(nats_url, subjects.prefix)
            await started(second)
            run_ids = [
                await client.start("napping", {"customer": KEYS[n % 3], "n": n}) for n in range(24)
            ]
            waits = [asyncio.create_task(client.wait(r, 60)) for r in run_ids]

            async def some_done() -> bool:
                return sum(t.done() for t in waits) >= 6

            await eventually(some_done, what="a few runs completed before the crash")
            first.kill()
            outcomes = await asyncio.gather(*waits)
            assert {o.status for o in outcomes} == {"completed"}
            assert sorted(set(handled)) == list(range(24))
            check(await requests(client.nc, subjects), 24)
            slots = Slots(client.nc, subjects)

            async def freed() -> bool:
                return await slots.entries() == []

            await eventually(freed, what="every slot freed")
            assert second.stop() == 0, second.output
    finally:
        first.kill()
        if second is not None:
            second.kill()


CAPPED_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: cappedagent
    spec:
      capabilities:
        - name: capped
          timeout_seconds: 2
          max_retries: 1
          concurrency: {limit: 1}
    """
)

CAPPING = calling("capping", "capped")


async def test_a_killed_agent_holds_its_slot_only_until_its_attempt_times_out(
    nats_url: str, subjects: Subjects
) -> None:
    from support.runtime import running_stack

    env = cli_env(nats_url, subjects.prefix, PYTHONPATH=str(REPO / "tests"))
    async with running_stack(nats_url, subjects, [CAPPED_AGENT, CAPPING], worker=False) as s:
        doomed = interlock_bg(
            "agent", "run", "support.concurrency:stuck_worker", "--metrics-port", "0", env=env
        )
        try:
            await doomed.await_line("serving capped")
            first = await s.client.start("capping", {"n": 1})
            await doomed.await_line(r"STARTED (\S+) attempt=1")
            second = await s.client.start("capping", {"n": 2})
            doomed.kill()
        finally:
            doomed.kill()

        answered: list[tuple[int, int]] = []
        rescuer = Worker("cappedagent", concurrency=4, grace_period=0.1)

        @rescuer.capability("capped")
        async def capped(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            answered.append((int(inp["n"]), ctx.attempt))
            return {}

        nc = await connect(nats_url)
        task = asyncio.create_task(rescuer.run(nc, prefix=subjects.prefix))
        try:
            outcomes = [await s.wait(first, 30), await s.wait(second, 30)]
        finally:
            await rescuer.stop(force=True)
            await task
            await nc.close()
        assert [o.status for o in outcomes] == ["completed", "completed"]
        # The second waited for the slot the dead agent held until its attempt timed out;
        # the first's retry waited behind it.
        assert answered == [(2, 1), (1, 2)]
        seen = await requests(s.client.nc, subjects)
        assert seen.most == {("cap:capped", ""): 1}
        timed_out = [
            r
            for r in await s.records(first)
            if isinstance(r, ev.ActionFailed) and r.data.error.error_class == "timeout"
        ]
        assert [r.data.attempt for r in timed_out] == [1]
        await all_freed(s.orchestrator.flow.admission.slots)


pytestmark = pytest.mark.timeout(120)
