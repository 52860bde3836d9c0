"""Scale: runs/s and p50 with P partitions and R orchestrator replicas, as ratios to P=1/R=1.

Every cell of the grid (P = 1, 2, 4 by R = 1, 2, 4 by default) is a fresh deployment, as
an operator makes one: a nats-server with JetStream (``--cluster 3``: three nodes on
127.0.0.1 and R3 streams), the approval workflow of ``bench/peers`` applied with
``interlock apply``, R ``interlock serve --partitions P`` processes, and one agent process
(``interlock agent run interlock_worker:worker``). The driver publishes the trigger event
of ``--runs`` runs with ``--in-flight`` of them outstanding at a time and sees each end on
one core subscription on the run logs (every partition's). It prints runs/s, p50 and p99
of each cell, their ratios to P=1/R=1 of the same run, and what a run cost at P=1/R=1:
stream writes and bytes, and CPU seconds of the orchestrators, the server and the agent.

Growth needs cores: each process is one Python interpreter (one core at most) and the
server wants its own. The benchmark reads the machine's core count and says what to
expect; it runs unchanged on a bigger machine.

    python -m bench scale                       # the 3 x 3 grid, 1,000 runs a cell
    python -m bench scale --runs 400 --grid "1x1 2x2 4x4"
    python -m bench scale --cluster 3           # three local nodes, R3 streams
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import nats_server_binary
from interlock.runtime.ownership import owners
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects

PEERS = Path(__file__).resolve().parent / "peers"
MANIFEST = PEERS / "interlock_approval.yaml"
SOURCE = "bench://scale"
TRIGGER = "bench.approval.requested"
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Cell:
    partitions: int
    replicas: int
    runs_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    writes: float = 0.0
    bytes: float = 0.0
    per_stream: dict[str, float] = field(default_factory=dict)
    runs: int = 0


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _servers(work: Path, nodes: int) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    binary = nats_server_binary()
    ports = _free_ports(2 * nodes)
    clients, routes = ports[:nodes], ports[nodes:]
    procs = []
    for i in range(nodes):
        conf = work / f"nats-{i}.conf"
        text = (
            f'server_name: n{i}\nlisten: "127.0.0.1:{clients[i]}"\n'
            f'jetstream {{ store_dir: "{work / f"js-{i}"}" }}\n'
        )
        if nodes > 1:
            peers = ", ".join(f'"nats://127.0.0.1:{p}"' for p in routes)
            text += (
                f'cluster {{ name: scale, listen: "127.0.0.1:{routes[i]}", routes: [{peers}] }}\n'
            )
        conf.write_text(text)
        log = (work / f"nats-{i}.log").open("wb")
        procs.append(subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log))
    return procs, [f"nats://127.0.0.1:{p}" for p in clients]


def _spawn(argv: list[str], work: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (work / f"{name}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PEERS)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


async def _quiet(exc: Exception) -> None:
    """Connection errors while the server starts: the probe tries again."""


async def _ready(urls: list[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            nc = await nats.connect(
                servers=urls, connect_timeout=1, max_reconnect_attempts=0, error_cb=_quiet
            )
            try:
                await nc.jetstream().account_info()
                return
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _cell(args: argparse.Namespace, partitions: int, replicas: int) -> Cell:
    work = Path(tempfile.mkdtemp(prefix=f"scale-p{partitions}r{replicas}-"))
    servers, urls = _servers(work, args.cluster)
    procs: list[subprocess.Popen[bytes]] = []
    cell = Cell(partitions, replicas)
    try:
        await _ready(urls)
        bindir = Path(sys.executable).parent
        il = str(bindir / "interlock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
        env.update(INTERLOCK_URL=",".join(urls), PYTHONPATH=str(PEERS), PYTHONUNBUFFERED="1")
        stream_replicas = "3" if args.cluster >= 3 else "1"
        env["INTERLOCK_REPLICAS"] = stream_replicas
        apply = [il, "apply", str(MANIFEST)]
        await asyncio.to_thread(subprocess.run, apply, env=env, check=True, capture_output=True)
        serve = [il, "serve", "--partitions", str(partitions), "--metrics-port", "0"]
        serve += ["--replicas", stream_replicas, "--log-level", "warning"]
        # The first provisions the partitions; the others find them.
        procs.append(_spawn(serve, work, "serve-0", env))
        nc = await nats.connect(servers=urls)
        subjects = Subjects()
        client = InterlockClient(nc, subjects)
        # Polled: the map is written by another process, once.
        while (await client.log.placement.load()).current.count != partitions:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        procs += [_spawn(serve, work, f"serve-{i}", env) for i in range(1, replicas)]
        agent = [il, "agent", "run", "interlock_worker:worker", "--concurrency", "200"]
        agent += ["--metrics-port", "0", "--log-level", "warning"]
        procs.append(_spawn(agent, work, "agent", env))
        definition, _ = await client.registry.latest("approval")
        waiting: dict[str, tuple[float, asyncio.Future[float]]] = {}

        async def ended(msg: Msg) -> None:
            if b"run.completed" not in msg.data:
                return
            found = waiting.pop(msg.subject.rpartition(".")[2], None)
            if found is not None and not found[1].done():
                found[1].set_result(time.perf_counter() - found[0])

        await nc.subscribe(subjects.runs_all, cb=ended, pending_msgs_limit=-1)
        session = f"{os.getpid()}x{int(time.time() * 1000)}"

        async def one(i: int) -> float:
            key = f"{session}-{i}"
            run_id = derive_run_id(definition, SOURCE, key)
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            waiting[run_id] = (time.perf_counter(), future)
            event = CloudEvent(id=key, source=SOURCE, type=TRIGGER, data={"n": i})
            await client.emit(event)
            return await asyncio.wait_for(future, 120)

        await asyncio.wait_for(one(-1), 120)  # the whole pipeline is up
        await _shared(nc, subjects, partitions, replicas)
        pids = {"orchestrators": [p.pid for p in procs[:replicas]], "agent": [procs[-1].pid]}
        pids["nats-server"] = [s.pid for s in servers]
        before = {k: sum(_cpu(p) for p in v) for k, v in pids.items()}
        js = nc.jetstream()
        streams_before = {i.config.name: i.state for i in await js.streams_info()}
        gate = asyncio.Semaphore(args.in_flight)

        async def gated(i: int) -> float:
            async with gate:
                return await one(i)

        began = time.perf_counter()
        latencies = await asyncio.gather(*(gated(i) for i in range(args.runs)))
        took = time.perf_counter() - began
        await asyncio.sleep(1.0)  # the last runs' index writes
        cell.runs = args.runs
        cell.runs_per_s = args.runs / took
        ordered = sorted(latencies)
        cell.p50_ms = statistics.median(ordered) * 1000
        cell.p99_ms = ordered[int(0.99 * (len(ordered) - 1))] * 1000
        cell.cpu_s = {k: (sum(_cpu(p) for p in v) - before[k]) / args.runs for k, v in pids.items()}
        writes = written = 0
        for info in await js.streams_info():
            old = streams_before.get(info.config.name)
            wrote = info.state.last_seq - (old.last_seq if old else 0)
            writes += wrote
            written += info.state.bytes - (old.bytes if old else 0)
            if wrote:
                cell.per_stream[info.config.name] = wrote / args.runs
        cell.writes, cell.bytes = writes / args.runs, written / args.runs
        await nc.close()
    finally:
        _stop(procs)
        _stop(servers)  # type: ignore[arg-type]
        shutil.rmtree(work, ignore_errors=True)
    return cell


async def _shared(nc: nats.NATS, subjects: Subjects, partitions: int, replicas: int) -> None:
    """Until every partition has an owner, as many owners as can have one (one replica
    alone reads the one partition's relay with no lease)."""
    if partitions == 1:
        await asyncio.sleep(1.0)
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = await owners(nc, subjects)
        if len(held) == partitions and len(set(held.values())) == min(partitions, replicas):
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"the partitions were not shared out in 60 s: {held}")


def _median(cells: list[Cell]) -> Cell:
    """The cell of the median runs/s (its p50 and costs with it)."""
    return sorted(cells, key=lambda c: c.runs_per_s)[(len(cells) - 1) // 2]


def _expectation(cores: int, grid: list[tuple[int, int]]) -> str:
    most = max(p + r for p, r in grid)
    if cores <= 2:
        return (
            f"{cores} cores: expect no growth (the server, the agent and each replica share "
            "them; more replicas only add switching), and ratios near or below 1"
        )
    if cores < most + 2:
        return (
            f"{cores} cores: expect growth up to about {max(1, cores - 2)} replicas, "
            "flat beyond (the server and the agent take the others)"
        )
    return f"{cores} cores: expect runs/s to grow with replicas while P >= replicas"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="runs a cell (default 1000)")
    parser.add_argument("--in-flight", type=int, default=200, help="runs outstanding at once")
    parser.add_argument(
        "--grid",
        default="1x1 1x2 1x4 2x1 2x2 2x4 4x1 4x2 4x4",
        help="cells as PxR (partitions x replicas), the first the baseline of the ratios",
    )
    parser.add_argument("--cluster", type=int, default=1, help="nats-server nodes (3: R3)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="passes over the grid; each cell's median"
    )
    args = parser.parse_args(argv)
    grid = [(int(p), int(r)) for p, r in (c.split("x") for c in args.grid.split())]
    cores = os.cpu_count() or 1
    print(_expectation(cores, grid), flush=True)
    measured: dict[tuple[int, int], list[Cell]] = {}
    for n in range(args.rounds):
        # Round by round, so that a noisy minute of a shared machine hits every cell alike.
        for partitions, replicas in grid:
            cell = asyncio.run(_cell(args, partitions, replicas))
            measured.setdefault((partitions, replicas), []).append(cell)
            print(
                f"round {n + 1} P={partitions} R={replicas}: {cell.runs_per_s:7.0f} runs/s, "
                f"p50 {cell.p50_ms:6.1f} ms, p99 {cell.p99_ms:6.1f} ms",
                flush=True,
            )
    cells = [_median(measured[key]) for key in grid]
    base = cells[0]
    print(f"\nratios to P={base.partitions}/R={base.replicas} ({cores} cores):")
    print("   P   R   runs/s ratio   p50 ratio")
    for c in cells:
        print(
            f"{c.partitions:4d}{c.replicas:4d}{c.runs_per_s / base.runs_per_s:15.2f}"
            f"{c.p50_ms / base.p50_ms:12.2f}"
        )
    print(f"\none run at P={base.partitions}/R={base.replicas}:")
    print(f"  stream writes {base.writes:.1f}, bytes stored {base.bytes:,.0f}")
    print("  writes by stream " + ", ".join(f"{k} {v:.2f}" for k, v in base.per_stream.items()))
    cpu: dict[str, Any] = {k: f"{v * 1000:.2f} ms" for k, v in base.cpu_s.items()}
    print(f"  CPU {cpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
