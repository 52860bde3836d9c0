"""``GET /agents/failures``: failed attempts per capability, counted by the gateway from the
run logs (a real stack): an answer that breaks its output schema and a timeout each count
against their capability, with the last failure named; a failure whose request came before
counting began is matched from the run's log; a gateway started later reads the last hour
back, bounded by the window and by a number of messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlock.client import Client
from interlock.core import events as ev
from interlock.gateway.failures import Failures
from interlock.transport.clock import utc_now
from interlock.transport.subjects import Subjects
from support.gateway import BROKEN, TIMEOUT, GatewayStack, gateway_stack, wait_status, yaml

pytestmark = pytest.mark.asyncio

SLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: sluggish
    spec:
      initial_state: wait
      states:
        wait:
          actions:
            - capability: slow
              input: {}
              timeout: 2s
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [BROKEN, SLOW]) as stack:
        yield stack


async def _until(check: Any) -> Any:
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        got = await check()
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, "not seen in time"
        await asyncio.sleep(0.05)


async def test_failed_attempts_are_counted_per_capability(gs: GatewayStack) -> None:
    async with gs.http("reader") as http:
        assert (await http.get("/agents/failures")).json()["capabilities"] == []
        async with gs.http() as operator:
            r = await operator.post("/runs", json={"workflow": "broken"})
            run_id = r.json()["run_id"]

        async def liar() -> Any:
            report = (await http.get("/agents/failures")).json()
            return next((c for c in report["capabilities"] if c["capability"] == "liar"), None)

        counted = await _until(liar)
        assert counted["failed"] == 1
        assert counted["last"]["run_id"] == run_id
        assert counted["last"]["error"]
        assert (await http.get(f"/runs/{run_id}")).json()["status"] == "failed"
    async with gs.http(None) as nobody:
        assert (await nobody.get("/agents/failures")).status_code == 401


async def test_a_failure_asked_for_before_counting_began(gs: GatewayStack) -> None:
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "sluggish"})).json()["run_id"]

        async def asked() -> bool:
            return bool((await http.get(f"/runs/{run_id}")).json()["pending"])

        await _until(asked)
        # Counting begins after the request: its capability is read from the run's log
        # when the timeout fails the attempt.
        late = Failures(gs.gateway.nc, gs.stack.subjects, gs.gateway.run_logs)
        await late.start()
        try:

            async def slow() -> Any:
                return [c for c in late.report().capabilities if c.capability == "slow"]

            (counted,) = await _until(slow)
            assert counted.failed == 1
            assert counted.last.run_id == run_id
            assert counted.last.error == "timeout"
        finally:
            await late.stop()


async def test_counts_are_read_back_from_the_run_logs_at_start(gs: GatewayStack) -> None:
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "broken"})).json()["run_id"]
        await wait_status(gs, run_id, "failed")
    failed_at = next(r.time for r in await _records(gs, run_id) if isinstance(r, ev.ActionFailed))

    # A gateway started after the failure counts it, from the logs.
    fresh = Failures(gs.gateway.nc, gs.stack.subjects, gs.gateway.run_logs)
    await fresh.start()
    try:
        await fresh.settled()
        report = fresh.report()
        (liar,) = [c for c in report.capabilities if c.capability == "liar"]
        assert liar.failed == 1
        assert liar.last.run_id == run_id
        assert report.since < failed_at
        assert fresh.read_back > 0
        # A failure after the start is counted once, not once per way it was read.
        async with gs.http() as http:
            again = (await http.post("/runs", json={"workflow": "broken"})).json()["run_id"]
            await wait_status(gs, again, "failed")

        async def both() -> Any:
            counted = [c for c in fresh.report().capabilities if c.capability == "liar"]
            return counted if counted and counted[0].failed >= 2 else None

        (liar,) = await _until(both)
        assert liar.failed == 2
        assert liar.last.run_id == again
    finally:
        await fresh.stop()

    # The window's start bounds what is read back and counted.
    short = Failures(gs.gateway.nc, gs.stack.subjects, gs.gateway.run_logs, window_s=0.001)
    await short.start()
    try:
        await short.settled()
        assert short.report().capabilities == []
    finally:
        await short.stop()
    # So does the number of messages read back: the newest only, complete from the first.
    bounded = Failures(gs.gateway.nc, gs.stack.subjects, gs.gateway.run_logs, read_back=1)
    await bounded.start()
    try:
        await bounded.settled()
        assert bounded.read_back == 1
        assert bounded.since > failed_at
        assert len(bounded.since) == len(failed_at)  # both to the millisecond, in UTC
    finally:
        await bounded.stop()


async def _records(gs: GatewayStack, run_id: str) -> list[ev.AnyRecord]:
    return list(await Client(gs.stack.client.nc, gs.stack.subjects).records(run_id))


async def test_records_without_a_record_mac_are_not_counted(gs: GatewayStack) -> None:
    """A failure that is not a record Interlock wrote (planted on a run log, no record
    MAC) is counted nowhere; the real ones after it are."""

    def record(cls: Any, data: Any, n: int) -> Any:
        return cls(
            specversion="1.0",
            id=f"planted:{n}",
            source="forged",
            subject="rplanted",
            time=utc_now(),
            datacontenttype="application/json",
            data=data,
        )

    asked = ev.ActionRequestedData(action_id="a1", state="s", index=0, capability="forged")
    error = ev.ErrorInfo(error_class="agent_error", message="planted")
    failed = ev.ActionFailedData(action_id="a1", state="s", index=0, error=error)
    planted = ev.encode_batch(
        [record(ev.ActionRequested, asked, 1), record(ev.ActionFailed, failed, 2)]
    )
    await gs.stack.js.publish(gs.stack.subjects.run("rplanted"), planted)
    async with gs.http("reader") as http:
        async with gs.http() as operator:
            await operator.post("/runs", json={"workflow": "broken"})

        async def counted() -> Any:
            report = (await http.get("/agents/failures")).json()
            return {c["capability"] for c in report["capabilities"]}

        names = await _until(lambda: _having(counted, "liar"))
        assert "forged" not in names


async def _having(counted: Any, name: str) -> Any:
    names = await counted()
    return names if name in names else None
