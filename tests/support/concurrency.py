"""What the concurrency tests share: a limited workflow, the ``nap`` capability and its
worker, and the checks made from the logs."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.sdk import TaskContext, Worker
from interlock.transport.directget import read_messages
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, Stack, running_stack, serving, yaml

KEYS = ("acme", "beta", "gamma")
"""The customers (limit keys) the concurrency tests spread their runs over."""

ONE_AT_A_TIME = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: one-at-a-time}
spec:
  concurrency:
    - {key: '"all"', limit: 1}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.order.approved, goto: done}
    done:
      type: terminal
"""
"""Runs one at a time: each waits in ``waiting`` for ``acme.order.approved``, the next
queued behind it for the one slot."""

SHARED_FAIRLY = ONE_AT_A_TIME.replace("one-at-a-time", "shared-fairly").replace(
    "  concurrency:\n    - {key: '\"all\"', limit: 1}\n",
    "  inputs: {customer: {type: string, required: true}}\n"
    "  concurrency:\n    - {key: '\"all\"', limit: 1, fair: inputs.customer}\n",
)
"""As :data:`ONE_AT_A_TIME`, the slot shared fairly between the ``customer`` inputs."""

ONE_SLOT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: one}
spec:
  concurrency:
    - {key: '"k"', limit: 1}
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""
"""One slot (limit ``default/one#1``, key ``k``): each run waits in ``wait`` for ``go``,
the next in line behind it (the forks and places tests)."""


def nap_agent(limit: int | None = None) -> str:
    """The AgentDef of ``nap`` (served by :func:`nap_worker`); with ``limit``, at most that
    many of its requests at work at once per ``input.customer``."""
    text = yaml(
        """\
        apiVersion: interlock.io/v1
        kind: AgentDef
        metadata:
          name: napagent
        spec:
          capabilities:
            - name: nap
        """
    )
    if limit is not None:
        text += f"      concurrency: {{limit: {limit}, key: input.customer}}\n"
    return text


@contextlib.asynccontextmanager
async def nap_worker(
    url: str,
    subjects: Subjects,
    handled: list[int] | None = None,
    most: Counter[str] | None = None,
    *,
    naps: tuple[float, float] = (0.005, 0.04),
) -> AsyncIterator[None]:
    """``nap`` served on a connection of its own while in the block: each task answers its
    input's ``n`` after a few milliseconds (drawn from ``naps``), noting the ``n`` in
    ``handled`` and the most tasks at work at once per ``customer`` in ``most``."""
    worker = Worker("napagent", concurrency=64, grace_period=0.5)
    now: Counter[str] = Counter()

    @worker.capability("nap")
    async def nap(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        if handled is not None:
            handled.append(int(inp["n"]))
        customer = str(inp.get("customer", ""))
        now[customer] += 1
        if most is not None:
            most[customer] = max(most[customer], now[customer])
        try:
            await asyncio.sleep(random.uniform(*naps))
        finally:
            now[customer] -= 1
        return {"n": inp["n"]}

    async with serving(url, subjects, worker):
        yield


def limited(
    name: str = "limited",
    *,
    limit: int = 2,
    capability: str = "slow",
    scope: str | None = None,
    on_limit: str = "queue",
    extra_limit: str = "",
) -> str:
    """A workflow of one action whose runs share ``limit`` slots per ``inputs.customer``."""
    scope_line = f"\n              scope: {scope}" if scope else ""
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
          concurrency:
            - key: inputs.customer
              limit: {limit}
              on_limit: {on_limit}{scope_line}{extra_limit}
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


def calling(name: str, *capabilities: str, given: str = '{n: "{{ inputs.n }}"}') -> str:
    """A workflow whose run (input ``n``) asks each of ``capabilities`` once, ``given`` as
    each request's input, and ends at the first ``task.completed``."""
    actions = "".join(
        f"        - capability: {capability}\n          input: {given}\n"
        for capability in capabilities
    )
    return (
        "apiVersion: interlock.io/v1\n"
        "kind: Workflow\n"
        f"metadata:\n  name: {name}\n"
        "spec:\n"
        "  inputs:\n    n: {type: integer, required: true}\n"
        "  initial_state: work\n"
        "  states:\n"
        "    work:\n"
        "      actions:\n"
        f"{actions}"
        "      on:\n        - {event: task.completed, goto: done}\n"
        "    done:\n      type: terminal\n"
    )


@dataclass
class Timeline:
    """Every run's queued, admitted and end records, in the order the RUNS stream holds
    them (one order for all runs, whichever process appended)."""

    queued: list[str] = field(default_factory=list)
    queued_at: dict[str, str] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    """run id -> the type of its end record"""
    slots: dict[str, list[ev.SlotClaim]] = field(default_factory=dict)
    most: dict[tuple[str, str], int] = field(default_factory=dict)
    """The most runs admitted and not ended at once, per limit and key."""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """run id -> record type -> how often it is in the log"""


async def timeline(nc: Client, subjects: Subjects) -> Timeline:
    out = Timeline()
    holding: dict[tuple[str, str], set[str]] = defaultdict(set)
    messages = await read_messages(nc, subjects.runs_stream, subjects.runs_all)
    for _, _, payload in messages:
        for record in ev.decode_batch(payload):
            run = record.subject
            kind = ev.record_type(record).removeprefix(ev.PREFIX)
            counts = out.counts.setdefault(run, {})
            counts[kind] = counts.get(kind, 0) + 1
            if isinstance(record, ev.RunQueued):
                out.queued.append(run)
                out.queued_at[run] = record.time
                out.slots[run] = record.data.slots
            elif isinstance(record, ev.RunAdmitted):
                out.admitted.append(run)
                for claim in out.slots[run]:
                    at = (claim.limit, claim.key)
                    holding[at].add(run)
                    out.most[at] = max(out.most.get(at, 0), len(holding[at]))
            elif isinstance(record, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
                out.ended[run] = kind
                for claim in out.slots.get(run, []):
                    holding[(claim.limit, claim.key)].discard(run)
            elif isinstance(record, ev.RunMigrated):
                # Moved onto a version that does not ask for these: given back.
                for claim in record.data.freed:
                    holding[(claim.limit, claim.key)].discard(run)
                out.slots[run] = [c for c in out.slots.get(run, []) if c not in record.data.freed]
    return out


@dataclass
class Requests:
    """Every limited request's records, in the order the RUNS stream holds them: when it
    was admitted and when it ended, and the most at work at once per limit and key."""

    admitted: list[str] = field(default_factory=list)
    """``<run>/<action>#<attempt>`` in the order of their admission: ``action.admitted``,
    or an ``action.requested`` admitted at once (``admitted_at``)."""
    admitted_at: dict[str, str] = field(default_factory=dict)
    at_once: set[str] = field(default_factory=set)
    """The requests admitted at once, in the record of their request."""
    queued: dict[str, list[str]] = field(default_factory=dict)
    """request -> the limits its ``action.queued`` records named"""
    requested_at: dict[str, str] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    most: dict[tuple[str, str], int] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """request -> record type -> how often the log holds it for the request (an admission
    at once counts as an ``action.admitted``)"""


async def requests(nc: Client, subjects: Subjects) -> Requests:
    out = Requests()
    claims: dict[str, list[ev.SlotClaim]] = {}
    holding: dict[tuple[str, str], set[str]] = defaultdict(set)
    attempts: dict[tuple[str, str], int] = {}
    messages = await read_messages(nc, subjects.runs_stream, subjects.runs_all)

    def name(run: str, action_id: str, attempt: int) -> str:
        return f"{run}/{action_id}#{attempt}"

    def count(request: str, kind: str) -> None:
        seen = out.counts.setdefault(request, {})
        seen[kind] = seen.get(kind, 0) + 1

    def admit(request: str, at: str) -> None:
        out.admitted.append(request)
        out.admitted_at[request] = at
        count(request, "action.admitted")
        for claim in claims.get(request, []):
            where = (claim.limit, claim.key)
            holding[where].add(request)
            out.most[where] = max(out.most.get(where, 0), len(holding[where]))

    def end(request: str, kind: str) -> None:
        out.ended[request] = kind
        count(request, kind)
        for claim in claims.get(request, []):
            holding[(claim.limit, claim.key)].discard(request)

    for _, _, payload in messages:
        for r in ev.decode_batch(payload):
            run = r.subject
            if isinstance(r, ev.ActionRequested) and r.data.limits:
                me = name(run, r.data.action_id, r.data.attempt)
                attempts[(run, r.data.action_id)] = r.data.attempt
                claims[me] = [c for c in r.data.limits if not c.per_s]
                out.requested_at[me] = r.time
                count(me, "action.requested")
                if r.data.admitted_at is not None:
                    out.at_once.add(me)
                    admit(me, r.data.admitted_at)
            elif isinstance(r, ev.ActionQueued):
                me = name(run, r.data.action_id, r.data.attempt)
                out.queued.setdefault(me, []).append(r.data.limit)
                count(me, "action.queued")
            elif isinstance(r, ev.ActionAdmitted):
                admit(name(run, r.data.action_id, r.data.attempt), r.time)
            elif isinstance(r, ev.ActionCompleted | ev.ActionCancelled) and r.data.freed:
                freed = r.data.freed
                end(name(run, freed.action_id, freed.attempt), ev.record_type(r))
            elif isinstance(r, ev.ActionFailed) and r.data.freed:
                end(name(run, r.data.action_id, r.data.attempt), ev.record_type(r))
            elif isinstance(r, ev.RunCancelled):
                for freed in r.data.freed:
                    end(name(run, freed.action_id, freed.attempt), ev.record_type(r))
    return out


GATE_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: gateagent
    spec:
      capabilities:
        - name: gate
    """
)
"""The AgentDef of ``gate`` (served by :class:`Gates`' worker)."""


class Gates:
    """The ``gate`` capability: each task waits until the test opens its run's gate."""

    def __init__(self) -> None:
        self.opened: dict[int, asyncio.Event] = {}
        self.started: list[int] = []
        self.fail: set[int] = set()

    def gate(self, n: int) -> asyncio.Event:
        return self.opened.setdefault(n, asyncio.Event())

    def worker(self) -> Worker:
        worker = Worker("gateagent", concurrency=64, grace_period=0.5)

        @worker.capability("gate")
        async def gate(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            n = int(inp["n"])
            self.started.append(n)
            await self.gate(n).wait()
            if n in self.fail:
                raise RuntimeError(f"task {n} fails")
            return {"n": n}

        return worker


@contextlib.asynccontextmanager
async def gate_worker(url: str, subjects: Subjects, gates: Gates) -> AsyncIterator[Worker]:
    """The ``gate`` worker of ``gates`` while in the block; every gate opened at the end."""
    async with serving(url, subjects, gates.worker()) as worker:
        try:
            yield worker
        finally:
            for event in gates.opened.values():
                event.set()


@contextlib.asynccontextmanager
async def gated_stack(
    url: str, subjects: Subjects, gates: Gates, manifest: str
) -> AsyncIterator[Stack]:
    """A running stack with ``gate``'s AgentDef and ``manifest`` applied and no test worker
    of its own, ``gates``' worker serving while in the block."""
    async with (
        running_stack(url, subjects, [GATE_AGENT, manifest], worker=False) as stack,
        gate_worker(url, subjects, gates),
    ):
        yield stack


def stuck_worker() -> Worker:
    """A worker whose ``capped`` handler announces each task, then never finishes: run
    in a child process (``interlock agent run support.concurrency:stuck_worker``) that a
    test kills mid-task."""
    worker = Worker("cappedagent", concurrency=4, grace_period=0.1)

    @worker.capability("capped")
    async def capped(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        print(f"STARTED {ctx.action_id} attempt={ctx.attempt}", flush=True)
        await asyncio.sleep(3600)
        return {}

    return worker


async def all_freed(slots: Any) -> None:
    """Wait until no slot is held and nobody waits (the relay frees a slot on the record
    that ends its holder, a moment after a waiter of the run sees the run end); fails the
    test, naming what is left, when that does not happen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while (left := await slots.entries()) != []:
        if loop.time() > deadline:
            raise AssertionError(f"slots left held or waited for: {left}")
        await asyncio.sleep(0.05)
