"""``GET /agents/failures``: failed attempts per capability, counted by the gateway from the
run logs' appends (a real stack): an answer that breaks its output schema and a timeout
each count against their capability, with the last failure named; a failure whose request
came before the gateway started is matched from the run's log."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gw_support import BROKEN, TIMEOUT, GatewayStack, gateway_stack, yaml

from interlock.gateway.failures import Failures
from interlock.transport.subjects import Subjects

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
