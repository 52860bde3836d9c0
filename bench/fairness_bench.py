"""Fair share under one concurrency limit: does a flood of one key hold up another key?

Starts a fresh embedded nats-server, then an orchestrator and a worker in this process (the
worker answers at once) for each phase, on a fresh prefix, with a workflow whose runs share
``--limit`` slots (key ``"all"``), with fair share off or on (``fair: inputs.customer``).
Two phases, interleaved ``--rounds`` times for each setting: key B alone starts ``--few``
runs at once; key A starts ``--flood`` runs and, as soon as they are in, key B its
``--few``. A run's time to start is from its ``run.started`` to its ``run.admitted`` (both
in its log, one clock). ``--via client`` starts the runs as ``interlock start`` and the
HTTP gateway do (their first records appended, the slots left to the orchestrator's
relay); ``--via orchestrator`` as a trigger or a parent does, through the orchestrator's
own runs (slots taken in the start's step when free).

Printed per round and setting: B's median time to start alone and beside the flood, and
their ratio (the goal with fair share on: at most 2x); then the median of the rounds and
their spread. Because the machine's load moves both by tens of times between invocations,
each phase also measures its own *slot time*: how long a slot takes to serve one run, the
limit over the runs admitted per second (counted from every run's ``run.admitted`` while B
was being served), that is the run's own work plus handing its slot to the next run; B's
wait is printed in those units too.

What equal shares imply, in slot times T: alone, B's runs fill the ``--limit`` slots in
waves, so its median run starts after about ``(few / 2) // limit`` waves (2 T for 50 runs in
10 slots). Beside a flood that keeps every slot busy, B's first runs wait for A's runs to
end (half a slot time on average) and B then holds half of the slots, so its median run
starts after about ``(few / 2) // (limit / 2)`` T more (4.75 T for 50 in 10): equal shares
alone make the ratio about 2.4x when the slot time is the same in both phases. Fair share
over recent use (what the limit does now) gives B, which used no slot lately, the slots
as they free until its slots and recent use reach A's: printed too, computed with the
limit's own choice of line (2.75 T for 50 in 10, 1.4x). Each round also counts A's runs
admitted from B's first admission until half of B's (read from the logs, whatever the
slot time): about ``few / 2 - limit / 2`` with equal shares (20 for 50 in 10), 2 by recent use.

    python -m bench fairness [--flood 5000] [--few 50] [--limit 10] [--rounds 3]
                             [--via client|orchestrator]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.runtime.client import InterlockClient, new_run_id
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.runs import Runs
from interlock.runtime.service import Orchestrator
from interlock.runtime.slotlines import STRIDE, Line, SlotEntry, Waiter
from interlock.runtime.slotturns import admit, pick
from interlock.sdk import TaskContext, Worker
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects

AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: fastagent}
spec:
  capabilities:
    - name: fast
"""

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: shared}
spec:
  inputs:
    customer: {type: string, required: true}
  concurrency:
    - key: '"all"'
      limit: LIMIT
FAIR  initial_state: work
  states:
    work:
      actions: [{capability: fast}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""

CHUNK = 200
"""Runs started at once (each start is one append)."""


def manifest(limit: int, fair: bool) -> str:
    line = "      fair: inputs.customer\n" if fair else ""
    return WORKFLOW.replace("LIMIT", str(limit)).replace("FAIR", line)


def stamp(time_: str) -> float:
    return datetime.fromisoformat(time_).timestamp()


def equal_shares(few: int, limit: int) -> tuple[float, float]:
    """B's median time to start in slot times, alone and beside a flood, if every run
    took one slot time and the keys shared the slots equally (see the module's text)."""

    def median_start(starts: list[float]) -> float:
        return statistics.median(sorted(starts))

    alone = [float(i // limit) for i in range(few)]
    half = max(limit // 2, 1)
    # Beside: A's holders end spread over one slot time; B takes the first `half` freed.
    beside = [(i % half + 0.5) / limit + i // half for i in range(few)]
    return median_start(alone), median_start(beside)


def recent_use(few: int, limit: int) -> tuple[float, int]:
    """B's median time to start beside a flood in slot times, and how many of A's runs are
    admitted before half of B's are, as fair share over recent use serves them
    (:func:`slotturns.pick` itself): A held every slot for long, its holders end spread
    over one slot time, each slot freed is given to the line picked."""
    entry = SlotEntry(limit="bench", key="all", size=limit)
    for n in range(WARM * limit):  # A alone, every slot its, long enough to count fully
        if len(entry.holders) >= limit:
            entry.holders.pop(0)
        admit(entry, Waiter(f"a{n}", "", limit, fair="A"), "A")
    ends = [((i + 0.5) / limit, holder.run_id) for i, holder in enumerate(entry.holders)]
    entry.lines = [Line(fair="A", weight=1, segments=[]), Line(fair="B", weight=1, segments=[])]
    starts: list[float] = []
    n = others = 0
    while len(starts) < few:
        at, ended = heapq.heappop(ends)
        entry.holders = [h for h in entry.holders if h.run_id != ended]
        line = pick(entry)
        line.passed += STRIDE
        n += 1
        admit(entry, Waiter(f"{line.fair}{n}", "", limit, fair=line.fair), line.fair)
        heapq.heappush(ends, (at + 1, f"{line.fair}{n}"))
        if line.fair == "B":
            starts.append(at)
        elif len(starts) < (few + 1) // 2:
            others += 1
    return statistics.median(starts), others


WARM = 100
"""Slot times of A alone before B joins, in :func:`recent_use`."""


class Admissions:
    """Every ``run.admitted`` of a prefix, as the run logs are appended (a plain
    subscription: it reads what the orchestrator writes, it changes nothing)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.order: list[str] = []
        """The runs admitted, in the order their admissions were appended."""

    async def on_msg(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):  # not a batch of records: not counted
            for record in ev.decode_batch(msg.data):
                if isinstance(record, ev.RunAdmitted):
                    self.times.append(stamp(record.time))
                    self.order.append(record.subject)

    def others_between(self, runs: list[str], first: float, last: float) -> int:
        """How many runs not of ``runs`` were admitted from ``first`` to ``last``."""
        mine = set(runs)
        return sum(
            1
            for at, run_id in zip(self.times, self.order, strict=True)
            if first <= at <= last and run_id not in mine
        )

    def slot_time(self, limit: int, first: float, last: float, *, wave: int) -> float:
        """Seconds a slot takes per run: the limit over the admissions per second from
        ``first`` to ``last`` (``wave``: admissions at ``first`` that started the window
        together, not counted)."""
        count = sum(1 for t in self.times if first <= t <= last) - wave
        return limit * (last - first) / count if count > 0 and last > first else float("nan")


@dataclass(frozen=True)
class Stack:
    client: InterlockClient
    admissions: Admissions
    starts: Runs
    """What starts the runs: the client's, or the orchestrator's (``--via``)."""


@contextlib.asynccontextmanager
async def stack(url: str, limit: int, fair: bool, via: str = "client") -> AsyncIterator[Stack]:
    """A fresh prefix: the manifests applied, an orchestrator and a worker running."""
    subjects = Subjects(prefix=f"f{uuid.uuid4().hex[:10]}")
    opts = ConnectOptions.resolve(url, name="fairness bench")
    conns = [await connect(opts) for _ in range(4)]
    client = InterlockClient(conns[0], subjects)
    await client.ensure_provisioned()
    applied = await client.apply([("agent", AGENT), ("workflow", manifest(limit, fair))])
    assert applied.compiled.ok, applied.compiled.diagnostics
    admissions = Admissions()
    await conns[3].subscribe(subjects.runs_all, cb=admissions.on_msg)
    orchestrator = Orchestrator(conns[1], subjects)
    await orchestrator.start()
    worker = Worker("fastagent", concurrency=64)

    @worker.capability("fast")
    async def fast(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return {}

    task = asyncio.create_task(worker.run(conns[2], prefix=subjects.prefix))
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        starts = orchestrator.runs if via == "orchestrator" else client.runs
        yield Stack(client, admissions, starts)
    finally:
        await worker.stop(force=True)
        await task
        await orchestrator.stop()
        for conn in conns:
            await conn.close()


async def start_many(stack: Stack, customer: str, count: int) -> list[str]:
    """``count`` runs of ``customer``, decided first and then appended together, so that
    they start at the same time whatever the pace of this process's client."""
    definition, version = await stack.client.registry.latest("shared")
    runs = stack.starts
    out: list[str] = []
    for first in range(0, count, CHUNK):
        n = min(CHUNK, count - first)
        openings = await asyncio.gather(
            *(
                runs.opening(definition, version, new_run_id(), {"customer": customer})
                for _ in range(n)
            )
        )
        await asyncio.gather(*(runs.open(opening) for opening in openings))
        out += [opening.run_id for opening in openings]
    return out


@dataclass(frozen=True)
class Phase:
    wait: float
    """B's median seconds from run.started to run.admitted."""
    slot: float
    """Seconds a slot took per run meanwhile."""
    others: int = 0
    """Beside the flood: A's runs admitted from B's first admission until half of B's."""


async def served(client: InterlockClient, run_ids: list[str]) -> list[tuple[float, float]]:
    """Each run's run.started and run.admitted times, once it has ended."""
    out = []
    for run_id in run_ids:
        await client.wait(run_id, 900)
        records = await client.read(run_id)
        admitted = next(r for r in records if isinstance(r, ev.RunAdmitted))
        out.append((stamp(records[0].time), stamp(admitted.time)))
    return out


async def alone(url: str, few: int, limit: int, fair: bool, via: str) -> Phase:
    async with stack(url, limit, fair, via) as found:
        admissions = found.admissions
        times = await served(found.client, await start_many(found, "B", few))
    # From the first admission to the last: the first wave's runs took their slots at once.
    first, last = min(a for _, a in times), max(a for _, a in times)
    return Phase(
        wait=statistics.median(a - s for s, a in times),
        slot=admissions.slot_time(limit, first, last, wave=min(limit, few)),
    )


async def beside(url: str, flood: int, few: int, limit: int, fair: bool, via: str) -> Phase:
    async with stack(url, limit, fair, via) as found:
        admissions = found.admissions
        await start_many(found, "A", flood)
        few_runs = await start_many(found, "B", few)
        times = await served(found.client, few_runs)
        # A's runs left unfinished: this prefix is dropped with its orchestrator.
    first, last = min(s for s, _ in times), max(a for _, a in times)
    admitted = sorted(a for _, a in times)
    return Phase(
        wait=statistics.median(a - s for s, a in times),
        slot=admissions.slot_time(limit, first, last, wave=0),
        others=admissions.others_between(few_runs, admitted[0], admitted[(len(times) - 1) // 2]),
    )


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, {min(values):.2f}-{max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="python -m bench fairness", description=doc.split("\n")[0])
    p.add_argument("--flood", type=int, default=5000, help="runs key A starts")
    p.add_argument("--few", type=int, default=50, help="runs key B starts")
    p.add_argument("--limit", type=int, default=10, help="slots shared by both keys")
    p.add_argument("--rounds", type=int, default=3, help="alone/flood pairs per setting")
    p.add_argument(
        "--via",
        choices=["client", "orchestrator"],
        default="client",
        help="start the runs as the CLI does, or as a trigger does (default: client)",
    )
    args = p.parse_args(argv)
    began = time.time()
    loads = [os.getloadavg()[0]]
    ideal_alone, ideal_beside = equal_shares(args.few, args.limit)
    recent, recent_others = recent_use(args.few, args.limit)
    print(
        f"key B's median time to start, {args.few} runs alone and beside key A's "
        f"{args.flood}, {args.limit} slots shared, started via the {args.via}; "
        "T = a slot's time per run in that phase"
    )
    print(
        f"equal shares imply: alone {ideal_alone:.2f} T, beside {ideal_beside:.2f} T, "
        f"{ideal_beside / ideal_alone:.2f}x at equal T, about {args.few // 2 - args.limit // 2} "
        f"of A's admitted from B's first until half of B's; recent use (fair share now): beside "
        f"{recent:.2f} T, {recent / ideal_alone:.2f}x, {recent_others} of A's"
    )
    ratios: dict[bool, list[float]] = {False: [], True: []}
    units: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="interlock-fairness-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        server.start()
        try:
            for round_ in range(1, args.rounds + 1):
                for fair in (False, True):
                    a = asyncio.run(alone(server.url, args.few, args.limit, fair, args.via))
                    b = asyncio.run(
                        beside(server.url, args.flood, args.few, args.limit, fair, args.via)
                    )
                    loads.append(os.getloadavg()[0])
                    ratio = b.wait / a.wait if a.wait > 0 else float("inf")
                    ratios[fair].append(ratio)
                    units[fair].append((a.wait / a.slot, b.wait / b.slot))
                    print(
                        f"  round {round_} fair share {'on ' if fair else 'off'}: "
                        f"alone {a.wait * 1000:7.1f} ms (T {a.slot * 1000:6.1f} ms, "
                        f"{a.wait / a.slot:5.2f} T), beside {b.wait * 1000:8.1f} ms "
                        f"(T {b.slot * 1000:6.1f} ms, {b.wait / b.slot:6.2f} T): "
                        f"{ratio:6.1f}x, {b.wait / b.slot / (a.wait / a.slot):5.1f}x in T; "
                        f"A's admitted from B's first to half: {b.others}",
                        flush=True,
                    )
        finally:
            server.stop()
    print(
        f"over {args.rounds} rounds (load average {min(loads):.1f}-{max(loads):.1f}, "
        f"{time.time() - began:.0f} s):"
    )
    for fair in (False, True):
        ratio = statistics.median(ratios[fair])
        goal = " (goal <= 2x: " + ("met" if ratio <= 2 else "NOT met") + ")" if fair else ""
        in_t = [b / a for a, b in units[fair]]
        print(
            f"  fair share {'on ' if fair else 'off'}: beside / alone {spread(ratios[fair])}x"
            f"{goal}; in T: alone {spread([a for a, _ in units[fair]])}, beside "
            f"{spread([b for _, b in units[fair]])}, ratio {spread(in_t)}x"
        )
    return 0
