"""A cancelled attempt's concurrency slot, on a real nats-server with a real worker: it
is held until the worker has stopped the handler (its answer to the cancelled attempt
says so), so a handler slow to stop never runs beside the request its slot goes to next;
a handler that ignores its cancellation holds it until the latest a cancelled attempt may
take to stop, then no longer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core import step
from interlock.core.rfc3339 import parse_time
from interlock.sdk import TaskContext, Worker
from interlock.transport.subjects import Subjects
from support.concurrency import all_freed, calling, requests
from support.runtime import TIMEOUT, cli_env, eventually, run_cli, running_stack, serving, yaml

API_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: apiagent
    spec:
      capabilities:
        - name: api
          concurrency: {limit: 1, key: input.account}
    """
)

CALLS = calling("calls", "api", given='{account: acme, n: "{{ inputs.n }}"}')


class Api:
    """The ``api`` capability: each call waits until the test lets it end; cancelled, it
    stops only once the test lets it (closing its call, say), or (``stubborn``) goes on
    until let end. Notes when each call began and ended, which were cancelled, and the
    most running at once."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.stubborn = stubborn
        self.release: dict[int, asyncio.Event] = {}
        self.may_stop = asyncio.Event()
        self.cancelled: set[int] = set()
        self.spans: dict[int, list[float]] = {}
        self.running = self.most = 0

    def let_end(self, n: int) -> asyncio.Event:
        return self.release.setdefault(n, asyncio.Event())

    def worker(self) -> Worker:
        worker = Worker("apiagent", concurrency=8, grace_period=0.5)

        @worker.capability("api")
        async def api(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
            n = int(inp["n"])
            self.spans[n] = [time.monotonic()]
            self.running += 1
            self.most = max(self.most, self.running)
            try:
                while not self.let_end(n).is_set():
                    try:
                        await self.let_end(n).wait()
                    except asyncio.CancelledError:
                        self.cancelled.add(n)
                        if not self.stubborn:
                            await self.may_stop.wait()
                            raise
                return {"n": n}
            finally:
                self.running -= 1
                self.spans[n].append(time.monotonic())

        return worker

    @contextlib.asynccontextmanager
    async def serving(self, url: str, subjects: Subjects) -> AsyncIterator[None]:
        """The worker serving while in the block; every call let end at the end (a
        stubborn one would hold the worker's stop)."""
        async with serving(url, subjects, self.worker()):
            try:
                yield
            finally:
                self.stubborn = False
                self.may_stop.set()
                for n in range(8):
                    self.let_end(n).set()


async def test_a_cancelled_call_keeps_its_slot_until_its_handler_has_stopped(
    nats_url: str, subjects: Subjects
) -> None:
    api = Api()
    async with (
        running_stack(nats_url, subjects, [API_AGENT, CALLS], worker=False) as stack,
        api.serving(nats_url, subjects),
    ):
        client, slots = stack.client, stack.orchestrator.flow.admission.slots
        first = await client.start("calls", {"n": 0})

        async def calling(n: int) -> bool:
            return n in api.spans

        await eventually(lambda: calling(0), what="the first call running")
        second = await client.start("calls", {"n": 1})

        async def waiting() -> bool:
            return [(e.queued, len(e.holders)) for e in await slots.entries()] == [(1, 1)]

        await eventually(waiting, what="the second call in line")
        await client.cancel(first, "not wanted")

        async def told() -> bool:
            return 0 in api.cancelled

        # The run is cancelled and its call told (the slot would have gone before the
        # notice): the call is still stopping, and holds the slot.
        await eventually(told, what="the first call told to stop")
        assert await _cancelled(stack, first)
        (entry,) = await slots.entries()
        assert [h.run_id.split("/")[0] for h in entry.holders] == [first]
        assert entry.queued == 1
        assert api.running == 1
        api.may_stop.set()
        await eventually(lambda: calling(1), what="the second call, once the first stopped")
        assert api.most == 1
        assert api.spans[0][1] <= api.spans[1][0]  # ended before the next began
        api.let_end(1).set()
        assert (await stack.wait(second, TIMEOUT)).status == "completed"

        (cancelled,) = [r for r in await stack.records(first) if isinstance(r, ev.RunCancelled)]
        (freed,) = cancelled.data.freed
        assert freed.stopping_until is not None
        held_for = parse_time(freed.stopping_until) - parse_time(cancelled.time)
        assert held_for.total_seconds() == step.STOP_GRACE_S
        seen = await requests(client.nc, subjects)
        assert seen.most == {("cap:api", "acme"): 1}
        assert [r.split("/")[0] for r in seen.admitted] == [first, second]
        await all_freed(slots)
        # logs and explain say the slot stayed held while the worker stopped, until when.
        held = (
            f"the slot of cap:api for key 'acme' ({freed.action_id}, attempt 1) stays held "
            f"until its worker stops, {freed.stopping_until} at the latest"
        )
        env = cli_env(nats_url, subjects.prefix)
        for command in (("logs", first), ("explain", first)):
            shown = await asyncio.to_thread(run_cli, *command, env=env)
            assert shown.returncode == 0, shown
            (line,) = [x for x in shown.stdout.splitlines() if "cancelled" in x and held in x]
            assert "not wanted; " + held in line, line
        as_json = await asyncio.to_thread(run_cli, "logs", first, "-o", "json", env=env)
        assert f'"stopping_until":"{freed.stopping_until}"' in as_json.stdout.replace(" ", "")


async def test_a_handler_that_ignores_its_cancellation_holds_the_slot_until_the_grace_ends(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step, "STOP_GRACE_S", 1.0)
    api = Api(stubborn=True)
    async with (
        running_stack(nats_url, subjects, [API_AGENT, CALLS], worker=False) as stack,
        api.serving(nats_url, subjects),
    ):
        client = stack.client
        first = await client.start("calls", {"n": 0})

        async def calling(n: int) -> bool:
            return n in api.spans

        await eventually(lambda: calling(0), what="the first call running")
        second = await client.start("calls", {"n": 1})
        await client.cancel(first, "not wanted")
        # No answer comes (the handler goes on): the slot goes when the grace ends.
        await eventually(lambda: calling(1), what="the second call, after the grace")
        (cancelled,) = [r for r in await stack.records(first) if isinstance(r, ev.RunCancelled)]
        (freed,) = cancelled.data.freed
        assert freed.stopping_until is not None
        seen = await requests(client.nc, subjects)
        assert parse_time(seen.admitted_at[seen.admitted[1]]) >= parse_time(freed.stopping_until)
        api.let_end(0).set()
        api.let_end(1).set()
        assert (await stack.wait(second, TIMEOUT)).status == "completed"
        await all_freed(stack.orchestrator.flow.admission.slots)


async def _cancelled(stack: Any, run_id: str) -> bool:
    return any(isinstance(r, ev.RunCancelled) for r in await stack.records(run_id))


async def test_a_cancelled_request_no_worker_was_handed_frees_its_slot_at_once(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitted and queued, but taken by no worker (none serves yet): the cancel takes it
    out of the work queue, nobody is stopping, and its slot goes at once, not when the
    grace ends."""
    monkeypatch.setattr(step, "STOP_GRACE_S", 3600.0)
    async with running_stack(nats_url, subjects, [API_AGENT, CALLS], worker=False) as stack:
        client = stack.client
        first = await client.start("calls", {"n": 0})
        second = await client.start("calls", {"n": 1})

        async def admitted(count: int) -> bool:
            return len((await requests(client.nc, subjects)).admitted) == count

        await eventually(lambda: admitted(1), what="the first request admitted, queued")
        await client.cancel(first, "not wanted")
        await eventually(lambda: admitted(2), what="the second admitted (the first never taken)")
        seen = await requests(client.nc, subjects)
        assert [r.split("/")[0] for r in seen.admitted] == [first, second]
        await client.cancel(second, "done with it")
        await all_freed(stack.orchestrator.flow.admission.slots)
