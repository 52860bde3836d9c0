"""Group commit by JetStream atomic batch: does one commit cost one fsync?

With ``sync_interval: always`` the server fsyncs every message it stores, and one stream's
writes are synced one after another (``python -m bench fsync``). If an atomic batch
(ADR-50: ``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit``) were synced
once at its commit, several runs' appends sent as one batch would multiply the run logs'
fsynced throughput. This measures it on a fresh embedded server: publish-acks of
run-log-sized messages, each to its own subject and guarded by
``Nats-Expected-Last-Subject-Sequence`` as a run-log append is, sent one by one or in
atomic batches of 2, 8 and 32, with the same number of messages in flight (at most 50
batches, the server's limit per stream). It then checks the semantics an append path
would rely on: a per-message subject-sequence check inside a batch, what a failed check
does to the rest of the batch, one subject checked twice in a batch, a message id inside a
batch, and the size limit.

    python -m bench batch [--writes 2000] [--in-flight 200] [--sync always|default]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client

from interlock.runtime.embedded import EmbeddedNats

PAYLOAD = b"x" * 400
SIZES = (1, 2, 8, 32, 100)
STREAM = "GC"
MAX_BATCHES_IN_FLIGHT = 50
"""The server's limit of open atomic batches per stream."""


class _Acks:
    """Publish-acks on one wildcard subscription, told apart by a counter."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox()
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.count = itertools.count()

    async def start(self) -> None:
        await self.nc.subscribe(self.inbox + ".*", cb=self._on_ack)

    async def _on_ack(self, msg: Any) -> None:
        future = self.waiting.pop(msg.subject.rsplit(".", 1)[1], None)
        if future is not None and not future.done():
            future.set_result(json.loads(msg.data) if msg.data else {})

    async def send(self, messages: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
        """Publish ``messages`` (subject, headers): alone, or as one atomic batch."""
        batch = uuid.uuid4().hex if len(messages) > 1 else ""
        last = len(messages) - 1
        for index, (subject, headers) in enumerate(messages):
            hdrs = dict(headers)
            if batch:
                hdrs["Nats-Batch-Id"] = batch
                hdrs["Nats-Batch-Sequence"] = str(index + 1)
            if index < last:
                await self.nc.publish(subject, PAYLOAD, headers=hdrs)
                continue
            if batch:
                hdrs["Nats-Batch-Commit"] = "1"
            token = str(next(self.count))
            future = asyncio.get_running_loop().create_future()
            self.waiting[token] = future
            await self.nc.publish(subject, PAYLOAD, reply=f"{self.inbox}.{token}", headers=hdrs)
            return await asyncio.wait_for(future, 10)
        raise AssertionError("unreachable")


async def _rate(acks: _Acks, size: int, writes: int, in_flight: int, tag: str) -> float:
    """Messages stored per second, sent in batches of ``size`` to fresh subjects."""
    batches = writes // size
    slots = asyncio.Semaphore(max(1, min(in_flight // size, MAX_BATCHES_IN_FLIGHT)))
    last: dict[str, int] = {}

    async def one(b: int) -> None:
        async with slots:
            subjects = [f"gc.{tag}.{(b * size + i) % 400}" for i in range(size)]
            messages = [
                (s, {"Nats-Expected-Last-Subject-Sequence": str(last.get(s, 0))}) for s in subjects
            ]
            # A subject is in at most one open batch: the same 400 subjects rotate.
            for s in subjects:
                last[s] = -1
            ack = await acks.send(messages)
            if "error" in ack:
                raise RuntimeError(f"batch of {size} refused: {ack['error']}")
            for i, s in enumerate(subjects):
                last[s] = ack["seq"] - size + 1 + i

    # Subjects are reused only once their previous batch is acknowledged.
    started = time.perf_counter()
    done = 0
    while done < batches:
        wave = min(batches - done, 400 // size)
        await asyncio.gather(*(one(done + b) for b in range(wave)))
        done += wave
    return batches * size / (time.perf_counter() - started)


async def _semantics(acks: _Acks) -> dict[str, str]:
    """What the append path would rely on, each answered by the server."""
    nc = acks.nc
    found: dict[str, str] = {}
    x = "Nats-Expected-Last-Subject-Sequence"

    async def last_seq(subject: str) -> int:
        reply = await nc.request(
            f"$JS.API.STREAM.MSG.GET.{STREAM}",
            json.dumps({"last_by_subj": subject}).encode(),
            timeout=5,
        )
        body = json.loads(reply.data)
        return int(body["message"]["seq"]) if "message" in body else 0

    ack = await acks.send([("gc.sem.a", {x: "0"}), ("gc.sem.b", {x: "0"}), ("gc.sem.c", {x: "0"})])
    found["per-message checks, all pass"] = json.dumps(ack)
    a = await last_seq("gc.sem.a")
    ack = await acks.send(
        [("gc.sem.a", {x: str(a)}), ("gc.sem.b", {x: "1"}), ("gc.sem.d", {x: "0"})]
    )
    stored = [s for s in ("gc.sem.a", "gc.sem.d") if await last_seq(s) > a]
    found["one check fails (b)"] = f"{json.dumps(ack)}; others stored: {stored or 'none'}"
    ack = await acks.send([("gc.sem.t", {x: "0"}), ("gc.sem.t", {x: "0"})])
    found["one subject twice, each expecting it empty"] = json.dumps(ack)
    ack = await acks.send(
        [("gc.sem.e", {"Nats-Msg-Id": "m1"}), ("gc.sem.f", {"Nats-Msg-Id": "m2"})]
    )
    found["message ids in a batch"] = json.dumps(ack)
    ack = await acks.send([("gc.sem.g", {"Nats-Msg-Id": "m1"}), ("gc.sem.h", {})])
    found["a duplicate message id in a batch"] = json.dumps(ack)
    ack = await acks.send([(f"gc.lim.{i}", {}) for i in range(1000)])
    found["1000 messages"] = json.dumps(ack)
    ack = await acks.send([(f"gc.lim.{i}", {}) for i in range(1001)])
    found["1001 messages"] = json.dumps(ack)
    return found


async def run(writes: int, in_flight: int, sync: str) -> tuple[dict[int, float], dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="interlock-batch-bench-") as tmp:
        config = Path(tmp) / "batch.conf"
        config.write_text(
            "jetstream {\n  sync_interval: always\n}\n" if sync == "always" else "jetstream {}\n"
        )
        server = EmbeddedNats(Path(tmp) / "nats", args=("-c", str(config)))
        server.start()
        nc = await nats.connect(server.url)
        try:
            stream = {
                "name": STREAM,
                "subjects": ["gc.>"],
                "storage": "file",
                "allow_atomic": True,
                "allow_direct": True,
            }
            reply = await nc.request(
                f"$JS.API.STREAM.CREATE.{STREAM}", json.dumps(stream).encode(), timeout=5
            )
            if "error" in json.loads(reply.data):
                raise RuntimeError(reply.data.decode())
            acks = _Acks(nc)
            await acks.start()
            semantics = await _semantics(acks)
            rates: dict[int, float] = {}
            for round_ in range(2):  # the second pass is reported
                for size in SIZES:
                    rates[size] = await _rate(acks, size, writes, in_flight, f"r{round_}s{size}")
            return rates, semantics
        finally:
            await nc.close()
            server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench batch", description=__doc__.split("\n")[0])
    p.add_argument("--writes", type=int, default=2000, help="messages per measurement")
    p.add_argument("--in-flight", type=int, default=200, help="messages awaiting their ack")
    p.add_argument("--sync", choices=("always", "default"), default="always")
    args = p.parse_args(argv)
    rates, semantics = asyncio.run(run(args.writes, args.in_flight, args.sync))
    print(f"stored messages per second, sync_interval {args.sync}, {args.in_flight} in flight")
    for size, rate in rates.items():
        shape = "one by one" if size == 1 else f"batches of {size}"
        print(f"  {shape:>14}: {rate:8,.0f}/s  {rate / rates[1]:.2f}x")
    print("atomic batch semantics")
    for what, answer in semantics.items():
        print(f"  {what}: {answer}")
    return 0
