"""Capability slots freed at once on a real nats-server: the orchestrator that admitted a
request at once and appends its end frees its slot once the append is acknowledged,
handing it to the next request in line without waiting for its relay; the relay then
frees nothing of it, and the limit is never exceeded."""

from __future__ import annotations

import asyncio
from typing import Any

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.concurrency import Gates, all_freed, gated_stack, requests
from support.runtime import eventually, yaml

MANIFEST = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: gateagent
    spec:
      capabilities:
        - name: gate
          timeout_seconds: 60
          concurrency: {limit: 1, key: input.customer}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: asking
    spec:
      inputs:
        customer: {type: string, required: true}
        n: {type: integer, default: 0}
      triggers:
        - event: test.gate
      initial_state: work
      states:
        work:
          actions:
            - capability: gate
              input: {customer: "{{ inputs.customer }}", n: "{{ inputs.n }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)
SOURCE = "test://capfree"


async def asked(client: Any, n: int) -> str:
    """A run started by an event (decided here: its request may be admitted at once)."""
    data = {"customer": "acme", "n": n}
    await client.emit(CloudEvent(id=f"gate-{n}", source=SOURCE, type="test.gate", data=data))
    definition, _ = await client.registry.latest("asking")
    return derive_run_id(definition, SOURCE, f"gate-{n}")


async def test_a_request_admitted_at_once_hands_its_slot_on_before_the_relay_reads_its_end(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    async with gated_stack(nats_url, subjects, gates, MANIFEST) as stack:
        capacity = stack.orchestrator.flow.capacity
        relay_frees = asyncio.Event()
        freed_by_relay: list[str] = []
        freed = capacity.freed

        async def after_the_test(run_id: str, slots: Any) -> None:
            freed_by_relay.append(run_id)
            await relay_frees.wait()  # the relay's frees wait
            await freed(run_id, slots)

        capacity.freed = after_the_test  # type: ignore[method-assign]
        client = stack.client
        first = await asked(client, 0)

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first request at work")
        records = await stack.records(first)
        (request,) = [r for r in records if isinstance(r, ev.ActionRequested)]
        assert request.data.admitted_at is not None  # admitted at once
        second = await asked(client, 1)

        async def queued() -> bool:
            return any(isinstance(r, ev.ActionQueued) for r in await stack.records(second))

        await eventually(queued, what="the second request in line")
        gates.gate(0).set()
        await eventually(lambda: started(2), what="the second request given the first's slot")
        assert (await stack.wait(first)).status == "completed"
        assert first not in freed_by_relay  # freed here at once: the relay has nothing to free
        relay_frees.set()
        gates.gate(1).set()
        assert (await stack.wait(second)).status == "completed"
        seen = await requests(client.nc, subjects)
        assert seen.most == {("cap:gate", "acme"): 1}
        await all_freed(stack.orchestrator.flow.admission.slots)
