"""The orchestrator killed (SIGKILL) at the moment runs continue as new: no run of a chain
is lost and none is started twice. The new run's id derives from the old run's and the
position of its ``run.continued``, so a start repeated after the crash is refused as
existing; the event that made a run continue, redelivered after the crash and forwarded
to the new run, is not taken again there."""

from __future__ import annotations

import asyncio
from collections import Counter

from interlock.core import events as ev
from interlock.core.engine import Incoming, decided
from interlock.runtime.runs import Decided
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, client_for, connect, eventually, serve, started, yaml

LOOPING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: looping}
    spec:
      initial_state: waiting
      states:
        waiting:
          on:
            - {event: renew, goto: waiting, continue_as_new: true}
            - {event: finish, goto: done}
        done: {type: terminal}
    """
)
RUNS = 12


def event(run_id: str, kind: str) -> CloudEvent:
    return CloudEvent(
        id=f"{kind}-{run_id}", source="/crash-test", type=kind, extensions={"runid": run_id}
    )


async def test_killed_while_continuing_no_run_is_lost_or_doubled(
    nats_url: str, subjects: Subjects
) -> None:
    async with client_for(nats_url, subjects) as client:
        applied = await client.apply([("looping", LOOPING)])
        assert applied.compiled.ok
        # The exact moment, made by hand while no orchestrator runs: the run's log ends
        # with run.continued, and the run after it has not started.
        lone = await client.start("looping", {})
        renew = Incoming(type="renew", source="/crash-test", id=f"renew-{lone}")
        now = client.runs.clock()
        await client.runs.apply(lone, lambda d, s: Decided(*decided(d, s, renew, now)))
        assert isinstance((await client.read(lone))[-1], ev.RunContinued)

        # And a live one: killed as soon as the first of many runs has continued.
        firsts = [await client.start("looping", {}) for _ in range(RUNS)]
        watch = await connect(nats_url)
        continued = asyncio.Event()

        async def seen(msg: object) -> None:
            if b"run.continued" in getattr(msg, "data", b""):
                continued.set()

        sub = await watch.subscribe(f"{subjects.prefix}.runs.*", cb=seen)
        orchestrator = serve(nats_url, subjects.prefix)
        try:
            await started(orchestrator)
            for run_id in firsts:
                await client.emit(event(run_id, "renew"))
            await asyncio.wait_for(continued.wait(), TIMEOUT)
            orchestrator.kill()
            await sub.unsubscribe()
            await watch.close()

            orchestrator = serve(nats_url, subjects.prefix)
            await started(orchestrator)
            chains = {}
            for first in [lone, *firsts]:

                async def going_on(first: str = first) -> bool:
                    state = await client.state(first)
                    nxt = None if state.chain is None else state.chain.next
                    if nxt is None:
                        return False
                    try:
                        after = await client.state(nxt)
                    except Exception:  # noqa: BLE001 - not started yet
                        return False
                    chains[first] = nxt
                    return after.state == "waiting"

                await eventually(going_on, what=f"the run after {first} started")
                # Addressed to the first run: goes on to the second, which ends the chain.
                await client.emit(event(first, "finish"))
            for first, second in chains.items():
                final = await client.wait(second, TIMEOUT)
                assert final.status == "completed", (first, second)
                kinds = Counter(ev.record_type(r) for r in await client.read(first))
                assert kinds[ev.PREFIX + "run.continued"] == 1, first
                after = await client.read(second)
                started_ = after[0]
                assert isinstance(started_, ev.RunStarted)
                assert started_.data.continued_from is not None
                assert started_.data.continued_from.run_id == first
                kinds = Counter(ev.record_type(r) for r in after)
                # The renew redelivered after the crash was not taken again by the second.
                assert kinds[ev.PREFIX + "run.started"] == 1, second
                assert kinds[ev.PREFIX + "transition.fired"] == 1, second
                assert kinds[ev.PREFIX + "run.continued"] == 0, second

            async def all_indexed() -> bool:
                listed = await client.list_runs(workflow="looping")
                return Counter(r["status"] for r in listed) == Counter(
                    {"continued": RUNS + 1, "completed": RUNS + 1}
                )

            await eventually(all_indexed, what="two runs a chain, no more")
            assert orchestrator.stop() == 0, orchestrator.output
        finally:
            orchestrator.kill()
