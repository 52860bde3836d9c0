"""Shared by the control-flow tests: an in-process orchestrator whose timers run on a
:class:`ManualClock`, so waits of hours come due when a test advances the clock, and the
harness of the tests that run example workflows end to end: manifests applied, their
capabilities answered by an SDK worker in this process whose handlers a test scripts."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import nats
import pytest

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.core.state import RunState
from interlock.dialects import prepare
from interlock.runtime.client import InterlockClient
from interlock.runtime.errors import UnknownRun
from interlock.runtime.retention import Policy
from interlock.runtime.service import Orchestrator
from interlock.runtime.timers import ClockTimers, ManualClock
from interlock.sdk import TaskContext, Worker
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

WAIT = 30.0
"""Seconds a run of these stacks may take to get somewhere: a bound on a hang only."""
API_WAIT = 30.0
"""Seconds a JetStream request of these stacks may take (the server busy, not gone)."""
REPO = Path(__file__).resolve().parents[2]
PORTS = REPO / "examples" / "ports"
"""The ported workflows: for each system, ``<system>-agents.yaml`` and its workflows."""

Handler = Callable[[dict[str, Any], TaskContext], Awaitable[Any]]
"""A capability's handler, as a test scripts it."""

AgentsT = TypeVar("AgentsT")


@contextlib.asynccontextmanager
async def clock_orchestrator(
    nats_url: str, subjects: Subjects, retention: Policy | None = None, index_hold: float = 2.0
) -> AsyncIterator[tuple[InterlockClient, ClockTimers, Orchestrator]]:
    """An orchestrator and a client (each on its own connection) that share one manual clock;
    ``retention``: the orchestrator's default for finished runs; ``index_hold``: seconds a
    running run's index changes are held (0: the run list shows a run at once)."""
    clock = ManualClock(utc_now())
    timers = ClockTimers(clock)
    nc_o = await nats.connect(nats_url)
    nc_c = await nats.connect(nats_url)
    # A loaded machine (two busy loops beside the suite, load 20-30) answered a JetStream
    # request here after more than the 5 s the contexts wait by default.
    for nc in (nc_o, nc_c):
        jetstream(nc, timeout=API_WAIT)
    orchestrator = Orchestrator(
        nc_o, subjects, clock=clock, timers=timers, retention=retention, index_hold=index_hold
    )
    await orchestrator.start()
    client = InterlockClient(nc_c, subjects)
    client.runs.clock = clock  # runs started by the client are timed by the same clock
    try:
        yield client, timers, orchestrator
    finally:
        await orchestrator.stop()
        await nc_o.close()
        await nc_c.close()


class ClockStack:
    """Waits on runs in real time (bounded) and moves their timers' clock."""

    def __init__(self, client: InterlockClient, timers: ClockTimers) -> None:
        self.client = client
        self.timers = timers

    async def run_until(
        self, run_id: str, predicate: Callable[[RunState], bool], what: str, wait: float = WAIT
    ) -> RunState:
        """Wait (in real time, at most ``wait``) until the run's state satisfies ``predicate``."""
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            try:
                state = await self.client.state(run_id)
            except UnknownRun:  # not started yet
                state = RunState(run_id=run_id)
            if state.status != "new" and predicate(state):
                return state
            if asyncio.get_running_loop().time() > deadline:
                log = "\n".join(ev.encode(r).decode()[:240] for r in await self.records(run_id))
                raise AssertionError(
                    f"run {run_id} never got {what}; it is {state.status} in {state.state} "
                    f"({state.error}); its log:\n{log}"
                )
            await asyncio.sleep(0.02)

    async def advance(self, run_id: str, seconds: float) -> None:
        """Advance the clock once every timer the run has set is scheduled (the relay
        schedules them just after they are appended)."""
        await self.run_until(
            run_id, lambda s: all(self.timers.knows(t) for t in s.timers), "its timers scheduled"
        )
        await self.timers.advance(seconds)

    async def finished(self, run_id: str) -> RunState:
        return await self.client.wait(run_id, WAIT)

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        return await self.client.read(run_id)

    async def emit(self, event: CloudEvent) -> int:
        """Publish an external event; returns its sequence in the events stream."""
        return await self.client.emit(event)

    async def consumed(self, stream: str, durable: str, seq: int) -> None:
        """Wait until the orchestrator's consumer ``durable`` has acknowledged message
        ``seq`` of ``stream`` and every one before it: it is done with them, whatever it
        did (so a test can check that an event changed nothing without a sleep)."""
        js = self.client.js

        async def acked() -> bool:
            info = await js.consumer_info(stream, durable)
            return info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq

        await eventually(acked, f"{durable} done with {stream} message {seq}")

    async def ingested(self, seq: int) -> None:
        """The orchestrator is done with external event ``seq`` (see :meth:`emit`)."""
        await self.consumed(self.client.subjects.events_stream, "ingress", seq)

    async def relayed(self) -> None:
        """The relay is done with every run-log record appended so far (requests
        dispatched, timers scheduled, parked events offered)."""
        js = self.client.js
        last = (await js.stream_info(self.client.subjects.runs_stream)).state.last_seq
        await self.consumed(self.client.subjects.runs_stream, "relay", last)


# --- scripted workflows end to end ----------------------------------------------------------


class ScriptedAgents:
    """Capabilities answered in this process: each by the handler a test scripts for it, else
    by :meth:`default`, which fails the task (the test did not expect the request)."""

    def __init__(self, capabilities: Iterable[str]) -> None:
        self.capabilities = list(capabilities)
        self.handlers: dict[str, Handler] = {}

    def script(self, capability: str, handler: Handler) -> None:
        self.handlers[capability] = handler

    def answer(self, capability: str, result: Any) -> None:
        """Script ``capability`` to answer ``result`` every time."""

        async def handler(inp: dict[str, Any], ctx: TaskContext) -> Any:
            return result

        self.script(capability, handler)

    def register(self, worker: Worker) -> None:
        """Declare every capability on ``worker``, answered by :meth:`handle`."""
        for name in self.capabilities:
            worker.capability(name)(self._handler(name))

    def received(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> None:
        """Note a request as it arrives, before it is answered (here: nothing)."""

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        """The answer when no handler is scripted for ``capability``."""
        raise AssertionError(f"no handler scripted for {capability}")

    async def handle(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        """Note the request, then answer it: the scripted handler, else :meth:`default`."""
        self.received(capability, inp, ctx)
        scripted = self.handlers.get(capability)
        if scripted is None:
            return await self.default(capability, inp, ctx)
        return await scripted(inp, ctx)

    def _handler(self, capability: str) -> Handler:
        async def handle(inp: dict[str, Any], ctx: TaskContext) -> Any:
            return await self.handle(capability, inp, ctx)

        return handle


class RecordingAgents(ScriptedAgents):
    """:class:`ScriptedAgents` that keep every input they were given, by capability."""

    def __init__(self, capabilities: Iterable[str]) -> None:
        super().__init__(capabilities)
        self.inputs: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)

    def received(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> None:
        self.inputs[capability].append(inp)


class Registers(Protocol):
    """Agents that declare their capabilities on a worker."""

    def register(self, worker: Worker) -> None: ...


def dialect_files(pattern: str, form: str, tmp_path: Path) -> list[Path]:
    """The seed's files matching ``pattern`` (under tests/dialects/fixtures) as written, or,
    for any other ``form``, their ``interlock convert`` output (the round trip)."""
    originals = sorted((REPO / "tests" / "dialects" / "fixtures").glob(pattern))
    if form == "as-written":
        return originals
    assert interlock_main(["convert", *map(str, originals), "-o", str(tmp_path)]) == 0
    return sorted(tmp_path.glob("*.yaml"))


@contextlib.asynccontextmanager
async def worker_orchestrator(
    nats_url: str,
    subjects: Subjects,
    manifests: Iterable[Path],
    agents: Registers,
    *,
    worker: str,
    concurrency: int,
) -> AsyncIterator[tuple[InterlockClient, ClockTimers, Orchestrator]]:
    """:func:`clock_orchestrator` with ``manifests`` applied (they must compile) and a worker
    named ``worker``, its capabilities declared by ``agents``, running and ready."""
    async with clock_orchestrator(nats_url, subjects) as (client, timers, orchestrator):
        # Files of any format: the seed systems' own files are lowered, native ones pass.
        prepared = prepare([(str(p), p.read_text()) for p in manifests])
        applied = await client.apply(
            prepared.sources,
            documents=prepared.documents,
            implied_agents=prepared.agents,
            diagnostics=prepared.diagnostics,
        )
        assert applied.compiled.ok, applied.compiled.diagnostics
        sdk_worker = Worker(worker, concurrency=concurrency, heartbeat_interval=60)
        agents.register(sdk_worker)
        task = asyncio.create_task(sdk_worker.run(nats_url, prefix=subjects.prefix))
        try:
            await asyncio.wait_for(sdk_worker.wait_ready(), WAIT)
            yield client, timers, orchestrator
        finally:
            await sdk_worker.stop(force=True)
            await asyncio.wait_for(task, WAIT)


@contextlib.asynccontextmanager
async def own_workers(
    nats_url: str, subjects: Subjects, agents: ScriptedAgents, capabilities: Iterable[str]
) -> AsyncIterator[None]:
    """Each of ``capabilities`` served by a worker of its own, named after it, so its
    answers come from its own ``source`` (the distinct producers a quorum counts), and
    answered by ``agents`` like the rest."""
    async with contextlib.AsyncExitStack() as stack:
        for capability in capabilities:
            worker = Worker(capability.replace(".", "-"), concurrency=1, heartbeat_interval=60)
            worker.capability(capability)(agents._handler(capability))
            task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
            stack.push_async_callback(_stopped, worker, task)
            await asyncio.wait_for(worker.wait_ready(), WAIT)
        yield


async def _stopped(worker: Worker, task: asyncio.Task[None]) -> None:
    await worker.stop(force=True)
    await asyncio.wait_for(task, WAIT)


class ScriptedStack(ClockStack, Generic[AgentsT]):
    """A :class:`ClockStack` with the agents that answer its runs' actions, and external
    events sent from ``source``."""

    def __init__(
        self,
        client: InterlockClient,
        timers: ClockTimers,
        agents: AgentsT,
        *,
        source: str = "test://flow",
    ) -> None:
        super().__init__(client, timers)
        self.agents = agents
        self.source = source

    async def in_state(self, run_id: str, name: str) -> RunState:
        """Wait until the run is in state ``name``."""
        return await self.run_until(run_id, lambda s: s.state == name, f"to {name}")

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        """The run's log; empty when there is no such run."""
        try:
            return await self.client.read(run_id)
        except UnknownRun:
            return []

    async def send(
        self,
        event_type: str,
        data: Any,
        *,
        id: str,
        run_id: str | None = None,
        source: str | None = None,
    ) -> int:
        """An external CloudEvent: to one run (``runid``, as `interlock signal` sends it) or,
        without ``run_id``, routed by triggers and correlation. Returns its sequence in the
        events stream (for :meth:`ingested`)."""
        return await self.client.emit(
            CloudEvent(
                id=id,
                source=self.source if source is None else source,
                type=event_type,
                time=utc_now(),
                datacontenttype="application/json",
                data=data,
                extensions={} if run_id is None else {"runid": run_id},
            )
        )


def port_files(system: str) -> tuple[Path, list[Path]]:
    """A ported system's agents file and its workflow files, by name."""
    agents = PORTS / f"{system}-agents.yaml"
    return agents, sorted(p for p in PORTS.glob(f"{system}-*.yaml") if p != agents)


def check_header_command(
    workflow: Path,
    agents: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``workflow``'s header gives the ``interlock validate`` command for it and ``agents``
    (both in examples/ports/), and that command passes, run from the repository."""
    command = (
        f"interlock validate examples/ports/{workflow.name} --agents examples/ports/{agents.name}"
    )
    assert f"#   {command}\n" in workflow.read_text(), f"{workflow.name} does not give `{command}`"
    monkeypatch.chdir(REPO)
    assert interlock_main(command.split()[1:]) == 0, capsys.readouterr()


def of(records: list[ev.AnyRecord], cls: type[Any]) -> list[Any]:
    """The data of every record of one type, in log order."""
    return [r.data for r in records if isinstance(r, cls)]


def path(records: list[ev.AnyRecord]) -> list[str]:
    """The states the run entered, in order."""
    return [s.state for s in of(records, ev.StateEntered)]


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    """Wait (in real time, bounded) until ``predicate()`` is truthy (it may be async)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never saw {what}")
        await asyncio.sleep(0.02)
