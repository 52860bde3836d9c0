"""The HTTP gateway on its own least-privilege credentials (role ``gateway``): every route
it serves works with them, with no permission refused on the way; and what the gateway has
no business doing (stream administration, durable consumers, tasks, answers, timers,
definitions, tokens, secrets) the server refuses it, tried with a plain client on the same
credentials, with the run logs unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUNS, TASKS, EVENTS = SUBJECTS.runs_stream, SUBJECTS.tasks_stream, SUBJECTS.events_stream
API = SUBJECTS.party_js_api


@dataclass
class Served:
    url: str
    token: str
    refusals: Refusals
    """Every error the server sent the gateway's connection (none expected)."""
    nc: Client
    """The gateway's connection."""

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(secured: Secured) -> AsyncIterator[Served]:
    creds = secured.issue(Role("gateway"), "gateway")
    refusals = Refusals()
    opts = ConnectOptions.resolve(secured.url, creds_file=str(creds), name="interlock gateway")
    nc = await connect(opts, error_cb=refusals.on_error)
    gateway = Gateway(nc, SUBJECTS)
    await gateway.start()
    server = HttpServer(build_app(gateway), 0, host="127.0.0.1")
    await server.start()
    # The operator issues the gateway's callers' tokens; the gateway only reads them.
    token = await Tokens(secured.operator.js, SUBJECTS).issue("ops", "operator")
    try:
        yield Served(server.url, token, refusals, nc)
    finally:
        await server.stop()
        await gateway.stop()
        await nc.close()


async def test_every_route_works_on_the_gateway_credentials(
    secured: Secured, served: Served
) -> None:
    async with served.http() as http:
        assert (await http.get("/readyz")).text == "ready\n"
        for path in ("/workflows", "/workflows/echoing", "/agents", "/runs", "/dead-letters"):
            r = await http.get(path)
            assert r.status_code == 200, (path, r.text, served.refusals.errors)
        # Start, wait for the result, read the log.
        r = await http.post("/runs", json={"workflow": "echoing"})
        assert r.status_code in (200, 201, 202), r.text
        run_id = r.json()["run_id"]
        r = await http.get(f"/runs/{run_id}/result", params={"timeout": 30})
        assert r.json()["status"] == "completed", r.text
        assert r.json()["outputs"] == {"said": "hello"}
        assert (await http.get(f"/runs/{run_id}")).status_code == 200
        log = (await http.get(f"/runs/{run_id}/log")).json()
        assert log["finished"]
        async with http.stream("GET", f"/runs/{run_id}/log/stream") as stream:
            body = b"".join([chunk async for chunk in stream.aiter_bytes()])
        assert b"event: end" in body
        # An event that starts a run, as a publisher's would.
        r = await http.post(
            "/events",
            headers={
                "ce-specversion": "1.0",
                "ce-id": "gw-1",
                "ce-source": "gw",
                "ce-type": "acme.echo.requested",
            },
            content=b"{}",
        )
        assert r.status_code == 202, r.text
        started = r.json()["events"][0]["started"]
        assert [s["workflow"] for s in started] == ["echoing"]
        # An event over the object threshold: its data stored by reference, in the
        # uploads bucket its account imports, and the run it starts completes.
        uploads = f"OBJ_{SUBJECTS.uploads_bucket}"
        stored_before = (await secured.operator.js.stream_info(uploads)).state.messages
        r = await http.post(
            "/events",
            headers={
                "ce-specversion": "1.0",
                "ce-id": "gw-big",
                "ce-source": "gw",
                "ce-type": "acme.echo.requested",
                "content-type": "application/json",
            },
            content=json.dumps({"blob": "x" * (300 << 10)}).encode(),
        )
        assert r.status_code == 202, r.text
        (big,) = r.json()["events"][0]["started"]

        # The run starts once the orchestrator has copied the data into its own objects.
        async def started() -> bool:
            return (await http.get(f"/runs/{big['run_id']}")).status_code == 200

        await eventually(started, within=30, what="the run the large event starts")
        r = await http.get(f"/runs/{big['run_id']}/result", params={"timeout": 30})
        assert r.json()["status"] == "completed", r.text
        assert (await secured.operator.js.stream_info(uploads)).state.messages > stored_before
        # Signal a waiting run (the gateway publishes on the run's own subject).
        waiting = (await http.post("/runs", json={"workflow": "awaiting"})).json()["run_id"]
        await _entered(secured, waiting, "waiting")
        r = await http.post(f"/runs/{waiting}/signals/acme.order.approved", json={"ok": 1})
        assert r.json()["outcome"] == "moved", r.text
        # Cancel a run.
        held = (await http.post("/runs", json={"workflow": "guarded"})).json()["run_id"]
        await _entered(secured, held, "work")
        r = await http.post(f"/runs/{held}/cancel", json={"reason": "enough"})
        assert r.json()["cancelled"] is True, r.text
        # Dead letters: one to read and redrive (an event typed unlike its subject).
        headers = {"ce-specversion": "1.0", "ce-id": "dl-1", "ce-source": "t", "ce-type": "x.y"}
        await secured.operator.js.publish("il.events.x.z", b"{}", headers=headers)
        letters: list[dict[str, object]] = []
        for _ in range(300):
            letters = (await http.get("/dead-letters")).json()
            if any(item["reason"] == "type-mismatch" for item in letters):
                break
            await asyncio.sleep(0.1)
        letter = next(item for item in letters if item["reason"] == "type-mismatch")
        assert (await http.get(f"/dead-letters/{letter['seq']}")).status_code == 200
        r = await http.post(f"/dead-letters/{letter['seq']}/redrive")
        assert r.status_code == 200, r.text
    assert (await secured.operator.state(waiting)).status == "completed"
    assert (await secured.operator.state(held)).status == "cancelled"
    # The server answers a connection's messages in order: a permission it refused the
    # gateway on the way came back before the answer to this ping.
    await served.nc.flush()
    assert not served.refusals.errors, served.refusals.errors


async def _entered(secured: Secured, run_id: str, state: str) -> None:
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.StateEntered) and record.data.state == state:
            return
    raise AssertionError(f"{run_id} never entered {state}")


REFUSED = [
    ("purge the run logs", "pub", f"$JS.API.STREAM.PURGE.{RUNS}"),
    ("delete the run logs", "pub", f"$JS.API.STREAM.DELETE.{RUNS}"),
    ("change the events stream", "pub", f"$JS.API.STREAM.UPDATE.{EVENTS}"),
    ("create a stream", "pub", "$JS.API.STREAM.CREATE.STOLEN"),
    ("delete a log message", "pub", f"$JS.API.STREAM.MSG.DELETE.{RUNS}"),
    ("create a consumer on the logs", "pub", f"$JS.API.CONSUMER.CREATE.{RUNS}"),
    # The buckets it lists are read by direct gets: a consumer per request, left on the
    # server after it, would let polling callers fill the stream's 1,000.
    (
        "create a consumer on the definitions",
        "pub",
        f"$JS.API.CONSUMER.CREATE.KV_{SUBJECTS.workflows_bucket}",
    ),
    (
        "create a consumer on the agents",
        "pub",
        f"$JS.API.CONSUMER.CREATE.KV_{SUBJECTS.agents_bucket}.x",
    ),
    (
        "create a consumer on the tokens",
        "pub",
        f"$JS.API.CONSUMER.CREATE.KV_{SUBJECTS.http_tokens_bucket}",
    ),
    ("create a durable", "pub", f"$JS.API.CONSUMER.DURABLE.CREATE.{TASKS}.thief"),
    ("delete the relay", "pub", f"$JS.API.CONSUMER.DELETE.{RUNS}.relay"),
    ("take echo's tasks", "pub", f"$JS.API.CONSUMER.MSG.NEXT.{TASKS}.cap_echo"),
    ("inject a task", "pub", "il.cap.echo"),
    ("write the task queue's keeper", "pub", SUBJECTS.tasks_keeper),
    ("answer a task", "pub", "il.results.held.{run}"),
    ("answer a task by request", "pub", "il.answer.held.{run}"),
    ("fire a timer", "pub", "il.timers.fired.{run}"),
    ("dead-letter as the orchestrator", "pub", "il.dlq.unknown_run"),
    ("write a workflow", "pub", f"$KV.{SUBJECTS.workflows_bucket}.latest.default.x"),
    ("mint an HTTP token", "pub", f"$KV.{SUBJECTS.http_tokens_bucket}.t.forged"),
    ("change the partition map", "pub", f"$KV.{SUBJECTS.partitions_bucket}.map"),
    ("take a partition's lease", "pub", f"$KV.{SUBJECTS.partitions_bucket}.owner.0"),
    ("make a partition's stream", "pub", f"$JS.API.STREAM.CREATE.{RUNS}_7"),
    ("purge a partition's stream", "pub", f"$JS.API.STREAM.PURGE.{RUNS}_1"),
    ("read the secrets", "pub", "$JS.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.task-token-key"),
    # Under the prefix its account imports the JetStream API at: reads only.
    ("purge the run logs through its imports", "pub", f"{API}.STREAM.PURGE.{RUNS}"),
    ("delete a log message through its imports", "pub", f"{API}.STREAM.MSG.DELETE.{RUNS}"),
    ("create a consumer through its imports", "pub", f"{API}.CONSUMER.CREATE.{RUNS}"),
    (
        "create a consumer on the run index",
        "pub",
        f"{API}.CONSUMER.CREATE.KV_{SUBJECTS.runs_bucket}",
    ),
    (
        "read the secrets through its imports",
        "pub",
        f"{API}.DIRECT.GET.KV_il_secrets.$KV.il_secrets.task-token-key",
    ),
    ("read the secrets by a batched get", "pub", f"{API}.DIRECT.GET.KV_il_secrets"),
    ("read the secrets by a stored get", "pub", f"{API}.STREAM.MSG.GET.KV_il_secrets"),
    ("write the run index", "pub", f"$KV.{SUBJECTS.runs_bucket}.forged"),
    ("listen to tasks", "sub", "il.cap.>"),
    ("listen to answers", "sub", "il.results.>"),
    ("take answer requests", "sub", "il.answer.>"),
    ("listen to others' replies", "sub", "_INBOX.>"),
]


@pytest.mark.parametrize(("what", "how", "pattern"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_refused_to_the_gateway(
    secured: Secured, served: Served, what: str, how: str, pattern: str
) -> None:
    creds = secured.issued["gateway"]
    run_id = await secured.operator.start("guarded", {})
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.ActionRequested):
            break
    before = [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    subject = pattern.format(run=run_id)
    try:
        if how == "pub":
            forged = {"run_id": run_id, "config": {"name": "x"}, "forged": True}
            await nc.publish(subject, json.dumps(forged).encode(), reply=nc.new_inbox())
            await nc.flush()
            await refusals.wait_for("permissions violation", "publish", subject)
        else:
            await nc.subscribe(subject)
            await nc.flush()
            await refusals.wait_for("permissions violation", "subscription", subject)
    finally:
        await nc.close()
    after = [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]
    assert after == before, f"{what} changed the run log"
