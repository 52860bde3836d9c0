"""``POST /events``: the CloudEvents HTTP binding's three modes, against a real stack."""

from __future__ import annotations

import json

import pytest
from cloudevents.core.bindings import http as sdk_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent as SdkEvent

from interlock.core.engine import derive_run_id
from interlock.gateway.auth import Tokens
from interlock.transport.subjects import Subjects
from support.gateway import HELLO, GatewayStack, gateway_stack

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO], max_body=4096) as stack:
        yield stack


def greet(event_id: str, message: str = "hi", lang: str = "en") -> SdkEvent:
    return SdkEvent(
        attributes={
            "id": event_id,
            "source": "https://ci.example/builds",
            "type": "com.example.greet",
            "specversion": "1.0",
            "datacontenttype": "application/json",
        },
        data={"message": message, "lang": lang},
    )


async def hello_run(gs: GatewayStack, event_id: str) -> str:
    definition, _ = await gs.stack.client.registry.latest("hello")
    return derive_run_id(definition, "https://ci.example/builds", event_id)


async def test_binary_mode_starts_the_run_it_names(gs: GatewayStack) -> None:
    message = sdk_http.to_binary(greet("b-1", "binary"), JSONFormat())
    async with gs.http() as http:
        r = await http.post("/events", headers=dict(message.headers), content=message.body)
    assert r.status_code == 202, r.text
    body = r.json()
    run_id = await hello_run(gs, "b-1")
    assert body["mode"] == "binary"
    [item] = body["events"]
    assert item["id"] == "b-1"
    assert item["duplicate"] is False
    [started] = item["started"]
    assert started["run_id"] == run_id
    assert (started["workflow"], started["namespace"], started["version"]) == (
        "hello",
        "default",
        1,
    )
    state = await gs.stack.wait(run_id)
    assert state.status == "completed"
    assert state.outputs == {"echoed": "binary"}


async def test_structured_mode(gs: GatewayStack) -> None:
    message = sdk_http.to_structured(greet("s-1", "structured"), JSONFormat())
    assert message.headers["content-type"].startswith("application/cloudevents+json")
    async with gs.http() as http:
        r = await http.post("/events", headers=dict(message.headers), content=message.body)
    assert r.status_code == 202, r.text
    assert r.json()["mode"] == "structured"
    state = await gs.stack.wait(await hello_run(gs, "s-1"))
    assert state.outputs == {"echoed": "structured"}


async def test_batched_mode_stores_each_and_says_what_each_starts(gs: GatewayStack) -> None:
    batch = [
        {
            "specversion": "1.0",
            "id": "m-1",
            "source": "https://ci.example/builds",
            "type": "com.example.greet",
            "data": {"message": "one", "lang": "en"},
        },
        {
            "specversion": "1.0",
            "id": "m-2",
            "source": "https://ci.example/builds",
            "type": "com.example.greet",
            "data": {"message": "two", "lang": "fr"},
        },
    ]
    async with gs.http() as http:
        r = await http.post(
            "/events",
            headers={"Content-Type": "application/cloudevents-batch+json"},
            content=json.dumps(batch),
        )
    assert r.status_code == 202, r.text
    one, two = r.json()["events"]
    assert [one["id"], two["id"]] == ["m-1", "m-2"]
    assert len(one["started"]) == 1
    assert two["started"] == []  # the trigger's filter wants lang en
    state = await gs.stack.wait(one["started"][0]["run_id"])
    assert state.outputs == {"echoed": "one"}
    assert await gs.stored_events() == 2


async def test_the_same_source_and_id_is_stored_once(gs: GatewayStack) -> None:
    message = sdk_http.to_binary(greet("d-1"), JSONFormat())
    async with gs.http() as http:
        first = await http.post("/events", headers=dict(message.headers), content=message.body)
        again = await http.post("/events", headers=dict(message.headers), content=message.body)
    assert first.status_code == again.status_code == 202
    assert first.json()["events"][0]["duplicate"] is False
    assert again.json()["events"][0]["duplicate"] is True
    [run] = first.json()["events"][0]["started"]
    [same] = again.json()["events"][0]["started"]
    assert same["run_id"] == run["run_id"]
    assert await gs.stored_events() == 1


@pytest.mark.parametrize(
    ("headers", "body", "names"),
    [
        ({"ce-specversion": "1.0", "ce-id": "x", "ce-source": "s"}, b"{}", "'type'"),
        (
            {"ce-specversion": "0.3", "ce-id": "x", "ce-source": "s", "ce-type": "a.b"},
            b"",
            "specversion",
        ),
        ({"Content-Type": "application/cloudevents+json"}, b"{not json", "not valid JSON"),
        (
            {"Content-Type": "application/cloudevents+json"},
            b'{"specversion":"1.0","id":"x","source":"s","type":"a.b","time":"yesterday"}',
            "'time'",
        ),
        (
            {"ce-specversion": "1.0", "ce-id": "x", "ce-source": "s", "ce-type": "a b"},
            b"",
            "cannot be routed",
        ),
        (
            {
                "ce-specversion": "1.0",
                "ce-id": "x",
                "ce-source": "s",
                "ce-type": "a.b",
                "ce-actionid": "r1:3",
            },
            b"",
            "actionid",
        ),
        ({"Content-Type": "application/cloudevents-batch+json"}, b'{"a": 1}', "JSON array"),
        (
            {
                "ce-specversion": "1.0",
                "ce-id": "x",
                "ce-source": "s",
                "ce-type": "a.b",
                "ce-runid": "no such/run",
            },
            b"",
            "runid",
        ),
    ],
)
async def test_an_invalid_event_gets_a_problem_naming_what_is_wrong(
    gs: GatewayStack, headers: dict[str, str], body: bytes, names: str
) -> None:
    async with gs.http() as http:
        r = await http.post("/events", headers=headers, content=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 400
    assert problem["type"].endswith("/invalid-event")
    assert names in problem["detail"]
    assert await gs.stored_events() == 0


async def test_a_body_that_is_no_cloudevent_is_415(gs: GatewayStack) -> None:
    async with gs.http() as http:
        r = await http.post("/events", json={"hello": "world"})
    assert r.status_code == 415
    assert "ce-specversion" in r.json()["detail"]


async def test_a_bad_event_in_a_batch_stores_none_of_it(gs: GatewayStack) -> None:
    batch = [
        {"specversion": "1.0", "id": "ok", "source": "s", "type": "com.example.greet"},
        {"specversion": "1.0", "id": "bad", "source": "s"},
    ]
    async with gs.http() as http:
        r = await http.post(
            "/events",
            headers={"Content-Type": "application/cloudevents-batch+json"},
            content=json.dumps(batch),
        )
    assert r.status_code == 400
    assert r.json()["index"] == 1
    assert "event 1 of the batch" in r.json()["detail"]
    assert await gs.stored_events() == 0


async def test_over_the_size_limit_is_413(gs: GatewayStack) -> None:
    message = sdk_http.to_binary(greet("big", "x" * 5000), JSONFormat())
    async with gs.http() as http:
        r = await http.post("/events", headers=dict(message.headers), content=message.body)

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(10):  # no Content-Length: cut while reading
                yield b"x" * 1000

        streamed = await http.post(
            "/events",
            headers={"ce-specversion": "1.0", "ce-id": "s", "ce-source": "s", "ce-type": "a.b"},
            content=chunks(),
        )
    assert r.status_code == 413
    assert r.json()["max_bytes"] == 4096
    assert streamed.status_code == 413
    assert await gs.stored_events() == 0


async def test_credentials_and_roles(gs: GatewayStack) -> None:
    ok = sdk_http.to_binary(greet("p-1"), JSONFormat())
    other = SdkEvent(
        attributes={"id": "p-2", "source": "s", "type": "org.other.thing", "specversion": "1.0"}
    )
    other_msg = sdk_http.to_binary(other, JSONFormat())
    async with gs.http(None) as anonymous:
        r = await anonymous.post("/events", headers=dict(ok.headers), content=ok.body)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await anonymous.post(
            "/events",
            headers={**ok.headers, "Authorization": "Bearer ilt_not-a-token"},
            content=ok.body,
        )
        assert r.status_code == 401
        assert "not known" in r.json()["detail"]
    async with gs.http("reader") as reader:
        r = await reader.post("/events", headers=dict(ok.headers), content=ok.body)
        assert r.status_code == 403
    async with gs.http("publisher") as publisher:
        r = await publisher.post("/events", headers=dict(other_msg.headers), content=other_msg.body)
        assert r.status_code == 403
        assert "org.other.thing" in r.json()["detail"]
        assert await gs.stored_events() == 0
        # A publisher reaches runs by triggers and correlation, never one run by its id.
        to_run = SdkEvent(
            attributes={
                "id": "p-3",
                "source": "s",
                "type": ok.headers["ce-type"],
                "specversion": "1.0",
                "runid": "r-some-run",
            }
        )
        to_run_msg = sdk_http.to_binary(to_run, JSONFormat())
        r = await publisher.post(
            "/events", headers=dict(to_run_msg.headers), content=to_run_msg.body
        )
        assert r.status_code == 403
        assert "may not address a run" in r.json()["detail"]
        assert await gs.stored_events() == 0
        r = await publisher.post("/events", headers=dict(ok.headers), content=ok.body)
        assert r.status_code == 202
    await Tokens(gs.stack.js, gs.stack.subjects).revoke("ci")  # the operator revokes it
    gs.gateway.tokens._cache.clear()  # what 5 s of waiting would do
    async with gs.http("publisher") as publisher:
        r = await publisher.post("/events", headers=dict(ok.headers), content=ok.body)
        assert r.status_code == 401


async def test_health_routes_are_served_too(gs: GatewayStack) -> None:
    async with gs.http(None) as http:
        assert (await http.get("/healthz")).text == "ok\n"
        assert (await http.get("/readyz")).text == "ready\n"
        assert (await http.get("/metrics")).status_code == 200
