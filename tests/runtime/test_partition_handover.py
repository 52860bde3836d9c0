"""A dead replica's partitions taken before its leases expire, and what it had in hand
handed out again at once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from interlock.runtime.client import InterlockClient
from interlock.runtime.ownership import GONE_AFTER_S, Ownership, owners, redeliver_now
from interlock.transport.subjects import Subjects
from support.runtime import connect

LONG_TTL = 60  # seconds: no lease expires in these tests


async def _rounds(replicas: list[Ownership], until: float) -> None:
    while time.monotonic() < until:
        for replica in replicas:
            await replica.round(6)
        await asyncio.sleep(0.1)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_replica_whose_connection_is_gone_loses_its_partitions_before_its_leases_expire(
    nats_url: str, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="interlock.orchestrator")
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    nc, own = client.nc, await connect(nats_url)
    a, b = (Ownership(nc, subjects, name, ttl=LONG_TTL) for name in ("a", "b"))
    c = Ownership(own, subjects, "c", ttl=LONG_TTL)
    for _ in range(4):
        for replica in (a, b, c):
            await replica.round(6)
    assert sorted(len(r.held) for r in (a, b, c)) == [2, 2, 2]
    lost = set(c.held)
    # c stops renewing but is connected (paused, busy): it answers, so it is not gone and
    # keeps its partitions until its leases expire.
    await _rounds([a, b], time.monotonic() + 2 * GONE_AFTER_S)
    assert not a.gone
    assert not b.gone
    assert not (lost & (set(a.held) | set(b.held)))
    # c's connection is gone (killed): found so twice, a second apart, and its partitions
    # are taken long before its leases would expire.
    await own.close()
    began = time.monotonic()
    while set(a.held) | set(b.held) != set(range(6)):
        assert time.monotonic() - began < LONG_TTL / 3, "the dead replica's partitions stayed"
        await _rounds([a, b], time.monotonic() + 0.25)
    assert not (set(a.held) & set(b.held))
    assert "c" in a.gone
    assert "c" in b.gone
    held = await owners(nc, subjects)
    assert set(held.values()) == {"a", "b"}
    taken = [r.getMessage() for r in caplog.records if "from c, gone" in r.getMessage()]
    assert len(taken) == len(lost), taken
    assert all("with 2 live replicas" in m for m in taken), taken
    assert {p for p in lost if any(f"partition {p}: lease taken" in m for m in taken)} == lost
    await nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_what_the_last_reader_had_in_hand_is_handed_out_again_at_once(
    nats_url: str, subjects: Subjects
) -> None:
    nc, gone = await connect(nats_url), await connect(nats_url)
    js = nc.jetstream()
    stream = f"{subjects.prefix}_HANDOVER"
    await js.add_stream(name=stream, subjects=[f"{subjects.prefix}.handover.>"])
    for i in range(5):
        await js.publish(f"{subjects.prefix}.handover.{i}", str(i).encode())
    # An ack wait no test waits out: what comes again, comes by the reset.
    config = ConsumerConfig(durable_name="relay", ack_policy=AckPolicy.EXPLICIT, ack_wait=600)
    await js.add_consumer(stream, config)
    assert await redeliver_now(nc, stream) == 0  # nothing in hand: nothing to do
    last = await gone.jetstream().pull_subscribe_bind("relay", stream)
    had = await last.fetch(3, timeout=5)
    await had[0].ack_sync()
    await gone.close()  # the last reader dies with two messages in hand
    assert await redeliver_now(nc, stream) == 2
    reader = await js.pull_subscribe_bind("relay", stream)
    got = await reader.fetch(4, timeout=5)
    assert [m.data for m in got] == [b"1", b"2", b"3", b"4"]
    for msg in got:
        await msg.ack_sync()
    info = await js.consumer_info(stream, "relay")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)
    await js.delete_stream(stream)
    await nc.close()
