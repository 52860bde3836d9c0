"""The agent worker's own latency: from a task's publish to its answer request, one task
after another, with this process playing the orchestrator.

Starts a fresh embedded nats-server, applies the approval workflow of ``bench/peers`` (its
streams and its AgentDef), and runs that benchmark's worker (``interlock agent run
interlock_worker:worker --concurrency 200``, the public SDK) as a process of its own. Then
it speaks the orchestrator's side of the task contract: it publishes a ``review`` task
request (the headers the orchestrator sends), replies ``recorded`` to the worker's answer
request and publishes the ``merge`` task at once (what the orchestrator does when a run
goes on: the next task reaches the worker just after the reply to the last answer), replies
to that answer too, and starts the next pair after a pause. It prints the median time from
each publish to the arrival of its answer request (the server's delivery both ways plus
the worker's own time from the task's arrival to its answer), and the worker's CPU per
task. No orchestrator runs, so the figures move with the worker and the server alone.

With ``--baseline INTERLOCK`` (the ``interlock`` command of another checkout's virtual
environment) the two workers take turns against the same server, round by round, and each
round prints both.

    python -m bench worker [--pairs 1000] [--rounds 2] [--baseline PATH/.venv/bin/interlock]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from nats.aio.msg import Msg

from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.natsclient import NatsClient
from interlock.transport.tasks import ANSWER_HEADER, ANSWER_RECORDED, task_request

PEERS = Path(__file__).resolve().parent / "peers"
MANIFEST = PEERS / "interlock_approval.yaml"
PAUSE = 0.002
"""Seconds between two pairs (what the rest of a run takes in the peers benchmark)."""
WARMUP = 50
"""Pairs before each measurement, not counted."""


def worker_cpu(pid: int) -> float:
    """Seconds of CPU (user and system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Orchestrator:
    """The orchestrator's side of two tasks of a run: publish, await the answer, reply."""

    def __init__(self, nc: NatsClient, prefix: str) -> None:
        self.nc = nc
        self.prefix = prefix
        self._waiting: asyncio.Future[float] | None = None

    async def start(self) -> None:
        await self.nc.subscribe_direct(f"{self.prefix}.answer.>", self._on_answer)

    def _on_answer(self, msg: Msg) -> None:
        arrived = time.perf_counter()
        self.nc.publish_nowait(msg.reply, b"", headers={ANSWER_HEADER: ANSWER_RECORDED})
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(arrived)

    async def task(self, capability: str, run_id: str, seq: int, data: object) -> float:
        """Publish one task request; seconds until its answer request arrived."""
        headers, payload = task_request(
            run_id=run_id,
            seq=seq,
            capability=capability,
            data=data,
            attempt=1,
            deadline=None,
            now=datetime.now(UTC),
            token="bench",
        )
        self._waiting = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        await self.nc.publish(f"{self.prefix}.cap.{capability}", payload, headers=headers)
        return await asyncio.wait_for(self._waiting, 30) - sent

    async def pairs(self, n: int, session: str) -> tuple[list[float], list[float]]:
        """``n`` pairs of tasks (review, then merge as soon as review is answered)."""
        review: list[float] = []
        merge: list[float] = []
        for i in range(n):
            run_id = f"r{session}{i:08x}"
            review.append(await self.task("review", run_id, 1, {"n": i}))
            merge.append(await self.task("merge", run_id, 3, {}))
            await asyncio.sleep(PAUSE)
        return review, merge


def spawn_worker(interlock: str, url: str, profile: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PEERS), env.get("PYTHONPATH"))))
    python = str(Path(interlock).parent / "python")
    return subprocess.Popen(
        [
            *((python, "-m", "cProfile", "-o", profile) if profile else ()),
            interlock,
            *("agent", "run", "interlock_worker:worker", "--concurrency", "200"),
            *("--server", url, "--metrics-port", "0", "--log-level", "warning"),
        ],
        env=env,
        cwd=PEERS,
        stdout=subprocess.DEVNULL,
    )


async def measure(
    url: str, workers: dict[str, str], pairs: int, rounds: int, profile: str | None
) -> None:
    nc = await connect(ConnectOptions.resolve(url, name="bench worker driver"))
    assert isinstance(nc, NatsClient)
    orchestrator = Orchestrator(nc, "il")
    await orchestrator.start()
    session = f"{os.getpid():x}{int(time.time()):x}"
    try:
        for r in range(1, rounds + 1):
            for name, interlock in workers.items():
                proc = spawn_worker(interlock, url, profile and f"{profile}.{name}.{r}")
                try:
                    tag = f"{session}{r}{name[0]}"
                    await orchestrator.pairs(WARMUP, tag + "w")  # the first waits for the start
                    cpu = worker_cpu(proc.pid)
                    review, merge = await orchestrator.pairs(pairs, tag)
                    cpu = worker_cpu(proc.pid) - cpu
                finally:
                    proc.terminate()
                    proc.wait(10)
                print(
                    f"  round {r} {name:<9} review p50 {statistics.median(review) * 1e6:5.0f} us"
                    f"  merge p50 {statistics.median(merge) * 1e6:5.0f} us"
                    f"  worker CPU {cpu / (2 * pairs) * 1e6:4.0f} us/task"
                    f"  (load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench worker", description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=1000, help="pairs of tasks (review, merge)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline", help="the interlock command of another checkout to compare")
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="run the workers under cProfile (to FILE.<this|baseline>.<round>)",
    )
    args = p.parse_args(argv)
    workers = {"this": str(Path(sys.executable).parent / "interlock")}
    if args.baseline:
        workers["baseline"] = args.baseline
    with tempfile.TemporaryDirectory(prefix="interlock-worker-bench-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        server.start()
        try:
            subprocess.run(
                [workers["this"], "apply", str(MANIFEST), "--server", server.url],
                check=True,
                capture_output=True,
            )
            print(
                f"from a task's publish to its answer request, median of {args.pairs} pairs"
                f" one after another ({args.rounds} rounds)"
            )
            asyncio.run(measure(server.url, workers, args.pairs, args.rounds, args.profile))
        finally:
            server.stop()
    return 0
