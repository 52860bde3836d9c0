"""Shared helpers for the peer benchmark drivers (stdlib only).

Every driver measures the same two things:
  (a) sequential latency: WARMUP runs, then SEQ runs one after another; p50/p99 ms per run
  (b) throughput: TP_RUNS runs with at most TP_INFLIGHT in flight; runs completed per second
and writes one JSON file to results/<system>-<label>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = Path(
    os.environ.get("PEERS_RESULTS") or HERE / "results"
)  # PEERS_RESULTS: where a read-only copy writes
EXPECTED = {"merged": True}


def parse_args(
    system: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"approval-workflow benchmark: {system}")
    p.add_argument(
        "--label",
        default=time.strftime("%Y%m%d-%H%M%S"),
        help="tag for the result file (e.g. r1, r2)",
    )
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seq", type=int, default=200)
    p.add_argument("--tp-runs", type=int, default=2000)
    p.add_argument("--inflight", type=int, default=200)
    p.add_argument(
        "--workdir",
        default=None,
        help="scratch dir for data (default: fresh dir under $PEERS/data)",
    )
    if extra:
        extra(p)
    return p.parse_args()


def workdir_for(args: argparse.Namespace, system: str) -> Path:
    if args.workdir:
        d = Path(args.workdir)
    else:
        d = (
            Path(os.environ.get("PEERS", os.path.join(tempfile.gettempdir(), "peers")))
            / "data"
            / f"{system}-{args.label}-{os.getpid()}"
        )
    d.mkdir(parents=True, exist_ok=True)
    return d


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process {proc.pid} exited with {proc.returncode} before port {port} opened"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} not open after {timeout}s")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = max(1, math.ceil(q / 100.0 * len(xs)))
    return xs[k - 1]


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for k in kids:
        out.append(int(k))
        out.extend(_descendants(int(k)))
    return out


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int, include_children: bool = True) -> dict[str, float]:
    """Peak RSS (VmHWM, kernel high-water mark) of pid and, optionally, its live descendants.

    Returned as {"<pid>:<comm>": MiB, ..., "total": MiB}. Must be called while the processes are alive.
    """
    pids = [pid] + (_descendants(pid) if include_children else [])
    res: dict[str, float] = {}
    total = 0.0
    for p in pids:
        kb = _status_kb(p, "VmHWM")
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            comm = "?"
        res[f"{p}:{comm}"] = round(kb / 1024.0, 1)
        total += kb / 1024.0
    res["total"] = round(total, 1)
    return res


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, include_children: bool = True) -> float:
    """utime+stime of pid (and its live descendants), in seconds."""
    total = 0.0
    for p in [pid] + (_descendants(pid) if include_children else []):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            pass
    return total


def self_peak_rss_mib() -> float:
    return round(_status_kb(os.getpid(), "VmHWM") / 1024.0, 1)


async def measure_async(
    run_one: Callable[[int], Awaitable[dict]],
    args: argparse.Namespace,
    log: Callable[[str], None] = print,
    pids: dict[str, int] | None = None,
) -> dict:
    """Run the standard measurement against an async `run_one(i) -> output`.

    pids: {name: pid} of the other processes involved; their CPU seconds (and this process's)
    during the sequential and the throughput phases are reported as cpu_s_sequential and
    cpu_s_throughput.
    """
    procs = dict(pids or {})
    procs["driver"] = os.getpid()
    errors: list[str] = []
    load_start = os.getloadavg()

    def check(out: dict) -> None:
        if out != EXPECTED:
            errors.append(f"unexpected output {out!r}")

    # warm-up
    for i in range(args.warmup):
        check(await run_one(i))

    # (a) sequential latency
    def cpu_of(k: str, v: int) -> float:  # the driver's children are the servers: count them apart
        return cpu_seconds(v, include_children=(k != "driver"))

    lat: list[float] = []
    base = 1_000_000
    cpu_seq0 = {k: cpu_of(k, v) for k, v in procs.items()}
    for i in range(args.seq):
        t0 = time.perf_counter()
        out = await run_one(base + i)
        lat.append((time.perf_counter() - t0) * 1000.0)
        check(out)
    cpu_seq = {k: round(cpu_of(k, v) - cpu_seq0[k], 3) for k, v in procs.items()}
    log(f"sequential: n={len(lat)} p50={pct(lat, 50):.2f}ms p99={pct(lat, 99):.2f}ms")
    # (b) throughput
    sem = asyncio.Semaphore(args.inflight)
    done = 0
    failed = 0

    async def one(i: int) -> None:
        nonlocal done, failed
        async with sem:
            try:
                out = await run_one(i)
                check(out)
                done += 1
            except Exception as e:  # count, keep going
                failed += 1
                if len(errors) < 20:
                    errors.append(f"run {i}: {type(e).__name__}: {e}")

    base = 2_000_000
    cpu0 = {k: cpu_of(k, v) for k, v in procs.items()}
    t0 = time.perf_counter()
    await asyncio.gather(*(one(base + i) for i in range(args.tp_runs)))
    wall = time.perf_counter() - t0
    cpu = {k: round(cpu_of(k, v) - cpu0[k], 2) for k, v in procs.items()}
    log(
        f"throughput: {done}/{args.tp_runs} ok, {failed} failed, {wall:.2f}s -> {done / wall:.1f} runs/s"
    )
    return {
        "seq_n": len(lat),
        "p50_ms": round(pct(lat, 50), 3),
        "p99_ms": round(pct(lat, 99), 3),
        "mean_ms": round(sum(lat) / len(lat), 3),
        "max_ms": round(max(lat), 3),
        "tp_runs": args.tp_runs,
        "tp_inflight": args.inflight,
        "tp_ok": done,
        "tp_failed": failed,
        "tp_wall_s": round(wall, 3),
        "runs_per_s": round(done / wall, 1),
        "errors": errors[:20],
        "loadavg_at_start": load_start,
        "cpu_s_throughput": cpu,
        # CPU during the sequential runs: against their latency, how much of a run's
        # milliseconds each process computes rather than waits
        "cpu_s_sequential": cpu_seq,
        "cpu_cores_busy_throughput": round(sum(cpu.values()) / wall, 2),
    }


def write_result(system: str, args: argparse.Namespace, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = dict(result)
    result.setdefault("system", system)
    result["label"] = args.label
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["host"] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "kernel": platform.release(),
        "loadavg_at_end": os.getloadavg(),
    }
    path = RESULTS / f"{system}-{args.label}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Terminate a process this driver started (by its PID only), then kill if needed."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def nats_messages_per_run(mport: int, runs: int) -> dict:
    """NATS messages per run, by client connection and both directions, from the
    server's monitoring endpoint: ``in`` the client sent (publishes, requests, replies,
    acks, pull requests), ``out`` the server delivered to it (messages, replies, acks,
    pull statuses). Over the whole benchmark (warm-up, sequential and throughput runs)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/connz?limit=1024", timeout=5) as r:
        conns = json.load(r)["connections"]
    out: dict = {}
    for c in conns:
        name = c.get("name") or f"cid {c.get('cid')}"
        row = out.setdefault(name, {"in": 0, "out": 0})
        row["in"] += c.get("in_msgs", 0)
        row["out"] += c.get("out_msgs", 0)
    return {
        name: {
            "in_per_run": round(row["in"] / runs, 2),
            "out_per_run": round(row["out"] / runs, 2),
        }
        for name, row in sorted(out.items())
    }
