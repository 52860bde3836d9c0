"""The run logs the gateway keeps (a real nats-server): a run's description and log pages
are what the client reads from the whole log, each message of the log is read once however
often and however concurrently it is asked for, a moved run is seen at once, and the
memory kept is bounded."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from interlock import views
from interlock.client import Client, UnknownRun
from interlock.core import events as ev
from interlock.gateway.rest import LogPage
from interlock.gateway.runlogs import RunLogs
from interlock.transport.subjects import Subjects
from support.gateway import TIMEOUT, GatewayStack, gateway_stack, wait_status, yaml

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


LOOP = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: loop
    spec:
      initial_state: poll
      states:
        poll:
          loop:
            until: iteration >= 20
            max_iterations: 20
            action:
              capability: echo
              input: {iteration: "{{ iteration }}"}
          on:
            - {event: task.completed, guard: "result.iteration > 0", goto: done}
        done:
          type: terminal
    """
)
"""A run of about 45 records in about 22 messages."""


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [GATE, LOOP]) as stack:
        yield stack


async def _waiting_run(gs: GatewayStack, client: Client) -> str:
    run_id = await client.start("gate", {})
    for _ in range(600):
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


def _page(
    records: list[ev.AnyRecord], offset: int, limit: int, more: bool, finished: bool
) -> object:
    page = LogPage(
        records=[views.record_view(r) for r in records[offset : offset + limit]],
        next_offset=offset + limit if more else None,
        finished=finished,
    )
    return msgspec.to_builtins(page)


async def test_a_page_near_the_start_of_a_log_not_kept_reads_only_its_head(
    gs: GatewayStack,
) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    long_run = await client.start("loop", {})
    await wait_status(gs, long_run, "completed")
    records = await client.records(long_run)
    messages = await _messages(gs, long_run)
    assert messages > 20

    logs = RunLogs(gs.gateway.api.ops)
    got = msgspec.json.decode(await logs.page(long_run, 2, 5))
    assert got == _page(records, 2, 5, more=True, finished=True)
    # Enough messages to fill the page and know that more follow: offset + limit + 1.
    assert logs.head_reads == 8
    # The page did not start a read of the whole log; the first answer that needs it
    # reads it, once, and the pages after come from it.
    assert logs.reads == 0
    await asyncio.wait_for(logs.log(long_run), TIMEOUT)
    assert logs.reads == messages
    whole = msgspec.json.decode(await logs.page(long_run, 0, 1000))
    assert whole == _page(records, 0, 1000, more=False, finished=True)
    assert logs.head_reads == 8

    # A running run's head: not finished, whether the page holds all of it or not.
    waiting = await _waiting_run(gs, client)
    so_far = await client.records(waiting)
    fresh = RunLogs(gs.gateway.api.ops)
    first = msgspec.json.decode(await fresh.page(waiting, 0, 1))
    assert first == _page(so_far, 0, 1, more=True, finished=False)
    fresh.forget()
    everything = msgspec.json.decode(await fresh.page(waiting, 0, 200))
    assert everything == _page(so_far, 0, 200, more=False, finished=False)
    # Past its end: no records, nothing more.
    fresh.forget()
    beyond = msgspec.json.decode(await fresh.page(waiting, 100, 5))
    assert beyond == _page(so_far, 100, 5, more=False, finished=False)
    # Beyond the head's reach: the whole log, read and kept.
    fresh.forget()
    far = msgspec.json.decode(await fresh.page(long_run, 996, 5))
    assert far == _page(records, 996, 5, more=False, finished=True)
    with pytest.raises(UnknownRun):
        await fresh.page("rnosuchrun", 0, 5)


async def test_the_log_stream_starts_from_the_kept_log_and_the_last_seen_position(
    gs: GatewayStack,
) -> None:
    client = Client(gs.stack.client.nc, gs.stack.subjects)
    run_id = await _waiting_run(gs, client)
    log = gs.gateway.client.log
    read_from: list[int] = []
    read_raw = log.read_raw

    async def counted(run: str, after: int = 0) -> list[tuple[int, bytes]]:
        if run == run_id:
            read_from.append(after)
        got: list[tuple[int, bytes]] = await read_raw(run, after)
        return got

    log.read_raw = counted
    try:
        async with gs.http("reader") as http:
            assert (await http.get(f"/runs/{run_id}")).status_code == 200
            read_from.clear()
            events: list[tuple[int, str, bytes]] = []
            listening = asyncio.Event()

            async def listen() -> None:
                headers = {"Last-Event-ID": "1"}
                async with http.stream("GET", f"/runs/{run_id}/log/stream", headers=headers) as r:
                    event: dict[str, str] = {}
                    async for line in r.aiter_lines():
                        if line.startswith(("id: ", "event: ", "data: ")):
                            key, _, value = line.partition(": ")
                            event[key] = value
                        elif not line and event:
                            if event["event"] == "end":
                                return
                            events.append(
                                (int(event["id"]), event["event"], event["data"].encode())
                            )
                            event = {}
                            listening.set()

            listener = asyncio.create_task(listen())
            await asyncio.wait_for(listening.wait(), TIMEOUT)
            # Nothing before the position asked for; nothing read from the log's start.
            assert events[0][0] == 2
            assert 0 not in read_from
            signalled = await http.post(
                f"/runs/{run_id}/signals/gate.open",
                headers={"Authorization": f"Bearer {gs.tokens['operator']}"},
            )
            assert signalled.json()["outcome"] == "moved"
            await asyncio.wait_for(listener, TIMEOUT)
            page = msgspec.json.decode((await http.get(f"/runs/{run_id}/log")).content)
    finally:
        del log.read_raw
    records = page["records"]
    assert [n for n, _, _ in events] == list(range(2, len(records)))
    assert [kind for _, kind, _ in events] == [r["type"] for r in records[2:]]
    assert [msgspec.json.decode(data) for _, _, data in events] == records[2:]
    assert events[-1][1] == "io.interlock.run.completed"
