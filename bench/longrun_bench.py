"""``python -m bench longrun``: what one event costs a run as its log grows.

Three runs of one workflow (a waiting state that takes a ``tick`` event and loops back to
itself) are given 100, 10,000 and 100,000 records (appended as the orchestrator decides
them, snapshots written as it writes them). Then a real ``interlock serve`` takes signals
through the client (what ``interlock signal`` does), in rounds of one signal to each run
in turn (and a ``describe`` of each every fourth round), so that the machine's load at
one moment weighs on every length alike, and the benchmark reports, per log length, as
ratios to the 100-record run: the signal's p50 (send, the orchestrator's decision, the
reply), ``describe``'s p50, and the orchestrator's CPU per event (its process's CPU time
over each signal), with the messages the client sent per signal (requests included:
what should not grow with the log) and the load average. Last, the
orchestrator is killed (-9) and started again, and the first signal to the longest run
(which it must read again, once it answers another run) is compared with that run's warm
p50 and with the signals right after it, three times over (the median is compared).

Goals: at 100,000 records, each ratio within 1.5 of the 100-record run's; the first event
after the restart within 3 times a warm one.

    python -m bench longrun [--sizes 100,10000,100000] [--signals 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TICKER = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ticker}
spec:
  budget: {max_transitions: 10000000}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: tick, goto: waiting, set: {n: "{{ data.n }}"}}
        - {event: stop, goto: done}
    done:
      type: terminal
"""


def _cpu_seconds(pid: int) -> float:
    """The process's CPU time, every thread's, to the nanosecond (``schedstat``; ``stat``
    counts in clock ticks of 10 ms)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


class Serve:
    """``interlock serve`` in a process of its own."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "interlock", "serve", "--server", self.url],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "INTERLOCK_METRICS_PORT": "0"},
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


async def _grow(url: str, run_id: str, records: int) -> int:
    """Append ticks to the run until its log holds at least ``records`` records, as the
    orchestrator would (decided by the engine, appended optimistically, snapshots kept)."""
    import nats

    from interlock.core.engine import decided
    from interlock.core.incoming import Incoming
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.runs import Runs
    from interlock.runtime.snapshots import Snapshots
    from interlock.transport.subjects import Subjects

    nc = await nats.connect(url)
    try:
        ops = InterlockClient(nc, Subjects())
        snapshots = Snapshots(nc, ops.subjects, write=True, key=ops.log.key, where=ops.log.where)
        runs = Runs(ops.log, ops.registry, cache_size=10, snapshots=snapshots)
        n = 0
        while True:
            entry = await runs.load(run_id)
            assert entry is not None
            if entry.state.seq >= records:
                break
            event = Incoming(type="tick", source="bench", id=f"grow-{n}", data={"n": n})
            now = runs.clock()
            await runs.apply(run_id, lambda d, s, e=event, t=now: decided(d, s, e, t)[0])
            n += 1
        while snapshots._writes:
            await asyncio.gather(*snapshots._writes)
        return entry.state.seq
    finally:
        await nc.close()


async def _relayed(url: str) -> None:
    """Wait until the orchestrator's relay has read every record appended."""
    import nats

    from interlock.transport.subjects import Subjects

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subjects = Subjects()
        for _ in range(3000):
            infos = [c async for c in _consumers(js, subjects.runs_stream)]
            if infos and all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the relay never caught up")
    finally:
        await nc.close()


async def _consumers(js: Any, stream: str) -> Any:
    for info in await js.consumers_info(stream):
        yield info


async def _measure(
    client: Any, runs: dict[int, str], signals: int, serve: Serve
) -> dict[int, dict[str, float]]:
    """Signals and describes of each run, in rounds that take one of each run in turn (so
    that a machine busier at one moment than at another weighs on every size alike)."""
    for run_id in runs.values():
        await client.signal(run_id, "tick", {"n": -1})  # the orchestrator reads the run once
    took: dict[int, list[float]] = {size: [] for size in runs}
    described: dict[int, list[float]] = {size: [] for size in runs}
    cpu = dict.fromkeys(runs, 0.0)
    sent = dict.fromkeys(runs, 0)
    for i in range(signals):
        for size, run_id in runs.items():
            before = _cpu_seconds(serve.pid)
            client.nc.sent = []
            start = time.perf_counter()
            result = await client.signal(run_id, "tick", {"n": i})
            took[size].append(time.perf_counter() - start)
            sent[size] += len(client.nc.sent)
            client.nc.sent = None
            cpu[size] += _cpu_seconds(serve.pid) - before
            assert result.outcome == "moved", result
        if i % 4 == 0:
            for size, run_id in runs.items():
                start = time.perf_counter()
                await client.describe(run_id)
                described[size].append(time.perf_counter() - start)
    return {
        size: {
            "signal_p50_ms": statistics.median(took[size]) * 1000,
            "describe_p50_ms": statistics.median(described[size]) * 1000,
            "cpu_per_event_ms": cpu[size] / signals * 1000,
            "sent_per_signal": sent[size] / signals,
        }
        for size in runs
    }


async def _restarts(
    client: Any, serve: Serve, other: str, longest: str, times: int = 3
) -> tuple[list[float], float]:
    """Kill (-9) and start the orchestrator ``times`` times; each time, once it answered a
    signal to ``other`` (it is up), the first signal to ``longest`` (which it reads again),
    in ms; and the p50 of the signals to ``longest`` right after those (warm again)."""
    firsts: list[float] = []
    warm: list[float] = []
    for _ in range(times):
        serve.kill()
        serve.start()
        await client.signal(other, "tick", {"n": 0}, wait=60)
        for i in range(6):
            start = time.perf_counter()
            result = await client.signal(longest, "tick", {"n": i}, wait=60)
            assert result.outcome == "moved", result
            (warm if i else firsts).append((time.perf_counter() - start) * 1000)
    return firsts, statistics.median(warm)


async def _bench(sizes: list[int], signals: int) -> int:
    from interlock import Client
    from interlock.runtime.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        server.start()
        serve = Serve(server.url, Path(tmp) / "serve.log")
        try:
            client = await Client.connect(server.url)
            (Path(tmp) / "ticker.yaml").write_text(TICKER)
            await client.apply([Path(tmp) / "ticker.yaml"])
            serve.start()
            await _measure(client, {0: await client.start("ticker", {})}, 4, serve)  # warm-up
            runs: dict[int, str] = {}
            for size in sizes:
                runs[size] = await client.start("ticker", {})
                built = time.perf_counter()
                got = await _grow(server.url, runs[size], size)
                print(f"run of {got:,} records built in {time.perf_counter() - built:.1f} s")
            await _relayed(server.url)
            print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
            results = await _measure(client, runs, signals, serve)
            print(f"load average after: {os.getloadavg()[0]:.1f}")
            base = results[sizes[0]]
            print(f"\n{'records':>10} " + " ".join(f"{k:>18}" for k in base) + "   (/ first)")
            for size, found in results.items():
                cells = " ".join(f"{v:>9.2f} ({v / base[k]:>5.2f}x)" for k, v in found.items())
                print(f"{size:>10,} {cells}")
            longest = sizes[-1]
            warm = results[longest]["signal_p50_ms"]
            firsts, after = await _restarts(client, serve, runs[sizes[0]], runs[longest])
            first = statistics.median(firsts)
            each = ", ".join(f"{f:.1f}" for f in firsts)
            print(
                f"\nafter kill -9 and a restart ({len(firsts)} times), the first signal to the "
                f"{longest:,}-record run: median {first:.1f} ms ({each}), "
                f"{first / warm:.2f}x its warm p50, {first / after:.2f}x the p50 of the "
                f"signals right after it ({after:.1f} ms)"
            )
            worst = max(v / base[k] for k, v in results[longest].items() if k != "sent_per_signal")
            met = worst <= 1.5 and first / warm <= 3
            print(
                f"goals (each <= 1.5x at {longest:,}; restart <= 3x): {'met' if met else 'NOT met'}"
            )
            await client.close()
            return 0
        finally:
            serve.stop()
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench longrun", description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000", help="log lengths (records)")
    parser.add_argument("--signals", type=int, default=40, help="signals timed per run")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    return asyncio.run(_bench(sizes, args.signals))


if __name__ == "__main__":
    sys.exit(main())
