"""Hostile input over HTTP, as the caller that may send it (a publisher's token for
``/events``, an operator's for ``POST /runs``), on a real socket: every one is refused with
a 4xx problem body that says what and where, nothing is published, and what is accepted
can be read back. The gateway's bounds are the orchestrator's: nesting (``MAX_DEPTH``) and
an event's size (a quarter of the server's payload limit)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from interlock.transport.cloudevents import MAX_DEPTH
from interlock.transport.subjects import Subjects
from support.accounts import pooled_subjects, secured_nats_url
from support.gateway import GatewayStack, gateway_stack, yaml

# The gateway on a server with authentication, on its own account's credential.
__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects

pytestmark = pytest.mark.asyncio

TAKES_ANY = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: takes-any
    spec:
      inputs:
        x: {type: any}
      initial_state: wait
      states:
        wait:
          type: human_in_the_loop
          on:
            - {event: go, goto: done}
        done:
          type: terminal
    """
)


HOOK = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Webhook
    metadata:
      name: hook
    spec:
      scheme: github
      secret: {env: IL_TEST_HOSTILE_HOOK_SECRET}
      type: {value: com.example.hook}
    """
)
HOOK_SECRET = "hostile hook secret"


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("IL_TEST_HOSTILE_HOOK_SECRET", HOOK_SECRET)
    manifests = [TAKES_ANY, HOOK]
    async with gateway_stack(nats_url, subjects, manifests, max_body=2 << 20) as stack:
        yield stack


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_json(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def problem(r, status: int, kind: str) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.text
    body = r.json()
    assert body["type"].endswith("/" + kind), body
    return body


def structured(data_json: str, type_: str = "com.example.deep", id_: str = "e-1") -> str:
    return (
        f'{{"specversion": "1.0", "id": "{id_}", "source": "s", "type": "{type_}", '
        f'"datacontenttype": "application/json", "data": {data_json}}}'
    )


async def test_a_batch_with_deep_data_is_a_400_naming_the_event(gs: GatewayStack) -> None:
    batch = "[" + structured("1", id_="ok") + "," + structured(deep_json(10_000)) + "]"
    async with gs.http("publisher") as http:
        r = await http.post(
            "/events",
            content=batch,
            headers={"Content-Type": "application/cloudevents-batch+json"},
        )
    body = problem(r, 400, "invalid-event")
    assert f"nests deeper than {MAX_DEPTH} levels" in body["detail"]
    assert await gs.stored_events() == 0


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_one_event_nesting_beyond_the_bound_is_a_400(gs: GatewayStack, mode: str) -> None:
    data = deep_json(MAX_DEPTH + 1)
    async with gs.http("publisher") as http:
        if mode == "structured":
            r = await http.post(
                "/events",
                content=structured(data),
                headers={"Content-Type": "application/cloudevents+json"},
            )
        else:
            r = await http.post("/events", content=data, headers=_binary("com.example.deep"))
    body = problem(r, 400, "invalid-event")
    assert body["reason"] == "too-deep"
    assert await gs.stored_events() == 0


def _binary(type_: str, id_: str = "b-1") -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": id_,
        "ce-source": "s",
        "ce-type": type_,
        "Content-Type": "application/json",
    }


@pytest.mark.parametrize("mode", ["structured", "binary"])
async def test_an_id_over_256_bytes_is_a_400(gs: GatewayStack, mode: str) -> None:
    long_id = "i" * 257
    async with gs.http("publisher") as http:
        if mode == "structured":
            r = await http.post(
                "/events",
                content=structured("1", id_=long_id),
                headers={"Content-Type": "application/cloudevents+json"},
            )
        else:
            r = await http.post(
                "/events", content="1", headers=_binary("com.example.deep", long_id)
            )
    body = problem(r, 400, "invalid-event")
    assert body["reason"] == "id-too-long"


async def test_a_type_of_ten_thousand_words_is_a_400(gs: GatewayStack) -> None:
    long_type = ".".join(["com"] + ["w"] * 10_000)
    async with gs.http("operator") as http:
        r = await http.post("/events", content=b"{}", headers=_binary(long_type))
    body = problem(r, 400, "invalid-event")
    assert "invalid event type" in body["detail"]
    assert await gs.stored_events() == 0


async def test_an_event_larger_than_the_objects_bound_is_a_413(gs: GatewayStack) -> None:
    """Data over the threshold goes by reference, up to the bound of objects (set low
    here: 256 KiB, the inline limit, so the bodies stay small)."""
    objects = gs.gateway.client.payloads.objects
    limit = gs.gateway.nc.max_payload // 4
    objects.max_bytes, kept = limit, objects.max_bytes
    try:
        big = json.dumps({"blob": "x" * (limit + 1)})
        async with gs.http("publisher") as http:
            r = await http.post("/events", content=big, headers=_binary("com.example.big"))
            body = problem(r, 413, "event-too-large")
            assert str(limit) in body["detail"].replace(",", "")
            fits = json.dumps({"blob": "x" * (limit - 1000)})
            ok = await http.post("/events", content=fits, headers=_binary("com.example.big", "b-2"))
    finally:
        objects.max_bytes = kept
    assert ok.status_code == 202, ok.text
    assert await gs.stored_events() == 1


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 3_000])
async def test_start_with_inputs_nesting_beyond_the_bound_is_a_400(
    gs: GatewayStack, depth: int
) -> None:
    body = '{"workflow": "takes-any", "inputs": {"x": ' + deep_json(depth) + "}}"
    async with gs.http("operator") as http:
        r = await http.post("/runs", content=body)
        found = problem(r, 400, "invalid-request")
        assert f"nests deeper than {MAX_DEPTH} levels" in found["detail"]
        assert (await http.get("/runs")).json()["runs"] == []


async def test_inputs_at_the_bound_start_a_run_that_every_reader_can_read(
    gs: GatewayStack,
) -> None:
    value = nested(MAX_DEPTH - 1)  # inside {"x": ...}: MAX_DEPTH levels in all
    async with gs.http("operator") as http:
        r = await http.post("/runs", json={"workflow": "takes-any", "inputs": {"x": value}})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        for path in (f"/runs/{run_id}", f"/runs/{run_id}/log", f"/runs/{run_id}/result"):
            got = await http.get(path)
            assert got.status_code == 200, (path, got.text)


async def test_a_signal_or_a_signed_webhook_nesting_beyond_the_bound_is_a_400(
    gs: GatewayStack,
) -> None:
    import hashlib
    import hmac

    deep = deep_json(10_000).encode()
    async with gs.http("operator") as http:
        started = await http.post("/runs", json={"workflow": "takes-any"})
        run_id = started.json()["run_id"]
        signal = await http.post(f"/runs/{run_id}/signals/go", content=deep)
        body = problem(signal, 400, "invalid-request")
        assert body["reason"] == "too-deep"
        digest = hmac.new(HOOK_SECRET.encode(), deep, hashlib.sha256).hexdigest()
        hook = await http.post(
            "/webhooks/hook",
            content=deep,
            headers={
                "Content-Type": "application/json",
                "X-GitHub-Delivery": "d-1",
                "X-Hub-Signature-256": f"sha256={digest}",
            },
        )
        body = problem(hook, 400, "invalid-body")
        assert f"nests deeper than {MAX_DEPTH} levels" in body["detail"]
    assert await gs.stored_events() == 0


async def test_a_200_kb_header_is_a_431(gs: GatewayStack) -> None:
    url = urlsplit(gs.url)
    head = (
        f"GET /runs HTTP/1.1\r\nHost: {url.hostname}\r\nX-Big: {'a' * 200_000}\r\n\r\n"
    ).encode()
    # A raw socket: httpx would refuse to send such a head, a client that means harm would not.
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line = answer.split(b"\r\n", 1)[0].decode()
    assert status_line.startswith("HTTP/1.1 431"), status_line


async def test_the_cli_refuses_the_same_before_publishing(
    gs: GatewayStack, nats_url: str, tmp_path: Path
) -> None:
    """``interlock start`` and ``interlock emit`` (the client underneath) hold the same
    bounds: a clear error, a non-zero exit, nothing written."""
    import asyncio as aio

    from support.runtime import cli_env, run_cli

    # The bound of payloads by reference, set below the event's size.
    env = {**cli_env(nats_url, gs.stack.subjects.prefix), "INTERLOCK_OBJECT_MAX_BYTES": "512KiB"}
    deep = tmp_path / "deep.json"
    deep.write_text('{"x": ' + deep_json(100) + "}")
    deeper = tmp_path / "deeper.json"
    deeper.write_text('{"x": ' + deep_json(10_000) + "}")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * gs.gateway.nc.max_payload}))
    started = await aio.to_thread(run_cli, "start", "takes-any", "--input", f"@{deep}", env=env)
    emitted = await aio.to_thread(
        run_cli, "emit", "com.example.big", "--source", "s", "--data", f"@{big}", env=env
    )
    unreadable = await aio.to_thread(
        run_cli, "start", "takes-any", "--input", f"@{deeper}", env=env
    )
    assert started.returncode == 1, started.stderr
    assert f"input 'x' nests deeper than {MAX_DEPTH} levels" in started.stderr
    assert unreadable.returncode == 2, unreadable.stderr
    assert f"--input nests deeper than {MAX_DEPTH} levels" in unreadable.stderr
    assert emitted.returncode == 2, emitted.stderr
    assert "events take at most" in emitted.stderr
    nested_data = await aio.to_thread(
        run_cli, "emit", "com.example.deep", "--source", "s", "--data", f"@{deep}", env=env
    )
    assert nested_data.returncode == 2, nested_data.stderr
    assert f"data nests deeper than {MAX_DEPTH} levels" in nested_data.stderr
    assert "Traceback" not in started.stderr + unreadable.stderr + emitted.stderr
    assert await gs.stored_events() == 0
    async with gs.http("operator") as http:
        assert (await http.get("/runs")).json()["runs"] == []
