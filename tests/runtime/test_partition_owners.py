"""Signals, answers on the results stream and fired timers are decided by the replica that
holds the run's partition, and a handover (a replica killed -9) loses and doubles nothing."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from interlock.core import events as ev
from interlock.runtime.client import new_run_id
from interlock.runtime.health import OrchestratorInstrumentation
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.ownership import owners
from interlock.runtime.service import Orchestrator
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.partitions import partition_of
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, Background, Stack, cli_env, connect, running_stack

# An answer (on the results stream: the test worker never answers by request), a signal
# and a state's timer, one after the other.
OWNED = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: owned}
spec:
  initial_state: ask
  states:
    ask:
      actions: [{capability: echo, input: {step: 1}}]
      on: [{event: task.completed, goto: wait}]
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: nap}]
    nap:
      type: human_in_the_loop
      timeout: {after: 100ms, goto: done}
    done: {type: terminal, outputs: {ok: true}}
"""


# Events that reach runs through a correlation key, published as a courier would.
PARCEL = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: parcel}
spec:
  inputs:
    order: {type: string, required: true}
  correlate:
    key: "{{ inputs.order }}"
    events: {parcel.delivered: data.order_id}
  initial_state: in_transit
  states:
    in_transit:
      type: human_in_the_loop
      on: [{event: parcel.delivered, goto: delivered}]
    delivered: {type: terminal, outputs: {ok: true}}
"""


class _Appends(OrchestratorObserver):
    """Every record one replica appended, by run."""

    def __init__(self) -> None:
        self.by_run: dict[str, list[ev.AnyRecord]] = {}

    def appended(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        self.by_run.setdefault(run_id, []).extend(records)


def _kinds(records: Sequence[ev.AnyRecord]) -> Counter[str]:
    """The records that the three kinds of message make: an answer taken, a signal taken,
    a state's timer fired."""
    out: Counter[str] = Counter()
    for r in records:
        if isinstance(r, ev.ActionCompleted):
            out["answer"] += 1
        elif isinstance(r, ev.EventReceived) and r.data.event.get("type") == "go":
            out["signal"] += 1
        elif isinstance(r, ev.EventReceived) and r.data.event.get("type") == "parcel.delivered":
            out["correlated"] += 1
        elif isinstance(r, ev.TransitionFired) and r.data.event_type == "state.timeout":
            out["timer"] += 1
    return out


def _go(run_id: str) -> CloudEvent:
    return CloudEvent(
        id=f"go-{run_id}",
        source="test://owners",
        type="go",
        time=utc_now(),
        extensions={"runid": run_id},
    )


async def _signal(stack: Stack, run_id: str) -> None:
    await stack.client.emit(_go(run_id))


async def _in_state(stack: Stack, run_id: str, state: str) -> None:
    began = time.monotonic()
    while (await stack.client.state(run_id)).state != state:
        assert time.monotonic() - began < TIMEOUT, f"{run_id} never reached {state}"
        await asyncio.sleep(0.05)


async def _settled(replicas: dict[str, Orchestrator], partitions: int) -> None:
    """Until the replicas hold every partition between them, each its fair share."""
    fair = -(-partitions // len(replicas))
    began = time.monotonic()
    while True:
        held = [set(o.relay.ownership.held) for o in replicas.values()]
        serving = [o.owners.desk.serving for o in replicas.values()]
        if set().union(*held) == set(range(partitions)) and all(
            len(h) == fair and s == h for h, s in zip(held, serving, strict=True)
        ):
            return
        assert time.monotonic() - began < TIMEOUT, f"leases never settled: {held}"
        await asyncio.sleep(0.1)


async def _start_over(
    stack: Stack, count: int, partitions: int, cover: set[int] | None = None
) -> list[str]:
    """``count`` runs of ``owned`` whose ids fall in every partition of ``cover`` (all of
    them by default) and then anywhere: ids are random, so 16 of them miss one of four
    partitions about once in 25 tries."""
    wanted = sorted(set(range(partitions)) if cover is None else cover)
    ids: list[str] = []
    while wanted:
        run_id = new_run_id()
        if partition_of(run_id, partitions) == wanted[0]:
            ids.append(run_id)
            wanted.pop(0)
    ids += [new_run_id() for _ in range(count - len(ids))]
    return [await stack.client.start("owned", {}, run_id=r) for r in ids]


async def _flow(stack: Stack, runs: list[str]) -> None:
    """Each run answered, signalled, and its timer fired, to the end."""
    for run_id in runs:
        await _in_state(stack, run_id, "wait")
    for run_id in runs:
        await _signal(stack, run_id)
    for run_id in runs:
        assert (await stack.wait(run_id)).status == "completed", run_id


async def test_signals_results_stream_answers_and_timers_are_decided_by_the_holder(
    nats_url: str, subjects: Subjects
) -> None:
    first, second = _Appends(), _Appends()
    async with running_stack(
        nats_url, subjects, [OWNED, PARCEL], partitions=4, observers=[first]
    ) as stack:
        assert stack.worker is not None
        stack.worker.answer_timeout = 0  # every answer through the results stream
        other = Orchestrator(await connect(nats_url), subjects, observers=[second])
        await other.start()
        try:
            replicas = {"first": stack.orchestrator, "second": other}
            await _settled(replicas, 4)
            held = {name: set(o.relay.ownership.held) for name, o in replicas.items()}
            moves = {name: o.relay.ownership.moves for name, o in replicas.items()}
            runs = await _start_over(stack, 16, 4)
            assert {partition_of(r, 4) for r in runs} == set(range(4))
            await _flow(stack, runs)
            # Ids chosen (in every partition), where eight random ones fell in one about
            # once in 16,000 tries.
            parcels = [
                await stack.client.start("parcel", {"order": f"o{i}"}, run_id=f"parcel-{i}")
                for i in range(8)
            ]
            assert len({partition_of(r, 4) for r in parcels}) > 1
            for i in range(len(parcels)):
                delivered = CloudEvent(
                    id=f"d{i}",
                    source="test://courier",
                    type="parcel.delivered",
                    time=utc_now(),
                    data={"order_id": f"o{i}"},
                )
                await stack.client.emit(delivered)
            for run_id in parcels:
                assert (await stack.wait(run_id)).status == "completed", run_id
            # No lease moved meanwhile: each run had one holder throughout.
            assert {n: o.relay.ownership.moves for n, o in replicas.items()} == moves
            appends = {"first": first, "second": second}
            for run_id in runs:
                holder = next(n for n, h in held.items() if partition_of(run_id, 4) in h)
                mine = appends[holder].by_run.get(run_id, [])
                assert _kinds(mine) == {"answer": 1, "signal": 1, "timer": 1}, run_id
                for name, seen in appends.items():
                    if name != holder:
                        # Not one record of the run was appended by the other replica.
                        assert run_id not in seen.by_run, (run_id, name)
            for run_id in parcels:
                holder = next(n for n, h in held.items() if partition_of(run_id, 4) in h)
                mine = appends[holder].by_run.get(run_id, [])
                assert _kinds(mine) == {"correlated": 1}, run_id
                elsewhere = "second" if holder == "first" else "first"
                assert run_id not in appends[elsewhere].by_run, run_id
            # Messages were handed over both ways, and nothing conflicted.
            assert stack.orchestrator.owners.desk.decided > 0
            assert other.owners.desk.decided > 0
            registry = CollectorRegistry()
            OrchestratorInstrumentation(other, port=None, registry=registry)
            taken = registry.get_sample_value("interlock_handovers_taken_total")
            assert taken == other.owners.desk.decided
            handed = {"outcome": "handed"}
            assert registry.get_sample_value("interlock_handovers_total", handed) == (
                stack.orchestrator.owners.desk.decided
            )
            assert stack.orchestrator.runs.conflicts == other.runs.conflicts == 0
        finally:
            await other.stop()
            await other.nc.close()


def _serve(url: str, prefix: str) -> Background:
    argv = [sys.executable, "-m", "interlock", "serve", "--server", url, "--prefix", prefix]
    argv += ["--ack-wait", "2", "--metrics-port", "0", "--partitions", "8"]
    return Background(argv, cli_env(url, prefix))


def _unanswered(*replicas: Orchestrator) -> int:
    return sum(o.counters["handovers_unanswered"] for o in replicas)


@pytest.mark.timeout(120)
async def test_holders_paused_past_their_lease_or_killed_lose_and_double_nothing(
    nats_url: str, subjects: Subjects
) -> None:
    # Four replicas on eight partitions, two each: two in this process (their appends
    # seen), one to be paused (SIGSTOP: its leases expire while its connection stays) and
    # one to be killed -9, while the signals of runs in every partition come.
    a_seen, c_seen = _Appends(), _Appends()
    async with running_stack(
        nats_url, subjects, [OWNED], partitions=8, observers=[a_seen], ack_wait=2
    ) as stack:
        assert stack.worker is not None
        stack.worker.answer_timeout = 0
        a = stack.orchestrator
        c = Orchestrator(await connect(nats_url), subjects, observers=[c_seen], ack_wait=2)
        await c.start()
        paused, doomed = _serve(nats_url, subjects.prefix), _serve(nats_url, subjects.prefix)
        try:
            for process in (paused, doomed):
                await process.await_line("orchestrator started")
            began = time.monotonic()
            while True:  # two partitions each
                shares = Counter((await owners(stack.client.nc, subjects)).values())
                if sorted(shares.values()) == [2, 2, 2, 2]:
                    break
                assert time.monotonic() - began < TIMEOUT, f"not shared out: {shares}"
                await asyncio.sleep(0.1)
            held_then = await owners(stack.client.nc, subjects)
            theirs = {
                p
                for p, o in held_then.items()
                if o not in {a.relay.ownership.me, c.relay.ownership.me}
            }
            stopped = {p for p, o in held_then.items() if f"-{paused.proc.pid}-" in o}
            assert stopped
            assert len(theirs) == 4
            # Runs in every partition, at least four in the partitions of the one paused.
            runs: list[str] = []
            while len(runs) < 24 or sum(partition_of(r, 8) in stopped for r in runs) < 4:
                runs.append(await stack.client.start("owned", {}))
            for run_id in runs:
                await _in_state(stack, run_id, "wait")
            late = [r for r in runs if partition_of(r, 8) in stopped]
            early = [r for r in runs if r not in late]
            for run_id in early[: len(early) // 2]:
                await _signal(stack, run_id)
            paused.signal(signal.SIGSTOP)
            doomed.kill()
            for run_id in early[len(early) // 2 :]:
                await _signal(stack, run_id)
            # Their leases expire; the two left take every partition between them.
            replicas = {"a": a, "c": c}
            await _settled(replicas, 8)
            unanswered = _unanswered(a, c)
            # The runs of the paused replica's partitions, signalled through the replica
            # that does not hold them now: none waits for the paused one (the new holder
            # answers at once).
            for run_id in late:
                holder = a if partition_of(run_id, 8) in a.relay.ownership.held else c
                reader = c if holder is a else a
                headers, data = encode_binary(_go(run_id))
                msg = Msg(
                    reader.nc, subject=subjects.addressed(run_id, "go"), data=data, headers=headers
                )
                assert await reader.owners.handover.hand("event", run_id, msg) == "", run_id
            assert _unanswered(a, c) == unanswered
            for run_id in runs:
                assert (await stack.wait(run_id, 60)).status == "completed", run_id
                counted = _kinds(await stack.records(run_id))
                assert counted == {"answer": 1, "signal": 1, "timer": 1}, run_id
            # The new holders decide everything of the runs of the partitions they took.
            held = {name: set(o.relay.ownership.held) for name, o in replicas.items()}
            later = await _start_over(stack, 12, 8, theirs)
            assert {partition_of(r, 8) for r in later} & theirs
            await _flow(stack, later)
            appends = {"a": a_seen, "c": c_seen}
            for run_id in later:
                holder = next(n for n, h in held.items() if partition_of(run_id, 8) in h)
                counted = _kinds(appends[holder].by_run.get(run_id, []))
                assert counted == {"answer": 1, "signal": 1, "timer": 1}, run_id
                other = "c" if holder == "a" else "a"
                assert run_id not in appends[other].by_run, run_id
        finally:
            doomed.kill()
            paused.kill()
            await c.stop()
            await c.nc.close()


async def test_a_replica_added_then_one_stopped_mid_flow_lose_and_double_nothing(
    nats_url: str, subjects: Subjects
) -> None:
    # Partitions move while signals, results-stream answers and timers flow: to a replica
    # that joins (the others let some go), then from one that stops (it lets all go).
    async with running_stack(nats_url, subjects, [OWNED], partitions=6, ack_wait=2) as stack:
        assert stack.worker is not None
        stack.worker.answer_timeout = 0
        b = Orchestrator(await connect(nats_url), subjects, ack_wait=2)
        await b.start()
        c: Orchestrator | None = None
        try:
            await _settled({"a": stack.orchestrator, "b": b}, 6)
            runs = [await stack.client.start("owned", {}) for _ in range(18)]
            for run_id in runs:
                await _in_state(stack, run_id, "wait")
            c = Orchestrator(await connect(nats_url), subjects, ack_wait=2)
            await c.start()
            for run_id in runs[:9]:
                await _signal(stack, run_id)
            await _settled({"a": stack.orchestrator, "b": b, "c": c}, 6)
            await b.stop()  # as interlock serve stops: its leases let go, then it exits
            await b.nc.close()
            for run_id in runs[9:]:
                await _signal(stack, run_id)
            for run_id in runs:
                assert (await stack.wait(run_id)).status == "completed", run_id
                counted = _kinds(await stack.records(run_id))
                assert counted == {"answer": 1, "signal": 1, "timer": 1}, run_id
            await _settled({"a": stack.orchestrator, "c": c}, 6)
        finally:
            if not b.nc.is_closed:
                await b.stop()
                await b.nc.close()
            if c is not None:
                await c.stop()
                await c.nc.close()


async def test_with_one_partition_two_replicas_hand_nothing_over(
    nats_url: str, subjects: Subjects
) -> None:
    # One partition: no leases, no owner subscriptions, every replica decides what it reads.
    async with running_stack(nats_url, subjects, [OWNED]) as stack:
        assert stack.worker is not None
        stack.worker.answer_timeout = 0
        other = Orchestrator(await connect(nats_url), subjects)
        await other.start()
        try:
            runs = [await stack.client.start("owned", {}) for _ in range(4)]
            await _flow(stack, runs)
            for o in (stack.orchestrator, other):
                assert not o.relay.ownership.held
                assert not o.owners.desk.serving
                assert not any(k.startswith("handovers_") for k in o.counters)
        finally:
            await other.stop()
            await other.nc.close()
