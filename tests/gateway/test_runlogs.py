"""The run logs the gateway keeps (a real nats-server): a run's description and log pages
are what the client reads from the whole log, each message of the log is read once however
often and however concurrently it is asked for, a moved run is seen at once, and the
memory kept is bounded."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from gw_support import TIMEOUT, GatewayStack, gateway_stack, yaml

from interlock import views
from interlock.client import Client, UnknownRun
from interlock.gateway.rest import LogPage
from interlock.gateway.runlogs import RunLogs
from interlock.transport.subjects import Subjects

pytestmark = pytest.mark.asyncio

GATE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: gate
    spec:
      initial_state: ask
      states:
        ask:
          actions:
            - capability: echo
              input: {n: 1}
          on:
            - {event: task.completed, goto: wait}
        wait:
          type: human_in_the_loop
          on:
            - {event: gate.open, goto: done}
        done:
          type: terminal
          outputs: {opened: true}
    """
)


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [GATE]) as stack:
        yield stack


async def _waiting_run(gs: GatewayStack, client: Client) -> str:
    run_id = await client.start("gate", {})
    for _ in range(200):
        if (await client.describe(run_id)).state == "wait":
            return run_id
        await asyncio.sleep(0.05)
    raise AssertionError("the run did not reach its waiting state")


async def _messages(gs: GatewayStack, run_id: str) -> int:
    return len(await gs.gateway.client.log.read_raw(run_id))


async def test_answers_match_a_full_read_and_each_message_is_read_once(gs: GatewayStack) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    run_id = await _waiting_run(gs, client)
    logs = gs.gateway.run_logs
    async with gs.http("reader") as http:
        got = await asyncio.gather(
            http.get(f"/runs/{run_id}"),
            http.get(f"/runs/{run_id}/log", params={"limit": 2}),
            http.get(f"/runs/{run_id}/log", params={"limit": 2, "offset": 2}),
            http.get(f"/runs/{run_id}/log"),
        )
        assert [r.status_code for r in got] == [200] * 4
        described, first, second, whole = (r.json() for r in got)
        records = await client.records(run_id)
        assert described == msgspec.to_builtins(await client.describe(run_id))
        assert described["state"] == "wait"
        # A page is byte for byte what encoding the page of records gives.
        expected = LogPage(records=[views.record_view(r) for r in records], finished=False)
        assert got[3].content == msgspec.json.encode(expected)
        assert first["records"] + second["records"] == whole["records"][:4]
        assert first["next_offset"] == 2
        assert whole["next_offset"] is None
        # Asked for four times at once, each message of the log was read once.
        before = await _messages(gs, run_id)
        assert logs.reads == before
        again = await http.get(f"/runs/{run_id}/log")
        assert again.content == got[3].content
        assert logs.reads == before

        signalled = await http.post(
            f"/runs/{run_id}/signals/gate.open",
            headers={"Authorization": f"Bearer {gs.tokens['operator']}"},
        )
        assert signalled.json()["outcome"] == "moved"
        moved = (await http.get(f"/runs/{run_id}")).json()
        assert moved == msgspec.to_builtins(await client.describe(run_id))
        assert moved["status"] == "completed"
        page = (await http.get(f"/runs/{run_id}/log", params={"offset": len(records)})).json()
        assert page["finished"] is True
        assert page["records"][-1]["type"] == "io.interlock.run.completed"
        # Only the messages appended since were read.
        assert logs.reads == await _messages(gs, run_id)

        explained = (await http.get(f"/runs/{run_id}/explain")).json()
        assert explained == await client.explain(run_id)
        assert (await http.get("/runs/rnosuchrun/log")).status_code == 404
        assert (await http.get("/runs/rnosuchrun")).status_code == 404


async def test_memory_kept_is_bounded(gs: GatewayStack) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    one = await _waiting_run(gs, client)
    two = await _waiting_run(gs, client)
    size = len(await client.records(one))
    logs = RunLogs(gs.gateway.api.ops, max_records=size + 1)
    assert len((await logs.log(one)).records) == size
    assert logs.kept_records == size
    # The second run takes the room: the first is dropped, and read again when asked for.
    await logs.log(two)
    assert logs.kept_records == len(await client.records(two))
    reads = logs.reads
    await logs.log(one)
    assert logs.reads == reads + await _messages(gs, one)
    # A log longer than the room is served, not kept.
    tiny = RunLogs(gs.gateway.api.ops, max_records=1)
    assert len((await tiny.log(one)).records) == size
    assert tiny.kept_records == 0
    with pytest.raises(UnknownRun):
        await logs.log("rnosuchrun")
    assert await asyncio.wait_for(logs.describe(one), TIMEOUT)
