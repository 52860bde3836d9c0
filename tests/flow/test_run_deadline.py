"""A deadline given when a run starts (``interlock start --deadline``, ``Client.start(...,
deadline=)``, ``POST /runs`` with ``deadline``): the run's own durable timer, over the
workflow's ``spec.deadline``, which may name only where such a run goes (no ``after``)."""

from __future__ import annotations

import asyncio
import textwrap

import nats

from interlock.client import Client
from interlock.core import events as ev
from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects

MANIFEST = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: awaiting}
    spec:
      deadline: {goto: late, set: {why: "{{ 'out of time in ' + run.state }}"}}
      initial_state: waiting
      states:
        waiting:
          on: [{event: go.ahead, goto: done}]
        done: {type: terminal}
        late:
          type: terminal
          outputs: {late: true, why: "{{ context.why }}"}
    """
)


async def test_a_start_deadline_survives_a_restart_and_takes_the_workflows_goto(
    nats_url: str, subjects: Subjects
) -> None:
    nc_c = await nats.connect(nats_url)
    client = Client(nc_c, subjects)
    running: list[Orchestrator] = []

    async def orchestrator() -> None:
        started = Orchestrator(await nats.connect(nats_url), subjects)
        await started.start()
        running.append(started)

    try:
        await orchestrator()
        await client.apply([("awaiting.yaml", MANIFEST)])
        # Without a deadline of its own the workflow's has no time: the run just waits.
        plain = await client.start("awaiting")
        run_id = await client.start("awaiting", deadline=2)
        records = await client.records(run_id)
        (scheduled,) = [r for r in records if isinstance(r, ev.TimerScheduled)]
        assert scheduled.data.purpose == "run-deadline"
        await asyncio.sleep(0.3)  # the relay has scheduled it with the server
        await running.pop().stop()
        await asyncio.sleep(2.5)  # due while no orchestrator runs
        await orchestrator()
        result = await client.result(run_id, wait=True, timeout=20)
        assert result.status == "completed"
        assert result.outputs == {"late": True, "why": "out of time in waiting"}
        assert (await client.result(plain)).status == "running"
        assert not [r for r in await client.records(plain) if isinstance(r, ev.TimerScheduled)]
    finally:
        for started in running:
            await started.stop()
        await nc_c.close()
