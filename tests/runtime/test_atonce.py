"""Admission at once (runtime/atonce.py) on a real nats-server: a run or a request whose
slots are free is admitted in the append that asks for them; the limits are never
exceeded at any instant (as the RUNS stream orders the records) with two orchestrators and
one killed with SIGKILL; a slot taken by a process killed before its append is freed by
the sweep, and one taken for an append refused is given back; with nothing declared, no
bucket is touched."""

from __future__ import annotations

import itertools
import json
import sys
from datetime import timedelta
from typing import Any

from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.rfc3339 import format_time, parse_time
from interlock.runtime.atonce import GRACE_S, AtOnce
from interlock.runtime.concurrency import Slots
from interlock.runtime.health import SweepMetrics
from interlock.runtime.service import Orchestrator
from interlock.sdk import TaskContext, Worker
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.directget import read_messages
from interlock.transport.subjects import Subjects
from support.concurrency import KEYS, nap_agent, nap_worker, requests, timeline
from support.runtime import (
    REPO,
    TIMEOUT,
    Background,
    cli_env,
    client_for,
    connect,
    eventually,
    running_stack,
    serve,
    serving,
    started,
    yaml,
)

SOURCE = "test://atonce"
NAPS_S = (0.002, 0.02)
"""How long a ``nap`` takes here: short, so that requests often meet their limit."""

NAP_AGENT = nap_agent(limit=1)

# Started by a trigger (the orchestrator decides the start), two requests in turn (the
# second decided on the first's answer): both paths of admission at once, limits that
# bind now and then (2 runs, 1 request at once per customer).
NAPS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: naps
    spec:
      inputs:
        customer: {type: string, required: true}
        n: {type: integer, required: true}
      triggers:
        - event: test.nap
      concurrency:
        - {key: inputs.customer, limit: 2}
      initial_state: first
      states:
        first:
          actions:
            - capability: nap
              input: {customer: "{{ inputs.customer }}", n: "{{ inputs.n }}"}
          on:
            - {event: task.completed, goto: second}
        second:
          actions:
            - capability: nap
              input: {customer: "{{ inputs.customer }}", n: "{{ inputs.n }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)

ONE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: one
    spec:
      inputs:
        customer: {type: string, required: true}
      concurrency:
        - {key: inputs.customer, limit: 1}
      initial_state: work
      states:
        work:
          actions:
            - capability: slow
              input: {customer: "{{ inputs.customer }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)

PLAIN = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: plain
    spec:
      triggers:
        - event: test.plain
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def nap(n: int) -> CloudEvent:
    data = {"customer": KEYS[n % len(KEYS)], "n": n}
    return CloudEvent(id=f"nap-{n}", source=SOURCE, type="test.nap", data=data)


async def messages(nc: Any, subjects: Subjects) -> list[list[ev.AnyRecord]]:
    """Each message of the RUNS stream, decoded, in stream order."""
    found = await read_messages(nc, subjects.runs_stream, subjects.runs_all)
    return [ev.decode_batch(payload) for _, _, payload in found]


def with_types(batch: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in batch]


async def test_two_orchestrators_one_killed_admit_at_once_and_never_exceed_a_limit(
    nats_url: str, subjects: Subjects
) -> None:
    count = 24
    first = serve(nats_url, subjects.prefix)
    second: Background | None = None
    try:
        async with client_for(nats_url, subjects) as client:
            assert (await client.apply([("agent", NAP_AGENT), ("wf", NAPS)])).compiled.ok
            definition, _ = await client.registry.latest("naps")
            run_ids = [derive_run_id(definition, SOURCE, f"nap-{n}") for n in range(count)]
            async with nap_worker(nats_url, subjects, naps=NAPS_S):
                await started(first)
                second = serve(nats_url, subjects.prefix)
                await started(second)
                for n in range(count):
                    await client.emit(nap(n))

                async def ended(at_least: int) -> bool:
                    return len((await timeline(client.nc, subjects)).ended) >= at_least

                await eventually(lambda: ended(6), what="a few runs ended before the kill")
                first.kill()
                await eventually(lambda: ended(count), within=60, what="every run ended")
            runs = await timeline(client.nc, subjects)
            assert set(runs.ended) == set(run_ids)
            assert set(runs.ended.values()) == {"run.completed"}
            assert all(runs.counts[r].get("run.admitted") == 1 for r in run_ids), runs.counts
            assert max(runs.most.values()) <= 2, runs.most  # never passed, at any instant
            asked = await requests(client.nc, subjects)
            assert len(asked.admitted) == 2 * count
            assert all(c.get("action.admitted") == 1 for c in asked.counts.values())
            assert max(asked.most.values()) == 1, asked.most
            # Admitted at once, where free: the start, its admission and its first
            # request in one message; a request admitted in its own record, no
            # action.admitted after it. The relay's admissions come in messages of their own.
            batches = await messages(client.nc, subjects)
            at_once_runs = [
                b for b in batches if {"run.started", "run.admitted"} <= set(with_types(b))
            ]
            assert at_once_runs, "no run was admitted in the append of its start"
            at_once = [
                r
                for b in batches
                for r in b
                if isinstance(r, ev.ActionRequested) and r.data.admitted_at is not None
            ]
            assert at_once, "no request was admitted in the record of its request"
            assert all(
                not r.data.at_once for b in batches for r in b if isinstance(r, ev.ActionAdmitted)
            )
            assert all(
                not any(isinstance(q, ev.ActionRequested) for q in b)
                for b in batches
                if any(isinstance(r, ev.ActionAdmitted) for r in b)
            )
            assert second.stop() == 0, second.output
            second = None
            # No slot leaked: what is left (a slot the killed process took for an append
            # it never sent) is an early holder no log asks for, the sweep's to free.
            sweeper = Orchestrator(await connect(nats_url), subjects)
            sweeping = sweeper.runs.at_once
            assert sweeping is not None
            slots = Slots(client.nc, subjects)
            for entry in await slots.entries():
                assert all(h.early for h in entry.holders), entry
                assert not entry.lines, entry
            await sweeping.sweep(grace_s=0)
            assert await slots.entries() == []
    finally:
        first.kill()
        if second is not None:
            second.kill()


def crash_after_taking(url: str, subjects: Subjects, run_id: str, customer: str) -> Background:
    """A process that starts ``run_id`` of ``one`` as an orchestrator does and is killed
    (SIGKILL) between taking its slot and appending its first records."""
    env = cli_env(url, subjects.prefix, PYTHONPATH=str(REPO / "tests"))
    argv = [sys.executable, "-m", "support.atonce_crash", url, subjects.prefix, "one", run_id]
    return Background([*argv, json.dumps({"customer": customer})], env)


class Clock:
    """The orchestrators' clock, moved on by the test."""

    def __init__(self) -> None:
        self.at = parse_time(utc_now())

    def __call__(self) -> str:
        return format_time(self.at)

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


async def test_a_slot_taken_by_a_process_killed_before_its_append_is_freed_by_the_sweep(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ONE]) as s:
        slots = s.orchestrator.flow.admission.slots
        doomed = crash_after_taking(nats_url, subjects, "rdoomed", "acme")
        taken = doomed.wait_for(r"^TAKEN (.*)$")
        assert taken.group(1) == "rdoomed"
        assert doomed.proc.wait(TIMEOUT) == -9
        assert await s.client.runs.load("rdoomed") is None  # never appended
        (entry,) = await slots.entries()
        assert [(h.run_id, h.early) for h in entry.holders] == [("rdoomed", 1)]

        # The slot is held for nothing: the next run of the key waits behind it.
        s.recorder.release.set()
        waiting = await s.client.start("one", {"customer": "acme"})

        async def in_line() -> bool:
            found = await slots.entries()
            return bool(found and found[0].lines)

        await eventually(in_line, what="the second run in line")

        clock = Clock()
        flow = s.orchestrator.flow
        sweeper = AtOnce(flow.admission, flow.capacity, s.orchestrator.runs, clock).sweeper
        sweep = sweeper.sweep
        assert await sweep() == 0  # too young: its append may be on its way
        (entry,) = await slots.entries()
        assert [h.run_id for h in entry.holders] == ["rdoomed"]
        clock.advance(GRACE_S + 1)
        assert await sweep() == 1
        registry = CollectorRegistry()
        registry.register(SweepMetrics(sweeper))
        assert registry.get_sample_value("interlock_slots_swept_total", {"kind": "run"}) == 1
        assert registry.get_sample_value("interlock_slots_swept_total", {"kind": "request"}) == 0
        outcome = await s.wait(waiting, TIMEOUT)
        assert outcome.status == "completed"
        runs = await timeline(s.client.nc, subjects)
        assert max(runs.most.values()) == 1
        await eventually(lambda: _empty(slots), what="its slot freed after its end")


NAP_ONCE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: naponce
    spec:
      inputs:
        customer: {type: string, required: true}
      initial_state: work
      states:
        work:
          actions:
            - capability: nap
              input: {customer: "{{ inputs.customer }}", n: 1}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


async def test_a_request_slot_taken_by_a_process_killed_before_its_append_is_freed(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [NAP_AGENT, NAP_ONCE], worker=False) as s:
        slots = s.orchestrator.flow.admission.slots
        env = cli_env(nats_url, subjects.prefix, PYTHONPATH=str(REPO / "tests"))
        argv = [sys.executable, "-m", "support.atonce_crash", nats_url, subjects.prefix]
        argv += ["naponce", "rcap", json.dumps({"customer": "acme"})]
        doomed = Background(argv, env)
        taken = doomed.wait_for(r"^TAKEN (.*)$").group(1)
        assert doomed.proc.wait(TIMEOUT) == -9
        assert taken.startswith("rcap/")
        assert taken.endswith("#1")
        assert await s.client.runs.load("rcap") is None
        async with nap_worker(nats_url, subjects, naps=NAPS_S):
            waiting = await s.client.start("naponce", {"customer": "acme"})

            async def in_line() -> bool:
                found = await slots.entries()
                return bool(found and found[0].lines)

            await eventually(in_line, what="the other run's request in line")
            clock = Clock()
            clock.advance(GRACE_S + 1)
            flow = s.orchestrator.flow
            sweep = AtOnce(flow.admission, flow.capacity, s.orchestrator.runs, clock).sweep
            assert await sweep() == 1
            assert (await s.wait(waiting, TIMEOUT)).status == "completed"
        seen = await requests(s.client.nc, subjects)
        assert max(seen.most.values()) == 1
        await eventually(lambda: _empty(slots), what="every slot freed")


async def test_an_early_holder_whose_log_asks_keeps_its_slot_and_loses_its_mark(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ONE]) as s:
        slots = s.orchestrator.flow.admission.slots
        runs = s.orchestrator.runs
        definition, version = await runs.registry.latest("one")
        created, records = await runs.start(definition, version, "rkept", {"customer": "acme"})
        assert created
        assert with_types(records)[:4] == [
            "run.started",
            "run.queued",
            "run.admitted",
            "state.entered",
        ]
        (entry,) = await slots.entries()
        assert [(h.run_id, h.early) for h in entry.holders] == [("rkept", 1)]
        assert entry.admitted == 1  # a slot taken at once counts in its key's use
        clock = Clock()
        clock.advance(GRACE_S + 1)
        flow = s.orchestrator.flow
        at_once = AtOnce(flow.admission, flow.capacity, runs, clock)
        assert await at_once.sweep() == 0
        (entry,) = await slots.entries()
        assert [(h.run_id, h.early) for h in entry.holders] == [("rkept", 0)]
        # A sweep reads the entries changed since the last one, not the whole bucket: the
        # entry whose mark it cleared once more, then none while nothing changes.
        sweeper = at_once.sweeper
        assert sweeper.read == 1
        assert await at_once.sweep() == 0
        assert sweeper.read == 2
        assert await at_once.sweep() == 0
        assert sweeper.read == 2
        # A new early holder is read once, kept in view while too young, and checked
        # once old enough, its entry unchanged meanwhile.
        created, _ = await runs.start(definition, version, "rnext", {"customer": "beta"})
        assert created
        clock.at = parse_time(utc_now())  # the sweep's clock back to the taker's
        assert await at_once.sweep() == 0
        assert sweeper.read == 3
        beta = await slots.read("default/one#1", "beta")
        assert beta is not None
        assert [(h.run_id, h.early) for h in beta.holders] == [("rnext", 1)]  # too young
        clock.advance(GRACE_S + 1)
        assert await at_once.sweep() == 0
        assert sweeper.read == 3
        beta = await slots.read("default/one#1", "beta")
        assert beta is not None
        assert [(h.run_id, h.early) for h in beta.holders] == [("rnext", 0)]
        assert sweeper.freed == {}


async def test_a_slot_taken_for_a_start_that_is_refused_is_given_back(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ONE]) as s:
        s.recorder.release.set()
        runs = s.orchestrator.runs
        definition, version = await runs.registry.latest("one")
        run_id = await s.client.start("one", {"customer": "acme"})
        assert (await s.wait(run_id, TIMEOUT)).status == "completed"
        slots = s.orchestrator.flow.admission.slots
        await eventually(lambda: _empty(slots), what="its slot freed")
        # The same run started again (a trigger's event delivered twice, say): the slot
        # is free, taken, and the append refused, the run existing.
        created, _ = await runs.start(definition, version, run_id, {"customer": "acme"})
        assert not created
        await eventually(lambda: _empty(slots), what="the slot given back")
        runs_seen = await timeline(s.client.nc, subjects)
        assert runs_seen.counts[run_id].get("run.admitted") == 1


async def _empty(slots: Slots) -> bool:
    return await slots.entries() == []


async def test_a_run_of_a_workflow_without_limits_touches_no_bucket(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [PLAIN]) as s:
        definition, _ = await s.client.registry.latest("plain")
        event = CloudEvent(id="p1", source=SOURCE, type="test.plain", data={})
        await s.client.emit(event)
        run_id = derive_run_id(definition, SOURCE, "p1")
        assert (await s.wait(run_id, TIMEOUT)).status == "completed"
        js = s.client.nc.jetstream()
        info = await js.stream_info(f"KV_{subjects.slots_bucket}")
        assert info.state.last_seq == 0


TICK_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: tickagent
    spec:
      capabilities:
        - name: tick
          rate: {limit: 2, per: 1s}
    """
)

TICKS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: ticks
    spec:
      inputs:
        n: {type: integer, required: true}
      triggers:
        - event: test.tick
      initial_state: first
      states:
        first:
          actions:
            - {capability: tick, input: {n: "{{ inputs.n }}"}}
          on:
            - {event: task.completed, goto: second}
        second:
          actions:
            - {capability: tick, input: {n: "{{ inputs.n }}"}}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


async def test_a_rate_taken_at_once_and_in_line_is_never_exceeded(
    nats_url: str, subjects: Subjects
) -> None:
    from interlock.runtime.timers import ClockTimers, ManualClock

    clock = ManualClock("2026-01-01T00:00:00Z")
    timers = ClockTimers(clock)
    manifests = [TICK_AGENT, TICKS]
    async with running_stack(
        nats_url, subjects, manifests, worker=False, clock=clock, timers=timers
    ) as s:
        worker = Worker("tickagent", concurrency=16, grace_period=0.1)

        @worker.capability("tick")
        async def tick(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            return inp

        async with serving(nats_url, subjects, worker):
            for n in range(5):
                await s.client.emit(
                    CloudEvent(id=f"t{n}", source=SOURCE, type="test.tick", data={"n": n})
                )

            async def done() -> int:
                return len((await timeline(s.client.nc, subjects)).ended)

            async def moving() -> bool:
                return timers.pending > 0 or await done() == 5

            for _ in range(40):
                await eventually(moving, what="a request in line with its wake-up set")
                if await done() == 5:
                    break
                await timers.advance(0.5)
            assert await done() == 5
        asked = await requests(s.client.nc, subjects)
        admitted = sorted(
            (parse_time(asked.admitted_at[r]), r in asked.at_once) for r in asked.admitted
        )
        assert len(admitted) == 10
        assert any(at_once for _, at_once in admitted), "no request admitted at once"
        assert any(not at_once for _, at_once in admitted), "no request waited in line"
        # One token every half second, burst 1: no two dispatches closer than that.
        gaps = [(b - a).total_seconds() for (a, _), (b, _) in itertools.pairwise(admitted)]
        assert min(gaps) >= 0.5, gaps
        # The end of a request admitted at once holding a rate's token gives nothing back:
        # the relay does it without awaiting (and forgets the request), unless a
        # retry-after holds the rate, or the request held a slot.
        capacity = s.orchestrator.flow.capacity
        ended = next(
            r
            for b in await messages(s.client.nc, subjects)
            for r in b
            if isinstance(r, ev.ActionCompleted) and r.data.freed
        )
        freed = ended.data.freed
        assert freed is not None
        assert capacity.awaited(ended, [freed])  # forgotten when it ended
        capacity.note_at_once(ended.subject, freed.action_id, freed.attempt)
        assert not capacity.awaited(ended, [freed])
        held = replace(freed, rate_held_until=ended.time)
        assert capacity.awaited(ended, [held])
        slot = replace(freed, limits=[ev.SlotClaim(limit="cap:nap", key="", size=1)])
        assert capacity.awaited(ended, [slot])
