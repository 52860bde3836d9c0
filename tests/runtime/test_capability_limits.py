"""Capability limits on a real nats-server: a capability's requests over its concurrency
limit wait undispatched (their logs say for what) and go out as slots free, highest
priority first then oldest, across workflows; never more at work than the limit, as the
logs show it; a cancelled run's held and queued requests leave at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.concurrency import Gates, all_freed, gate_worker, requests
from support.runtime import (
    TIMEOUT,
    cli_env,
    connect,
    eventually,
    run_cli,
    running_stack,
    yaml,
)

GATE_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: gateagent
    spec:
      capabilities:
        - name: gate
          timeout_seconds: 60
          concurrency: {limit: 2, key: input.customer}
    """
)


def asking(name: str, *, priority: str = "0") -> str:
    """A workflow of one ``gate`` action for ``inputs.customer``."""
    return yaml(
        f"""\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: {name}
        spec:
          inputs:
            customer: {{type: string, required: true}}
            n: {{type: integer, default: 0}}
            urgent: {{type: integer, default: 0}}
          initial_state: work
          states:
            work:
              actions:
                - capability: gate
                  priority: "{priority}"
                  input: {{customer: "{{{{ inputs.customer }}}}", n: "{{{{ inputs.n }}}}"}}
              on:
                - {{event: task.completed, goto: done}}
            done:
              type: terminal
        """
    )


async def test_requests_over_the_limit_wait_and_go_out_in_order_across_workflows(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifests = [GATE_AGENT, asking("first"), asking("second", priority="inputs.urgent")]
    async with (
        running_stack(nats_url, subjects, manifests, worker=False) as stack,
        gate_worker(nats_url, subjects, gates),
    ):
        client = stack.client
        runs = [await client.start("first", {"customer": "acme", "n": n}) for n in range(2)]
        runs += [await client.start("second", {"customer": "acme", "n": n}) for n in (2, 3)]
        beta = await client.start("first", {"customer": "beta", "n": 100})

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(3), what="two acme requests and beta's at work")

        # The third and fourth wait, and their logs say for what.
        async def queued() -> bool:
            records = await stack.records(runs[3])
            return any(isinstance(r, ev.ActionQueued) for r in records)

        await eventually(queued, what="the fourth request recorded waiting")
        await asyncio.sleep(0.2)  # nothing more goes out
        assert sorted(gates.started) == [0, 1, 100]
        records = await stack.records(runs[3])
        (waiting,) = [r for r in records if isinstance(r, ev.ActionQueued)]
        assert (waiting.data.limit, waiting.data.key) == ("cap:gate", "acme")
        # Its place when it joined: 2nd, or 1st if the relay put it in line first (its
        # place follows the requests' times, not the order they were read).
        assert waiting.data.place in (1, 2)
        assert not any(isinstance(r, ev.ActionAdmitted) for r in records)
        # describe and logs say what it waits for, as a user reads them.
        env = cli_env(nats_url, subjects.prefix)
        shown = await asyncio.to_thread(run_cli, "describe", "run", runs[3], env=env)
        assert "held: cap:gate" in shown.stdout, shown.stdout
        shown = await asyncio.to_thread(run_cli, "logs", runs[3], env=env)
        assert "waits for a slot of cap:gate for key 'acme' (place 2)" in shown.stdout, shown.stdout
        # An urgent one asked later goes before both.
        urgent = await client.start("second", {"customer": "acme", "n": 4, "urgent": 5})
        await eventually(
            lambda: _has(stack, urgent, ev.ActionQueued), what="the urgent one in line"
        )
        gates.gate(0).set()
        await eventually(lambda: started(4), what="the next acme request at work")
        assert gates.started[-1] == 4
        # One slot freed at a time: two freed together send out two requests whose tasks
        # reach the worker in either order.
        gates.gate(1).set()
        await eventually(lambda: started(5), what="the oldest acme request at work")
        gates.gate(4).set()
        await eventually(lambda: started(6), what="the last acme request at work")
        for n in (2, 3, 100):
            gates.gate(n).set()
        outcomes = [await stack.wait(r) for r in [*runs, urgent, beta]]
        assert {o.status for o in outcomes} == {"completed"}
        # (0 and 1, asked at once, may reach the worker in either order: checked above.)
        assert gates.started[3:] == [4, 2, 3]

        seen = await requests(stack.client.nc, subjects)
        assert seen.most == {("cap:gate", "acme"): 2, ("cap:gate", "beta"): 1}
        for counts in seen.counts.values():
            assert counts["action.admitted"] == 1, counts
            assert counts.get("action.queued", 0) <= 1, counts
        # Nothing is left holding or waiting.
        await all_freed(stack.orchestrator.flow.admission.slots)


async def _has(stack: Any, run_id: str, kind: type[ev.Record]) -> bool:
    return any(isinstance(r, kind) for r in await stack.records(run_id))


async def test_a_cancelled_run_drops_its_held_request_and_frees_its_slot(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    agent = GATE_AGENT.replace("limit: 2", "limit: 1")
    async with (
        running_stack(nats_url, subjects, [agent, asking("first")], worker=False) as stack,
        gate_worker(nats_url, subjects, gates),
    ):
        client = stack.client
        runs = [await client.start("first", {"customer": "acme", "n": n}) for n in range(3)]

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first request at work")
        await eventually(lambda: _has(stack, runs[2], ev.ActionQueued), what="the third held")
        await client.cancel(runs[1], "not wanted")  # held: it leaves the line at once
        entries = await stack.orchestrator.flow.admission.slots.entries()

        async def one_waits() -> bool:
            found = await stack.orchestrator.flow.admission.slots.entries()
            return [e.queued for e in found] == [1]

        await eventually(one_waits, what="the cancelled run's request out of the line")
        del entries
        await client.cancel(runs[0], "stop")  # at work: its slot goes to the third
        await eventually(lambda: started(2), what="the third request at work")
        assert gates.started == [0, 2]
        gates.gate(2).set()
        assert (await stack.wait(runs[2], TIMEOUT)).status == "completed"
        seen = await requests(stack.client.nc, subjects)
        assert seen.most == {("cap:gate", "acme"): 1}
        assert [r.split("/")[0] for r in seen.admitted] == [runs[0], runs[2]]
        await all_freed(stack.orchestrator.flow.admission.slots)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "capability-limits.yaml"


async def test_the_capability_limits_example_keeps_two_at_work_per_account(
    nats_url: str, subjects: Subjects
) -> None:
    """examples/capability-limits.yaml end to end: four tickets of one account and one of
    another; never more than two of an account's calls at work, the urgent one first."""
    at_work: dict[str, int] = {}
    most: dict[str, int] = {}
    order: list[str] = []
    release = asyncio.Event()
    async with running_stack(nats_url, subjects, [EXAMPLE.read_text()], worker=False) as stack:
        nc = await connect(nats_url)
        worker = Worker("llm-agent", concurrency=16, grace_period=0.1)

        @worker.capability("llm.complete")
        async def complete(inp: dict[str, str], ctx: TaskContext) -> dict[str, str]:
            account = inp["account"]
            order.append(inp["prompt"])
            at_work[account] = at_work.get(account, 0) + 1
            most[account] = max(most.get(account, 0), at_work[account])
            try:
                await release.wait()
            finally:
                at_work[account] -= 1
            return {"summary": inp["prompt"].upper()}

        task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
            runs = [
                await stack.client.start("summarize-ticket", {"account": "acme", "text": t})
                for t in ("a", "b", "c")
            ]
            runs.append(
                await stack.client.start("summarize-ticket", {"account": "beta", "text": "x"})
            )

            async def three_at_work() -> bool:
                return len(order) >= 3

            await eventually(three_at_work, what="two of acme's and beta's at work")
            await eventually(lambda: _has(stack, runs[2], ev.ActionQueued), what="c held")
            urgent = {"account": "acme", "text": "now", "urgent": True}
            runs.append(await stack.client.start("summarize-ticket", urgent))
            await eventually(lambda: _has(stack, runs[-1], ev.ActionQueued), what="urgent held")
            release.set()
            outcomes = [await stack.wait(r) for r in runs]
            assert {o.status for o in outcomes} == {"completed"}
            assert outcomes[0].outputs == {"summary": "SUMMARIZE: A"}
            assert most == {"acme": 2, "beta": 1}
            assert order[3:] == ["Summarize: now", "Summarize: c"]  # the urgent one first
        finally:
            release.set()
            await worker.stop(force=True)
            await task
            await nc.close()


async def test_two_runs_requests_with_the_same_action_id_are_kept_apart(
    nats_url: str, subjects: Subjects
) -> None:
    """The requests a capability's lines hold are remembered per run: an admission finds
    its own run's request (its input, its subject), never another run's of the same action
    id and attempt, and one run's request ending forgets only that one."""
    one_slot = GATE_AGENT.replace("limit: 2, key: input.customer", "limit: 1, key: '\"all\"'")
    async with running_stack(
        nats_url, subjects, [one_slot, asking("first")], worker=False
    ) as stack:
        client = stack.client
        first = await client.start("first", {"customer": "acme", "n": 1})
        second = await client.start("first", {"customer": "acme", "n": 2})

        async def recorded(run_id: str, kind: type[Any]) -> Any:
            found = [r for r in await stack.records(run_id) if isinstance(r, kind)]
            return found[0] if found else None

        async def admission() -> Any:
            """The first run's request's admission: its ``action.admitted``, or, admitted
            at once in its request's record, that admission as the relay would write it."""
            found = await recorded(first, ev.ActionAdmitted)
            request = await recorded(first, ev.ActionRequested)
            if found is not None or request is None or request.data.admitted_at is None:
                return found
            return ev.ActionAdmitted(
                specversion="1.0",
                datacontenttype="application/json",
                id=f"{first}:9",
                source=request.source,
                subject=first,
                time=request.data.admitted_at,
                data=ev.ActionAdmittedData(action_id=request.data.action_id, attempt=1),
            )

        admitted = await eventually(admission, what="the first run's request admitted")
        await eventually(lambda: recorded(second, ev.ActionQueued), what="the second in line")
        request = await recorded(first, ev.ActionRequested)
        other = await recorded(second, ev.ActionRequested)
        # The second run's request as it is when two runs share an action id.
        twin = replace(other, data=replace(other.data, action_id=request.data.action_id))
        capacity = stack.orchestrator.flow.capacity
        capacity.remember(request)
        capacity.remember(twin)
        at_hand = capacity.request_at_hand(admitted)
        assert at_hand is not None
        assert (at_hand.subject, at_hand.data.input["n"]) == (first, 1)
        of = await capacity.request_of(admitted)
        assert of is not None
        assert (of.subject, of.data.input["n"]) == (first, 1)
        twin_admitted = replace(admitted, subject=second)
        found = capacity.request_at_hand(twin_admitted)
        assert found is not None
        assert (found.subject, found.data.input["n"]) == (second, 2)
        ended = ev.FreedSlots(action_id=twin.data.action_id, attempt=twin.data.attempt, limits=[])
        await capacity.freed(second, [ended])
        assert capacity.request_at_hand(twin_admitted) is None
        assert capacity.request_at_hand(admitted) is not None
