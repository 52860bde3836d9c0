"""Reading a durable consumer in batches with a pull request kept open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.natsclient import direct_subscriber
from interlock.transport.pulling import BatchReader, deliveries, subject_matcher, subject_matches
from interlock.transport.subjects import Subjects


@pytest.fixture(params=["nats-py", "interlock"])
async def nc(request: pytest.FixtureRequest, nats_url: str) -> AsyncIterator[Client]:
    """Both ways deliveries reach a reader: through a nats-py subscription's queue and
    task, and (Interlock's client) handed over from the connection's read loop."""
    if request.param == "interlock":
        client: Client = await connect(ConnectOptions.resolve(nats_url, name="pulling test"))
        assert direct_subscriber(client) is not None
    else:
        client = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
        assert direct_subscriber(client) is None
    try:
        yield client
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("il.runs.>", "il.runs.r1", True),
        ("il.runs.>", "il.runs", False),
        ("il.runs.>", "il.events.r1", False),
        ("il.*.r1", "il.runs.r1", True),
        ("il.*.r1", "il.runs.r2", False),
        ("il.*", "il.runs.r1", False),
        ("il.cap.echo", "il.cap.echo", True),
        ("il.cap.echo", "il.cap.echo2", False),
    ],
)
def test_subject_filters(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches
    assert subject_matcher(pattern)(subject) is matches


_TOKENS = st.lists(st.sampled_from(["il", "runs", "r1", "", "*", ">", "a.b"]), max_size=4)


@given(_TOKENS, _TOKENS)
def test_a_filter_looked_at_once_matches_as_it_did(pattern: list[str], subject: list[str]) -> None:
    p, s = ".".join(pattern), ".".join(subject)
    assert subject_matcher(p)(s) is subject_matches(p, s)


async def consumer(nc: Client, subjects: Subjects, name: str) -> tuple[str, str]:
    js = nc.jetstream()
    stream, filter_subject = f"{subjects.prefix}_PULL", f"{subjects.prefix}.pull.>"
    await js.add_stream(StreamConfig(name=stream, subjects=[filter_subject]))
    await js.add_consumer(
        stream,
        ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT, ack_wait=30),
    )
    return stream, filter_subject


async def consumer_state(nc: Client, stream: str, name: str, ready: Any, what: str) -> None:
    """Wait until the consumer's info satisfies ``ready`` (the server has delivered what
    a reader asked for): a condition to wait on, not a sleep."""
    js = nc.jetstream()
    deadline = asyncio.get_running_loop().time() + 5
    while not ready(info := await js.consumer_info(stream, name)):
        assert asyncio.get_running_loop().time() < deadline, f"{name}: never {what}: {info}"
        await asyncio.sleep(0.02)


def reader(nc: Client, stream: str, name: str, filter_subject: str, size: int) -> BatchReader:
    async def ensure() -> None:
        return None

    return BatchReader(
        nc, stream=stream, consumer=name, filter_subject=filter_subject, size=size, ensure=ensure
    )


async def test_batches_hold_at_most_size_messages_and_all_arrive_once(
    nc: Client, subjects: Subjects
) -> None:
    stream, filter_subject = await consumer(nc, subjects, "batches")
    js = nc.jetstream()
    for i in range(50):
        await js.publish(f"{subjects.prefix}.pull.{i}", str(i).encode())
    stopping = asyncio.Event()
    seen: list[bytes] = []
    sizes: list[int] = []

    async def read() -> None:
        async for msgs in reader(nc, stream, "batches", filter_subject, 8).batches(stopping):
            sizes.append(len(msgs))
            for msg in msgs:
                assert deliveries(msg) == msg.metadata.num_delivered == 1
                seen.append(msg.data)
                await msg.ack()
            if len(seen) == 50:
                stopping.set()

    await asyncio.wait_for(read(), 10)
    assert sorted(seen, key=int) == [str(i).encode() for i in range(50)]
    assert max(sizes) <= 8


async def test_stopping_hands_back_what_was_buffered(nc: Client, subjects: Subjects) -> None:
    """Messages that arrived after the last batch go back at once (nak), not after ack_wait."""
    stream, filter_subject = await consumer(nc, subjects, "handback")
    js = nc.jetstream()
    for i in range(5):
        await js.publish(f"{subjects.prefix}.pull.{i}", str(i).encode())
    stopping = asyncio.Event()
    handled = 0
    async for msgs in reader(nc, stream, "handback", filter_subject, 5).batches(stopping):
        for msg in msgs:
            await msg.ack()
        handled += len(msgs)
        # The others arrive meanwhile (none is left at the server), and wait in the buffer.
        await consumer_state(
            nc, stream, "handback", lambda i: i.num_pending == 0, "delivered them all"
        )
        stopping.set()
    assert handled < 5
    # A second reader gets the others at once (ack_wait is 30 s), delivered a second time.
    again: list[int] = []
    stopping2 = asyncio.Event()

    async def read() -> None:
        async for msgs in reader(nc, stream, "handback", filter_subject, 5).batches(stopping2):
            for msg in msgs:
                again.append(deliveries(msg))
                assert deliveries(msg) == msg.metadata.num_delivered
                await msg.ack()
            if handled + len(again) == 5:
                stopping2.set()

    await asyncio.wait_for(read(), 5)
    assert again == [2] * (5 - handled)


async def test_a_stop_ends_a_reader_waiting_for_messages(nc: Client, subjects: Subjects) -> None:
    """Nothing to read, a pull request open: setting the stop flag ends the batches."""
    stream, filter_subject = await consumer(nc, subjects, "idle")
    stopping = asyncio.Event()
    batches: list[list[Any]] = []

    async def read() -> None:
        async for msgs in reader(nc, stream, "idle", filter_subject, 5).batches(stopping):
            batches.append(msgs)

    task = asyncio.create_task(read())
    await consumer_state(nc, stream, "idle", lambda i: i.num_waiting == 1, "been pulled from")
    stopping.set()
    await asyncio.wait_for(task, 5)
    assert batches == []


async def test_a_reader_whose_pull_loop_ends_raises_what_ended_it(
    nc: Client, subjects: Subjects
) -> None:
    """The consumer deleted under an open pull, and making it again failing: the pull
    loop ends, and so does the reader waiting for messages, with that error."""
    stream, filter_subject = await consumer(nc, subjects, "ends")

    async def ensure() -> None:
        raise RuntimeError("cannot make the consumer")

    async def read() -> None:
        reader_ = BatchReader(
            nc, stream=stream, consumer="ends", filter_subject=filter_subject, size=5, ensure=ensure
        )
        async for _ in reader_.batches(asyncio.Event()):
            pass

    task = asyncio.create_task(read())
    await consumer_state(nc, stream, "ends", lambda i: i.num_waiting == 1, "been pulled from")
    await nc.jetstream().delete_consumer(stream, "ends")
    with pytest.raises(RuntimeError, match="cannot make the consumer"):
        await asyncio.wait_for(task, 5)


async def test_a_reader_cancelled_mid_batch_stops_at_once_and_hands_messages_back(
    nc: Client, subjects: Subjects
) -> None:
    """Cancelled while handling a batch, even twice in a row (a loop shutting down cancels
    every task), the consuming task ends promptly and nothing is left to wait out
    ack_wait."""
    stream, filter_subject = await consumer(nc, subjects, "cancelled")
    js = nc.jetstream()
    for i in range(5):
        await js.publish(f"{subjects.prefix}.pull.{i}", str(i).encode())
    got_batch = asyncio.Event()

    async def consume() -> None:
        reader_ = reader(nc, stream, "cancelled", filter_subject, 5)
        async with contextlib.aclosing(reader_.batches(asyncio.Event())) as batches:
            async for msgs in batches:
                for msg in msgs:
                    await msg.nak()  # not handled: handed back by the handler itself
                got_batch.set()
                await asyncio.Event().wait()  # stuck in the handler

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_batch.wait(), 5)
    # The reader's pull request is answered: what it asked for is in its buffer.
    await consumer_state(
        nc, stream, "cancelled", lambda i: i.num_waiting == 0, "answered the pull request"
    )
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # again, while it is cleaning up
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "the consuming task did not end"
    # Everything is available again at once: a second reader gets all five.
    seen: set[bytes] = set()
    stopping = asyncio.Event()

    async def read() -> None:
        async for msgs in reader(nc, stream, "cancelled", filter_subject, 5).batches(stopping):
            for msg in msgs:
                seen.add(msg.data)
                await msg.ack()
            if len(seen) == 5:
                stopping.set()

    await asyncio.wait_for(read(), 5)
