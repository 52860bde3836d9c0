"""The registry's check that it knows every workflow stored before a moment (``sync``,
and ``sync_soon`` whose request goes out at once), against a real nats-server.

Each registry here runs no watchers, so whatever it learns it learns from the check: a
workflow stored after the revision it has taken into account must be found, and nothing
read when there is none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from interlock.runtime.client import InterlockClient
from interlock.runtime.registry import Registry
from interlock.runtime.revisions import nothing_stored
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.jetstream import JetStream
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import Subjects
from support.runtime import yaml

FLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: checked
    spec:
      triggers:
        - event: com.example.checked
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: never.sent, goto: done}
        done:
          type: terminal
          outputs:
            version: 1
    """
)


@pytest.fixture
async def client(nats_url: str, subjects: Subjects) -> AsyncIterator[InterlockClient]:
    nc = await connect(ConnectOptions.resolve(nats_url, name="registry sync test"))
    assert isinstance(nc, NatsClient)
    client = InterlockClient(nc, subjects)
    await client.ensure_provisioned()
    try:
        yield client
    finally:
        await nc.close()


async def apply(client: InterlockClient, version: int) -> None:
    result = await client.apply([("<flow>", FLOW.replace("version: 1", f"version: {version}"))])
    assert result.compiled.ok


def versions(registry: Registry) -> list[int]:
    return [version for _, version in registry.triggered_by("com.example.checked")]


def no_catch_up(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every wait for the watchers (there must be none when nothing is newer)."""
    calls: list[str] = []

    async def catch_up(bucket: str, _: float) -> None:
        calls.append(bucket)

    monkeypatch.setattr(registry.revisions, "_catch_up", catch_up)
    return calls


async def test_sync_finds_a_workflow_stored_after_the_revision_seen(
    client: InterlockClient, subjects: Subjects
) -> None:
    registry = Registry(client.js, subjects)
    await registry.sync(timeout=0.01)  # an empty bucket: nothing to learn
    assert versions(registry) == []
    await apply(client, 1)
    await registry.sync(timeout=0.01)
    assert versions(registry) == [1]
    await apply(client, 2)
    await registry.sync(timeout=0.01)
    assert versions(registry) == [2]


async def test_sync_soon_finds_a_workflow_stored_after_the_revision_seen(
    client: InterlockClient, subjects: Subjects
) -> None:
    registry = Registry(client.js, subjects)
    await registry.sync(timeout=0.01)  # the reply subscription is up: sent in one call
    for version in (1, 2, 3):
        await apply(client, version)
        await registry.sync_soon(timeout=0.01)
        assert versions(registry) == [version]


async def test_nothing_stored_after_the_revision_seen_reads_nothing(
    client: InterlockClient, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    await apply(client, 1)
    registry = Registry(client.js, subjects)
    await registry.sync(timeout=0.01)
    assert versions(registry) == [1]
    calls = no_catch_up(registry, monkeypatch)
    await registry.sync()
    await registry.sync_soon()
    assert calls == []


async def test_cancelling_sync_soon_ends_its_wait_for_the_watchers(
    client: InterlockClient, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    await apply(client, 1)
    registry = Registry(client.js, subjects)
    await registry.sync(timeout=0.01)
    await apply(client, 2)
    waits: list[asyncio.Task[Any]] = []
    waiting = asyncio.Event()

    async def catch_up(*_: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        waits.append(task)
        waiting.set()
        await asyncio.Event().wait()  # never set: waits until cancelled

    monkeypatch.setattr(registry.revisions, "_catch_up", catch_up)
    check = registry.sync_soon()
    await asyncio.wait_for(waiting.wait(), 5)
    check.cancel()
    [wait] = waits
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(wait, 5)


async def test_what_the_server_answers_to_the_check(
    client: InterlockClient, subjects: Subjects
) -> None:
    """Only "no message found" says nothing is stored: not a message, not another 404
    (no such stream), not a status without a body (nobody answering)."""
    await apply(client, 1)
    js = client.js
    assert isinstance(js, JetStream)
    bucket = subjects.workflows_bucket
    stream = f"$JS.API.STREAM.MSG.GET.KV_{bucket}"

    async def answer(subject: str, seq: int) -> Any:
        body = json.dumps({"seq": seq, "next_by_subj": f"$KV.{bucket}.>"})
        return await js.request_ack(subject, body.encode())

    assert not nothing_stored(await answer(stream, 1))
    assert nothing_stored(await answer(stream, 1_000_000))
    missing = await answer("$JS.API.STREAM.MSG.GET.KV_missing_bucket", 1)
    assert b"404" in missing.data
    assert not nothing_stored(missing)
    nobody = js.request_ack_soon(f"{subjects.prefix}.nobody.listens", b"")
    assert nobody is not None
    assert not nothing_stored(await nobody)


async def test_the_check_goes_out_through_the_shared_reply_subscription(
    client: InterlockClient, subjects: Subjects
) -> None:
    """Its request is sent in the call (one more publish awaiting its answer), not from
    a task that runs later."""
    registry = Registry(client.js, subjects)
    await registry.sync()
    sent = client.nc.stats["out_msgs"]
    check = registry.sync_soon()
    assert client.nc.stats["out_msgs"] == sent + 1
    await check
