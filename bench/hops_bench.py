"""Where the milliseconds of one run go: every message on the wire, timed, run by run.

Starts a fresh embedded nats-server (``--fsync always``: every write fsynced), applies the
approval workflow of ``bench/peers`` (review, CEL guard, merge), runs ``interlock serve``
and its worker (``interlock agent run``) as processes of their own, and sends runs one
after another as ``bench/peers/interlock_bench.py`` does (a trigger CloudEvent in,
completion seen on the run log). A second connection of this process subscribes to every
subject (``>``): the trigger, each run-log append and its publish-ack, each task, each
answer request and its reply, each consumer's fetch requests and acks, each key-value
write. For each kind of message (the k-th of its kind within a run) it prints the median
time since the trigger was published, and the step from the line before, so the critical
path of a run reads top to bottom. The subscriber costs the server a copy of every
message: absolute figures run a little above the peers benchmark's.

    python -m bench hops [--runs 200] [--fsync always]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nats
from nats.aio.msg import Msg

from bench.peers.interlock_bench import trigger
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect

PEERS = Path(__file__).resolve().parent / "peers"
MANIFEST = PEERS / "interlock_approval.yaml"
SOURCE = "bench://hops"


def label(msg: Msg) -> str:
    """What a message is, in a few words (its kind, not its run)."""
    s = msg.subject
    parts = s.split(".")
    headers = msg.headers or {}
    if parts[1:2] == ["events"]:
        return "trigger event published"
    if parts[1:2] == ["runs"]:
        try:
            kinds = [r["type"].rsplit(".", 2)[-2:] for r in json.loads(msg.data)]
            return "append " + ",".join(".".join(k) for k in kinds)
        except (ValueError, KeyError, TypeError):
            return "append"
    if parts[1:2] == ["cap"]:
        return f"task {parts[2]} published"
    if parts[1:2] == ["answer"]:
        return f"answer {parts[2]} requested"
    if parts[1:2] == ["results"]:
        return f"answer {parts[2]} to results stream"
    if s.startswith("$JS.ACK."):
        return f"ack by consumer {parts[3]}"
    if s.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return f"fetch by consumer {parts[-1]}"
    if s.startswith("$JS.API.DIRECT.GET"):
        return "direct get"
    if s.startswith("$JS.API."):
        return " ".join(parts[2:5]).lower()
    if s.startswith("$KV."):
        return f"kv write {parts[1]}"
    if "Interlock-Answer" in headers:
        return "answer replied"
    if msg.data.startswith(b'{"stream"'):
        try:
            return f"publish-ack {json.loads(msg.data)['stream']}"
        except (ValueError, KeyError):
            return "publish-ack"
    return "reply" if s.startswith("_INBOX") else ".".join(parts[:3])


def run(runs: int, fsync: bool) -> list[tuple[str, float, float, int]]:
    with tempfile.TemporaryDirectory(prefix="interlock-hops-") as tmp:
        args: tuple[str, ...] = ()
        if fsync:
            config = Path(tmp) / "server.conf"
            config.write_text("jetstream {\n  sync_interval: always\n}\n")
            args = ("-c", str(config))
        server = EmbeddedNats(Path(tmp) / "nats", args=args)
        server.start()
        bindir = Path(sys.executable).parent
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
        env["PYTHONPATH"] = str(PEERS)
        url = server.url
        procs: list[subprocess.Popen[bytes]] = []
        try:
            subprocess.run(
                [str(bindir / "interlock"), "apply", str(MANIFEST), "--server", url],
                check=True,
                capture_output=True,
                env=env,
            )
            for cmd in (
                ["serve", "--metrics-port", "0"],
                ["agent", "run", "interlock_worker:worker", "--metrics-port", "0"],
            ):
                procs.append(
                    subprocess.Popen(
                        [
                            str(bindir / "interlock"),
                            *cmd,
                            "--server",
                            url,
                            "--log-level",
                            "warning",
                        ],
                        env=env,
                        cwd=PEERS,
                        stdout=subprocess.DEVNULL,
                    )
                )
            return asyncio.run(_measure(url, runs))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
            server.stop()


async def _measure(url: str, runs: int) -> list[tuple[str, float, float, int]]:
    opts = ConnectOptions.resolve(url, name="hops driver")
    nc = await connect(opts)
    spy = await nats.connect(url, name="hops spy")
    client = InterlockClient(nc, opts.subjects)
    seen: list[tuple[float, str]] = []
    done: dict[str, asyncio.Future[None]] = {}

    async def on_any(msg: Msg) -> None:
        seen.append((time.perf_counter(), label(msg)))

    async def on_run(msg: Msg) -> None:
        if b"run.completed" in msg.data:
            future = done.get(msg.subject.removeprefix(runs_prefix))
            if future is not None and not future.done():
                future.set_result(None)

    runs_prefix = opts.subjects.runs_all[:-1]  # "<prefix>.runs."
    await spy.subscribe(">", cb=on_any, pending_msgs_limit=-1, pending_bytes_limit=-1)
    await nc.subscribe(opts.subjects.runs_all, cb=on_run)
    definition, _ = await client.registry.latest("approval")
    session = f"{os.getpid()}x{int(time.time())}"
    timelines: list[list[tuple[float, str]]] = []
    try:
        for i in range(-20, runs):  # 20 warm-up runs, not counted
            key = f"{session}-{i}"
            run_id = derive_run_id(definition, SOURCE, key)
            done[run_id] = asyncio.get_running_loop().create_future()
            await asyncio.sleep(0.05)  # what the last run wrote behind is out of the way
            del seen[:]
            started = time.perf_counter()
            await client.emit(trigger(key, i, SOURCE))
            try:  # the first run waits for the processes to start
                await asyncio.wait_for(done[run_id], 90 if i == -20 else 30)
            except TimeoutError:
                kinds = Counter(what for _, what in seen)
                raise RuntimeError(f"run {run_id} did not complete; seen: {kinds}") from None
            del done[run_id]
            ended = time.perf_counter()
            await spy.flush()
            if i >= 0:
                timelines.append(
                    [(t - started, what) for t, what in seen if t <= ended]
                    + [(ended - started, "completion seen by the driver")]
                )
    finally:
        await nc.close()
        await spy.close()
    by_kind: dict[tuple[str, int], list[float]] = {}
    for timeline in timelines:
        counts: Counter[str] = Counter()
        for t, what in timeline:
            counts[what] += 1
            by_kind.setdefault((what, counts[what]), []).append(t * 1000)
    rows = [
        (what if k == 1 else f"{what} #{k}", statistics.median(ts), len(ts))
        for (what, k), ts in by_kind.items()
        if len(ts) >= len(timelines) // 2  # in most runs: the critical path, not strays
    ]
    rows.sort(key=lambda row: row[1])
    out: list[tuple[str, float, float, int]] = []
    before = 0.0
    for what, at, count in rows:
        out.append((what, at, at - before, count))
        before = at
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench hops", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=200, help="runs one after another")
    p.add_argument("--fsync", choices=("always", "default"), default="default")
    args = p.parse_args(argv)
    started = time.time()
    rows = run(args.runs, args.fsync == "always")
    load = os.getloadavg()[0]
    print(
        f"one run's messages, median ms after the trigger ({args.runs} runs one after another,"
        f" sync_interval {args.fsync}, load average {load:.1f}, {time.time() - started:.0f} s)"
    )
    print(f"  {'message':<52} {'at':>7} {'step':>7}  runs")
    for what, at, step, count in rows:
        print(f"  {what:<52} {at:7.2f} {step:+7.2f}  {count}")
    return 0
