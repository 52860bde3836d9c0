"""Fsynced writes per second by how many streams and connections they go through.

With ``sync_interval: always`` the server fsyncs every stored message. This measures, on a
fresh embedded server with that setting, publish-acks of run-log-sized messages with
``--in-flight`` outstanding, spread over 1 or 4 streams and 1 or 4 connections. It is the
ceiling behind Interlock's figures with every write fsynced: the writes of one stream are
synced one after another (more connections do not help), while writes to different streams
are synced side by side. A run appends to one stream (the run logs) three times in the
approval workload, so that stream's rate divided by three caps the runs per second.

    python -m bench fsync [--writes 3000] [--in-flight 200]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client

from interlock.runtime.embedded import EmbeddedNats

PAYLOAD = b"x" * 400
SHAPES = ((1, 1), (4, 1), (1, 4), (4, 4))
"""(streams, connections) measured, in this order, twice (the second pass is reported)."""


async def _rate(ncs: list[Client], streams: int, writes: int, in_flight: int) -> float:
    contexts = [nc.jetstream() for nc in ncs]
    slots = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with slots:
            await contexts[i % len(contexts)].publish(f"fs{i % streams}.r{i % 97}", PAYLOAD)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(writes)))
    return writes / (time.perf_counter() - started)


async def run(writes: int, in_flight: int) -> dict[tuple[int, int], float]:
    with tempfile.TemporaryDirectory(prefix="interlock-fsync-bench-") as tmp:
        config = Path(tmp) / "fsync.conf"
        config.write_text("jetstream {\n  sync_interval: always\n}\n")
        server = EmbeddedNats(Path(tmp) / "nats", args=("-c", str(config)))
        server.start()
        ncs: list[Client] = []
        try:
            ncs = [await nats.connect(server.url) for _ in range(4)]
            js = ncs[0].jetstream()
            for n in range(4):
                await js.add_stream(name=f"FS{n}", subjects=[f"fs{n}.>"])
            found: dict[tuple[int, int], float] = {}
            for _ in range(2):
                for streams, conns in SHAPES:
                    found[(streams, conns)] = await _rate(ncs[:conns], streams, writes, in_flight)
            return found
        finally:
            for nc in ncs:
                await nc.close()
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench fsync", description=__doc__.split("\n")[0])
    p.add_argument("--writes", type=int, default=3000, help="writes per measurement")
    p.add_argument("--in-flight", type=int, default=200, help="publishes awaiting their ack")
    args = p.parse_args(argv)
    found = asyncio.run(run(args.writes, args.in_flight))
    one = found[(1, 1)]
    print(f"fsynced writes per second ({args.in_flight} in flight, sync_interval: always)")
    for (streams, conns), rate in found.items():
        print(f"  {streams} stream(s), {conns} connection(s): {rate:8,.0f}/s  {rate / one:.2f}x")
    return 0
