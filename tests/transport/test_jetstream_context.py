"""The shared JetStream context: acknowledgements on one subscription, nats-py's errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import StreamConfig
from nats.js.errors import APIError, KeyWrongLastSequenceError, NoStreamResponseError

from interlock.transport.jetstream import JetStream, jetstream
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import Subjects
from support.runtime import eventually


@pytest.fixture(params=["nats-py", "interlock"])
async def nc(request: pytest.FixtureRequest, nats_url: str) -> AsyncIterator[Client]:
    """Both clients: nats-py's own (acknowledgements through a subscription's callback)
    and Interlock's (through a direct subscription)."""
    client = Client() if request.param == "nats-py" else NatsClient()
    await client.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def stream(nc: Client, subjects: Subjects) -> str:
    name = f"{subjects.prefix}_JSCTX"
    await nc.jetstream().add_stream(
        StreamConfig(name=name, subjects=[f"{subjects.prefix}.jsctx.>"])
    )
    return name


async def test_one_context_per_connection(nc: Client) -> None:
    assert jetstream(nc) is jetstream(nc)
    assert isinstance(jetstream(nc), JetStream)


async def test_concurrent_publishes_each_get_their_own_acknowledgement(
    nc: Client, subjects: Subjects, stream: str
) -> None:
    js = jetstream(nc)
    acks = await asyncio.gather(
        *(js.publish(f"{subjects.prefix}.jsctx.{i}", str(i).encode()) for i in range(200))
    )
    assert {a.stream for a in acks} == {stream}
    assert sorted(a.seq for a in acks) == list(range(1, 201))
    # Each acknowledgement names the sequence its own message was stored at.
    for i, ack in enumerate(acks):
        stored = await js.get_msg(stream, ack.seq)
        assert stored.data == str(i).encode()


async def test_a_duplicate_message_id_is_acknowledged_as_such(
    nc: Client, subjects: Subjects, stream: str
) -> None:
    js = jetstream(nc)
    headers = {"Nats-Msg-Id": "once"}
    first = await js.publish(f"{subjects.prefix}.jsctx.d", b"1", headers=headers)
    again = await js.publish(f"{subjects.prefix}.jsctx.d", b"1", headers=headers)
    assert (first.duplicate, again.duplicate, again.seq) == (None, True, first.seq)


async def test_refusals_raise_nats_py_errors(nc: Client, subjects: Subjects, stream: str) -> None:
    js = jetstream(nc)
    subject = f"{subjects.prefix}.jsctx.cas"
    await js.publish(subject, b"a")
    with pytest.raises(APIError) as refused:
        await js.publish(subject, b"b", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    assert refused.value.err_code == 10071
    with pytest.raises(NoStreamResponseError):
        await js.publish(f"{subjects.prefix}.nowhere", b"x")
    with pytest.raises(NoRespondersError):
        await js.request_ack(f"{subjects.prefix}.nowhere", b"x")


async def test_key_value_writes_go_through_it_with_their_errors(
    nc: Client, subjects: Subjects
) -> None:
    kv = await jetstream(nc).create_key_value(bucket=f"{subjects.prefix}_jsctx")
    revision = await kv.create("k", b"1")
    assert await kv.update("k", b"2", last=revision) == revision + 1
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.update("k", b"3", last=revision)
    assert (await kv.get("k")).value == b"2"


async def _some(held: list[Msg]) -> bool:
    return bool(held)


async def test_an_unanswered_publish_times_out_and_a_late_answer_is_dropped(
    nc: Client, subjects: Subjects
) -> None:
    held: list[Msg] = []

    async def hold(msg: Msg) -> None:
        held.append(msg)  # a responder that answers too late

    sub = await nc.subscribe(f"{subjects.prefix}.silent", cb=hold)
    try:
        js = jetstream(nc)
        with pytest.raises(NatsTimeoutError):
            await js.request_ack(f"{subjects.prefix}.silent", b"x", ack_wait=0.2)
        # The request reaches the responder through the server, which on a loaded machine
        # may take longer than the 0.2 s the publish waited.
        await eventually(lambda: _some(held), what="the request at the responder")
        assert len(held) == 1
        await nc.publish(held[0].reply, b'{"stream":"late","seq":1}')
        await nc.flush()
        # The context still works, and the late answer went nowhere.
        with pytest.raises(NatsTimeoutError):
            await js.request_ack(f"{subjects.prefix}.silent", b"y", ack_wait=0.2)
    finally:
        await sub.unsubscribe()


async def test_a_publish_sent_at_once_is_acknowledged_as_publish_is(
    nc: Client, subjects: Subjects, stream: str
) -> None:
    """``request_ack_soon`` sends in one plain call on Interlock's client (on nats-py's,
    or before the reply subscription exists, it says to await ``publish``); its answer
    reads as ``publish`` returns or raises it."""
    js = jetstream(nc)
    subject = f"{subjects.prefix}.jsctx.soon"
    if not isinstance(nc, NatsClient):
        await js.publish(subject, b"0")
        assert js.request_ack_soon(subject, b"1") is None
        return
    assert js.request_ack_soon(subject, b"1") is None  # no reply subscription yet
    first = await js.publish(subject, b"1")
    soon = js.request_ack_soon(subject, b"2", headers={"Nats-Msg-Id": "soon"})
    assert soon is not None
    ack = js.acknowledged(await soon)
    assert (ack.stream, ack.seq) == (stream, first.seq + 1)
    again = js.request_ack_soon(subject, b"2", headers={"Nats-Msg-Id": "soon"})
    assert again is not None
    assert js.acknowledged(await again).duplicate
    refused = js.request_ack_soon(
        subject, b"3", headers={"Nats-Expected-Last-Subject-Sequence": "1"}
    )
    assert refused is not None
    with pytest.raises(APIError) as error:
        js.acknowledged(await refused)
    assert error.value.err_code == 10071
    nowhere = js.request_ack_soon(f"{subjects.prefix}.nowhere", b"x")
    assert nowhere is not None
    with pytest.raises(NoStreamResponseError):
        js.acknowledged(await nowhere)
    held: list[Msg] = []

    async def hold(msg: Msg) -> None:
        held.append(msg)  # a responder that never answers

    sub = await nc.subscribe(f"{subjects.prefix}.silent", cb=hold)
    silent = js.request_ack_soon(f"{subjects.prefix}.silent", b"x", ack_wait=0.2)
    assert silent is not None
    with pytest.raises(NatsTimeoutError):
        await silent
    await sub.unsubscribe()
    assert not js._waiting  # nothing left behind
