"""What a caller with a reader's token can make the gateway read: a page deep into a long
log. Such a page of a log not kept read the whole log for every request (a log may hold
200,000 records, 256 MB, before it must continue as new), so asking for it again and
again cost the gateway a whole read each time. It is read where it lies now: a binary
search by the records' places, then the page's messages (a real nats-server; the long
log is appended as the orchestrator appends, each message checked as every read is)."""

from __future__ import annotations

import asyncio
import json

import httpx
import msgspec
import pytest

from interlock import views
from interlock.client import Client
from interlock.core import events as ev
from interlock.gateway import runlogs
from interlock.gateway.logrange import log_length
from interlock.gateway.rest import LogPage
from interlock.transport.subjects import Subjects
from support.gateway import TIMEOUT, WAITING, GatewayStack, gateway_stack, wait_status

pytestmark = pytest.mark.asyncio

MESSAGES = 600
PER_MESSAGE = 3


async def _grow(gs: GatewayStack, run_id: str) -> None:
    """Append ``MESSAGES`` messages of ``PER_MESSAGE`` received events each, as the
    orchestrator appends a run's records (named by their places, MAC'd)."""
    log = gs.stack.client.log
    records = await gs.stack.client.read(run_id)
    place, last = len(records), await log.last_seq(run_id)
    for _ in range(MESSAGES):
        batch = []
        for _ in range(PER_MESSAGE):
            place += 1
            batch.append(
                ev.EventReceived(
                    specversion="1.0",
                    id=f"{run_id}:{place}",
                    source=ev.SOURCE,
                    subject=run_id,
                    time="2026-12-05T06:00:00Z",
                    datacontenttype="application/json",
                    data=ev.EventReceivedData(event={"type": "noise", "id": str(place)}),
                )
            )
        last = await log.append(run_id, batch, last)


def _page(records: list[ev.AnyRecord], offset: int, limit: int, finished: bool) -> object:
    more = offset + limit < len(records)
    return msgspec.to_builtins(
        LogPage(
            records=[views.record_view(r) for r in records[offset : offset + limit]],
            next_offset=offset + limit if more else None,
            finished=finished,
        )
    )


async def test_a_deep_page_of_a_long_log_reads_where_it_lies(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http("reader") as http:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        run_id = await client.start("waiting", {})
        await wait_status(gs, run_id, "running", "wait")
        await _grow(gs, run_id)
        records = await client.records(run_id)
        assert len(records) > 1800
        assert await log_length(gs.gateway.api.ops, run_id) == len(records)
        logs = gs.gateway.run_logs
        # As a log too long to keep is (200,000 records by default): not kept.
        logs.forget()
        reads = logs.reads
        for offset, limit in ((1200, 50), (1001, 1), (len(records) - 7, 200), (2, 1500)):
            read = logs.range_reads
            got = await http.get(f"/runs/{run_id}/log", params={"offset": offset, "limit": limit})
            assert got.status_code == 200
            assert got.json() == _page(records, offset, limit, finished=False), (offset, limit)
            # The page's own messages and a search (some 2 log2 of the stream's length),
            # where the whole log is 600 messages.
            own = min(limit, len(records) - offset) // PER_MESSAGE + 2
            assert logs.range_reads - read <= own + 30, (offset, limit, logs.range_reads - read)
        past = await http.get(f"/runs/{run_id}/log", params={"offset": 5000})
        assert past.json() == {"records": [], "next_offset": None, "finished": False}
        assert logs.reads == reads  # no page read the whole log

        # The run ends: a deep page says so, read where it lies as before.
        await client.signal(run_id, "go", {})
        await wait_status(gs, run_id, "completed")
        ended = await client.records(run_id)
        logs.forget()
        before = logs.reads
        got = await http.get(f"/runs/{run_id}/log", params={"offset": 1500, "limit": 1000})
        assert got.json() == _page(ended, 1500, 1000, finished=True)
        assert logs.reads == before


async def test_explaining_a_log_too_long_is_refused_before_it_is_read(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound lowered to the length of a log quick to write (20,000 records by default).
    monkeypatch.setattr(runlogs, "REDRIVE_MAX_RECORDS", 1000)
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http("reader") as http:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        short = await client.start("waiting", {})
        run_id = await client.start("waiting", {})
        await wait_status(gs, run_id, "running", "wait")
        await _grow(gs, run_id)
        logs = gs.gateway.run_logs
        logs.forget()
        reads = logs.reads
        for path in (f"/runs/{run_id}/explain", f"/runs/{run_id}/replay?against=1"):
            got = await http.get(path)
            assert got.status_code == 422, got.text
            problem = got.json()
            assert problem["type"].endswith("/log-too-long")
            assert problem["records"] == MESSAGES * PER_MESSAGE + 2
            assert f"interlock explain {run_id}" in problem["detail"]
        assert logs.reads == reads  # refused before the log was read
        assert (await http.get(f"/runs/{short}/explain")).status_code == 200
        assert (await http.get("/runs/rnosuchrun/explain")).status_code == 404


async def _streamed(http: httpx.AsyncClient, run_id: str, last: int) -> list[tuple[int, str]]:
    """(id, type) of each record the live log sends after ``Last-Event-ID: last``, to its
    end."""
    out: list[tuple[int, str]] = []
    headers = {"Last-Event-ID": str(last)}
    async with http.stream("GET", f"/runs/{run_id}/log/stream", headers=headers) as r:
        event: dict[str, str] = {}
        async for line in r.aiter_lines():
            if line.startswith(("id: ", "event: ", "data: ")):
                key, _, value = line.partition(": ")
                event[key] = value
            elif not line and event:
                if event["event"] == "end":
                    return out
                assert json.loads(event["data"])["id"] == f"{run_id}:{int(event['id']) + 1}"
                out.append((int(event["id"]), event["event"]))
                event = {}
    return out


async def test_the_live_log_of_a_long_log_starts_where_it_is_resumed(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http("reader") as http:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        run_id = await client.start("waiting", {})
        await wait_status(gs, run_id, "running", "wait")
        await _grow(gs, run_id)
        await client.signal(run_id, "go", {})
        await wait_status(gs, run_id, "completed")
        records = await client.records(run_id)
        logs = gs.gateway.run_logs
        logs.forget()  # as a log too long to keep is
        reads = logs.reads
        got = await asyncio.wait_for(_streamed(http, run_id, 1499), TIMEOUT)
        assert got == [(n, ev.record_type(r)) for n, r in enumerate(records)][1500:]
        assert logs.reads == reads  # read from where it was resumed, not whole
        assert not logs.keeps(run_id)


async def test_explaining_a_log_of_too_many_payload_bytes_is_refused(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound lowered below one input kept by reference (256 MiB by default).
    monkeypatch.setattr(runlogs, "REDRIVE_MAX_BYTES", 100_000)
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http("reader") as http:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        small = await client.start("waiting", {})
        large = await client.start("waiting", {"blob": "b" * 300_000})
        await wait_status(gs, large, "running", "wait")
        got = await http.get(f"/runs/{large}/explain")
        assert got.status_code == 422, got.text
        problem = got.json()
        assert problem["type"].endswith("/payloads-too-large")
        assert problem["bytes"] > 300_000
        assert problem["max_bytes"] == 100_000
        assert (await http.get(f"/runs/{small}/explain")).status_code == 200
