"""The floor every runtime figure is compared with: raw nats-py against the same server.

Two numbers, measured in the same run as the runtime benchmarks because the machines are
shared and noisy: the pipelined publish-with-ack rate (windows of ``window`` publishes in
flight, then wait for all their acks) into a file-storage stream, and the round trip of
one publish-with-ack at a time.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig

STREAM = "BENCH_RAW"
SUBJECT = "bench.raw"
# About the size of an encoded run-log record.
PAYLOAD = b"x" * 400


@dataclass(frozen=True, slots=True)
class Baseline:
    """Raw JetStream figures on this machine, now."""

    pipelined_per_s: float
    """Publishes acknowledged per second with ``window`` in flight."""
    window: int
    pipelined_count: int
    roundtrip_p50_s: float
    """One publish-with-ack at a time: the median round trip."""
    roundtrip_p99_s: float
    sequential_per_s: float
    sequential_count: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _ensure_stream(nc: Client) -> None:
    js = nc.jetstream()
    config = StreamConfig(name=STREAM, subjects=[f"{SUBJECT}.>"], storage=StorageType.FILE)
    await js.add_stream(config)


async def pipelined_rate(nc: Client, *, count: int = 20_000, window: int = 500) -> float:
    """Publishes acknowledged per second, ``window`` at a time, into a file stream."""
    js = nc.jetstream()
    subject = f"{SUBJECT}.pipelined"
    # Warm the connection and the stream's files first.
    await asyncio.gather(*(js.publish(subject, PAYLOAD) for _ in range(window)))
    windows = max(count // window, 1)
    started = time.perf_counter()
    for _ in range(windows):
        await asyncio.gather(*(js.publish(subject, PAYLOAD) for _ in range(window)))
    return windows * window / (time.perf_counter() - started)


async def roundtrips(nc: Client, *, count: int = 2_000) -> list[float]:
    """Seconds of each of ``count`` publish-with-ack calls made one after another."""
    js = nc.jetstream()
    subject = f"{SUBJECT}.sequential"
    for _ in range(50):
        await js.publish(subject, PAYLOAD)
    out: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        await js.publish(subject, PAYLOAD)
        out.append(time.perf_counter() - t0)
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(min(round(q * len(ordered) + 0.5) - 1, len(ordered) - 1), 0)
    return ordered[rank]


async def measure(
    nc: Client, *, pipelined: int = 20_000, window: int = 500, sequential: int = 2_000
) -> Baseline:
    """Both baseline figures, against a stream of our own (removed afterwards)."""
    await _ensure_stream(nc)
    try:
        rate = await pipelined_rate(nc, count=pipelined, window=window)
        trips = await roundtrips(nc, count=sequential)
    finally:
        await nc.jetstream().delete_stream(STREAM)
    return Baseline(
        pipelined_per_s=rate,
        window=window,
        pipelined_count=pipelined,
        roundtrip_p50_s=statistics.median(trips),
        roundtrip_p99_s=percentile(trips, 0.99),
        sequential_per_s=len(trips) / sum(trips),
        sequential_count=len(trips),
    )


async def _main(url: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        baseline = await measure(nc)
    finally:
        await nc.close()
    print(
        f"pipelined publish-ack (window {baseline.window}): {baseline.pipelined_per_s:,.0f}/s; "
        f"sequential round trip p50 {baseline.roundtrip_p50_s * 1e6:.0f} us "
        f"({baseline.sequential_per_s:,.0f}/s)"
    )


if __name__ == "__main__":
    import sys
    import tempfile

    from interlock.runtime.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(tmp) as server:
        asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else server.url))
