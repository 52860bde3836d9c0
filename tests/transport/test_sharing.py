"""SharedCall: callers that come while a call runs share it; one that comes after it
ended, even before anyone has seen it end, gets a call of its own."""

from __future__ import annotations

import asyncio

import pytest

from interlock.transport.sharing import SharedCall


async def _turns(n: int) -> None:
    """Let the loop go round ``n`` times."""
    for _ in range(n):
        await asyncio.sleep(0)


class Calls:
    """A call that waits for its gate (one per call) and returns its number."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Future[None]] = []

    async def __call__(self) -> int:
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        return len(self.gates)


async def test_callers_during_a_call_share_it_and_later_ones_start_another() -> None:
    calls = Calls()
    shared = SharedCall(calls)
    first = [asyncio.ensure_future(shared()) for _ in range(5)]
    await _turns(2)  # the callers, then the call
    assert len(calls.gates) == 1
    calls.gates[0].set_result(None)
    assert await asyncio.gather(*first) == [1] * 5
    later = asyncio.ensure_future(shared())
    await _turns(2)
    calls.gates[1].set_result(None)
    assert await later == 2


async def test_a_caller_that_comes_as_a_call_ends_gets_a_new_call() -> None:
    # The call's end and a caller's wake-up fall in the same turn of the loop, the call
    # first: the caller runs before the ended call's done-callbacks. A caller that then
    # got the ended call back and looped until a newer one (as the partition map's
    # readers do) would never yield the turn that lets anything else run.
    calls = Calls()
    shared = SharedCall(calls)
    first = asyncio.ensure_future(shared())
    await _turns(1)
    woken = asyncio.get_running_loop().create_future()

    async def late() -> int:
        await woken
        return await shared()

    second = asyncio.ensure_future(late())
    await _turns(1)  # the call waits at its gate, the late caller for its wake-up
    calls.gates[0].set_result(None)  # the call's last step is due first...
    woken.set_result(None)  # ...then the late caller, in the same turn
    assert await first == 1
    await _turns(1)
    assert len(calls.gates) == 2, "the late caller was handed the call that had ended"
    calls.gates[1].set_result(None)
    assert await second == 2


async def test_a_cancelled_caller_leaves_the_call_to_the_others() -> None:
    calls = Calls()
    shared = SharedCall(calls)
    gone, staying = asyncio.ensure_future(shared()), asyncio.ensure_future(shared())
    await _turns(2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    calls.gates[0].set_result(None)
    assert await staying == 1
