"""An agent's flood of heartbeats, as it would send it: its own credential (as ``interlock
creds issue agent`` makes it) and plain nats-py, puts under its own capability's keys in
the workers bucket, each with an instance name of its choosing and as many bytes as a
message takes. A listing of workers (``interlock agents``, ``GET /agents``) reads the
whole bucket: unbounded, one agent's flood made each as large as the flood, for the 15 s
its keys live. The bucket takes no heartbeat over 64 KiB and holds 64 MiB at most (1 MiB
here): past that, puts are refused until keys expire, and a listing reads no more than
that. The orchestrator's metrics, every 10 s, read it a bounded batch at a time and count
at most so many workers of a capability, decoding no more of its heartbeats past that:
the flood costs them a batch, not the bucket, and counts another capability's workers
right."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from interlock.auth.roles import Role
from interlock.runtime import buckets
from interlock.runtime.cluster_metrics import ClusterMetrics
from interlock.transport import kvread, streamconfigs
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOUND = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def small_bucket() -> Iterator[None]:
    """The workers bucket made with a bound of 1 MiB (where 64 MiB), so that the flood
    that fills it is small."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streamconfigs, "WORKERS_MAX_BYTES", BOUND)
        yield


def heartbeat(instance: str, size: int) -> bytes:
    record = {
        "name": "flood",
        "instance": instance,
        "capabilities": ["held"],
        "concurrency": 1,
        "in_flight": 0,
        "started_at": "2026-01-01T00:00:00Z",
        "heartbeat_at": "2026-01-01T00:00:00Z",
        "padding": "x" * size,
    }
    return json.dumps(record).encode()


async def test_a_flood_of_heartbeats_is_bounded(secured: Secured) -> None:
    creds = secured.issue(Role("agent", capabilities=("held",)), "flooding-agent")
    nc = await plain_client(secured.url, creds, Refusals())
    bucket = SUBJECTS.workers_bucket
    try:
        js = nc.jetstream()
        # One heartbeat larger than a heartbeat may be: refused, nothing stored.
        with pytest.raises(Exception, match=r"(?i)message size exceeds maximum"):
            await js.publish(f"$KV.{bucket}.held.huge", heartbeat("huge", 100_000))
        # Heartbeats of 60 kB under new instance names until the bucket is full.
        refused = None
        for n in range(2 * BOUND // 60_000):
            try:
                await js.publish(f"$KV.{bucket}.held.i{n}", heartbeat(f"i{n}", 60_000))
            except Exception as exc:  # noqa: BLE001 (the refusal is the point)
                refused = exc
                break
    finally:
        await nc.close()
    assert refused is not None, "the bucket took twice its bound"
    assert "maximum bytes exceeded" in str(refused).lower(), refused
    info = await secured.operator.nc.jetstream().stream_info(f"KV_{bucket}")
    assert info.state.bytes <= BOUND
    # What a listing reads is that much at most, and the flood's workers are listed.
    workers = (await secured.operator.agents())["workers"]
    flood = [w for w in workers if w.get("name") == "flood"]
    assert 0 < len(flood) <= BOUND // 60_000
    assert not any(w.get("instance") == "huge" for w in workers)


COUNTED = 50
"""Workers of one capability the metrics count at most, here (10,000 by default)."""


def workers_gauge(metrics: ClusterMetrics) -> dict[str, float]:
    [family] = [f for f in metrics.collect() if f.name == "interlock_capability_workers"]
    return {sample.labels["capability"]: sample.value for sample in family.samples}


async def peak_of_a_poll(metrics: ClusterMetrics) -> int:
    tracemalloc.start()
    try:
        await metrics.poll()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_the_metrics_count_a_flood_a_batch_at_a_time(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvread, "SCAN_BYTES", 16 * 1024)
    monkeypatch.setattr(buckets, "MAX_COUNTED", COUNTED)
    decoded = 0
    decode = buckets.decode_json

    def counting(value: bytes, what: str) -> Any:
        nonlocal decoded
        decoded += 1
        return decode(value, what)

    monkeypatch.setattr(buckets, "decode_json", counting)
    bucket = SUBJECTS.workers_bucket
    js = secured.operator.nc.jetstream()
    # Another test's flood of the same keys may still fill the bucket: gone first.
    await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.held.>")
    metrics = ClusterMetrics(secured.operator.js, SUBJECTS, registry=None)
    await metrics.poll()  # its handles bound
    before = await peak_of_a_poll(metrics)
    creds = secured.issue(Role("agent", capabilities=("held",)), "counted-agent")
    nc = await plain_client(secured.url, creds, Refusals())
    flood = 0
    try:
        agent = nc.jetstream()
        for n in range(2_000):  # small heartbeats, each a worker of its own
            try:
                await agent.publish(f"$KV.{bucket}.held.c{n}", heartbeat(f"c{n}", 100))
            except Exception:  # noqa: BLE001 (the bucket is full: flood enough)
                break
            flood += 1
    finally:
        await nc.close()
    assert flood > 10 * COUNTED
    stored = (await js.stream_info(f"KV_{bucket}")).state.bytes
    # The other workers, as a listing (which reads the whole bucket) counts them.
    listed: dict[str, int] = {}
    for worker in (await secured.operator.agents())["workers"]:
        for capability in worker["capabilities"]:
            listed[capability] = listed.get(capability, 0) + 1
    assert listed["held"] >= flood
    decoded = 0
    during = await peak_of_a_poll(metrics)
    counted = workers_gauge(metrics)
    assert counted.pop("held") == COUNTED
    assert counted == {c: n for c, n in listed.items() if c != "held"}
    assert counted, "no reference agent's workers counted"
    # Each heartbeat of the flood past the count was skipped undecoded.
    assert decoded <= COUNTED + sum(counted.values()) + 5, decoded
    # What the flood added to a poll's peak is a batch, not the bucket (read whole: 3.2 MB
    # more for 0.7 MB stored, measured).
    assert during - before < stored / 2, f"{during:,} at the peak, {before:,} before, {stored:,}"
