"""Runtime benchmarks: Interlock end to end against one fresh embedded nats-server.

One run measures, in this order and against the same server:

1. baseline: raw nats-py pipelined publish-with-ack rate (windows of 500) into a file
   stream, and the sequential publish-ack round trip (see ``bench.raw_nats``);
2. throughput: runs of a three-state workflow (one ``echo`` action, one guarded
   transition, terminal outputs) started by trigger events, completed per second with
   ``--in-flight`` runs in flight; the records and appends (messages) a run makes, how
   many acknowledged writes carried them (an append alone, or a group commit's atomic
   batch of several), and throughput / (raw pipelined rate / appends per run);
3. latency: p50 and p99 from publishing a trigger event to the run's completion record,
   runs one after another, also as multiples of the raw round trip;
4. memory: the orchestrator's resident memory with ``--parked`` runs waiting in a
   ``human_in_the_loop`` state.

The orchestrator and one echo worker run as subprocesses (``python -m interlock serve``,
``python -m interlock agent run echo``), as they would in production; ``--in-process``
runs them inside this process instead (handy under a profiler). Completion is observed
with a plain core subscription on the run-log subjects, which costs the server and the
system under test nothing extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench import raw_nats
from bench.raw_nats import Baseline, percentile
from interlock.core.definition import Definition
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects

ECHO_WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: bench-echo
spec:
  inputs:
    message:
      type: string
      default: hello
  triggers:
    - event: bench.echo.requested
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          timeout: 30s
          input:
            message: "{{ inputs.message }}"
      on:
        - event: task.completed
          guard: 'result.message != ""'
          goto: done
          set:
            echoed: "{{ result.message }}"
        - event: task.completed
          goto: failed
    done:
      type: terminal
      outputs:
        message: "$.states.work.output.message"
        echoed: "{{ context.echoed }}"
    failed:
      type: terminal
      outputs:
        status: empty
"""

PARK_WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: bench-park
spec:
  inputs:
    ticket:
      type: integer
      default: 0
  triggers:
    - event: bench.park.requested
  initial_state: approval
  states:
    approval:
      type: human_in_the_loop
      on:
        - event: approval.granted
          goto: done
    done:
      type: terminal
      outputs:
        ticket: "{{ inputs.ticket }}"
"""

ECHO_TRIGGER = "bench.echo.requested"
PARK_TRIGGER = "bench.park.requested"
SOURCE = "bench://runtime"

TARGET_THROUGHPUT_RATIO = 0.5
TARGET_RSS_MB = 300.0
WINDOW = 500
READY_TIMEOUT = 60.0
PHASE_TIMEOUT = 120.0

_COMPLETED = "io.interlock.run.completed"
_FAILED = "io.interlock.run.failed"


class _Head(msgspec.Struct):
    """Just the type of a stored record (msgspec skips the rest unread)."""

    type: str


_decode_one = msgspec.json.Decoder(_Head).decode
_decode_many = msgspec.json.Decoder(list[_Head]).decode


# --- observing run logs --------------------------------------------------------------


class RunWatcher:
    """Sees every run-log append on the wire: counts records, appends (messages: one per
    decision), acknowledged writes (an append alone, or the commit of a group commit's
    atomic batch) and the appends that went in batches, and resolves a future when a
    run's terminal record goes by."""

    def __init__(self, subjects: Subjects) -> None:
        self._prefix = subjects.runs_all[:-1]  # "<prefix>.runs."
        self._waiting: dict[str, asyncio.Future[bool]] = {}
        self.records = 0
        self.appends = 0
        self.writes = 0
        self.batched = 0
        self.failed = 0

    def reset_counts(self) -> None:
        self.records = self.appends = self.writes = self.batched = self.failed = 0

    def expect(self, run_id: str) -> asyncio.Future[bool]:
        """A future set to True when ``run_id`` completes (False: it failed)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting[run_id] = fut
        return fut

    async def on_msg(self, msg: Msg) -> None:
        data = msg.data
        # A message holds one record, or a decision's records as a JSON array.
        heads = _decode_many(data) if data[:1] == b"[" else [_decode_one(data)]
        self.records += len(heads)
        self.appends += 1
        headers = msg.headers
        # ADR-50: every message of an atomic batch carries Nats-Batch-Id; only the last
        # one carries Nats-Batch-Commit. A message without a batch id is an append alone.
        in_batch = bool(headers) and "Nats-Batch-Id" in headers
        self.batched += in_batch
        if not in_batch or "Nats-Batch-Commit" in headers:
            self.writes += 1
        for head in heads:
            if head.type in (_COMPLETED, _FAILED):
                completed = head.type == _COMPLETED
                self.failed += not completed
                fut = self._waiting.pop(msg.subject[len(self._prefix) :], None)
                if fut is not None and not fut.done():
                    fut.set_result(completed)


# --- the system under test -----------------------------------------------------------


@dataclass
class Stack:
    """The orchestrator and the echo worker: subprocesses, or tasks of this process."""

    url: str
    workdir: Path
    in_process: bool
    concurrency: int
    server_pid: int | None = None
    orchestrators: int = 1
    monitor_url: str | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _stop: Callable[[], Awaitable[None]] | None = None

    async def start(self) -> None:
        if self.in_process:
            await self._start_in_process()
        else:
            self._spawn()

    def _spawn(self) -> None:
        python = sys.executable
        server = ["--server", self.url, "--log-level", "warning"]
        serve = [python, "-m", "interlock", "serve", *server]
        if self.monitor_url:
            serve += ["--nats-monitor", self.monitor_url]
        commands = {
            "orchestrator": serve,
            **{f"orchestrator-{n}": serve for n in range(2, self.orchestrators + 1)},
            "worker": [
                python,
                *("-m", "interlock", "agent", "run", "echo"),
                *("--concurrency", str(self.concurrency), *server),
            ],
        }
        for name, cmd in commands.items():
            out = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child's
            self.procs[name] = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
            out.close()

    async def _start_in_process(self) -> None:
        from interlock.runtime.durability import group_commit_for
        from interlock.runtime.service import Orchestrator
        from interlock.sdk.runner import load_worker

        opts = ConnectOptions.resolve(self.url)
        nc = await connect(opts)
        group_commit = await group_commit_for(nc, None, self.monitor_url)
        orchestrator = Orchestrator(nc, opts.subjects, group_commit=group_commit)
        await orchestrator.start()
        worker = load_worker("echo")
        worker.concurrency = self.concurrency
        task = asyncio.create_task(worker.run(opts))
        await worker.wait_ready()

        async def stop() -> None:
            await worker.stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            await orchestrator.stop()
            await nc.close()

        self._stop = stop

    def cpu_pids(self) -> dict[str, int]:
        """The processes whose CPU time a run costs, by role."""
        pids = {name: proc.pid for name, proc in self.procs.items()}
        if self.in_process:
            pids = {"orchestrator+worker+driver": os.getpid()}
        else:
            pids["driver"] = os.getpid()
        if self.server_pid is not None:
            pids["nats-server"] = self.server_pid
        return pids

    def pid(self, name: str) -> int:
        return self.procs[name].pid if name in self.procs else os.getpid()

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the {name} exited with code {proc.returncode}:\n{self.log_tail(name)}"
                )

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text("utf-8", "replace").splitlines()[-lines:])

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def proc_status_kb(pid: int, key: str) -> int:
    """A ``kB`` figure (VmRSS, VmHWM...) of /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise LookupError(f"/proc/{pid}/status has no {key}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the benchmark -------------------------------------------------------------------


@dataclass
class Bench:
    nc: Client
    client: InterlockClient
    watcher: RunWatcher
    stack: Stack
    results: dict[str, Any] = field(default_factory=dict)
    _serial: int = 0
    _definitions: dict[str, Definition] = field(default_factory=dict)

    def _event(self, kind: str, data: dict[str, Any]) -> CloudEvent:
        self._serial += 1
        return CloudEvent(
            id=f"{kind}-{self._serial}",
            source=SOURCE,
            type=kind,
            datacontenttype="application/json",
            data=data,
        )

    async def _run_id(self, workflow: str, event: CloudEvent) -> str:
        definition = self._definitions.get(workflow)
        if definition is None:
            definition, _ = await self.client.registry.latest(workflow)
            self._definitions[workflow] = definition
        return derive_run_id(definition, event.source, event.id)

    async def trigger(self, workflow: str, kind: str, data: dict[str, Any]) -> asyncio.Future[bool]:
        """Publish one trigger event; the future resolves when its run finishes."""
        event = self._event(kind, data)
        fut = self.watcher.expect(await self._run_id(workflow, event))
        await self.client.emit(event)
        return fut

    async def wait_ready(self) -> None:
        """One run through the whole stack: the orchestrator and the worker are serving."""
        deadline = time.monotonic() + READY_TIMEOUT
        fut = await self.trigger("bench-echo", ECHO_TRIGGER, {"message": "ready"})
        while not fut.done():
            self.stack.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no run completed within {READY_TIMEOUT:g} s of starting the stack\n"
                    f"orchestrator:\n{self.stack.log_tail('orchestrator')}\n"
                    f"worker:\n{self.stack.log_tail('worker')}"
                )
            await asyncio.wait({fut}, timeout=0.2)

    async def closed_loop(self, runs: int, in_flight: int) -> tuple[float, int]:
        """Start ``runs`` runs keeping ``in_flight`` unfinished; (seconds, failed runs)."""
        gate = asyncio.Semaphore(in_flight)
        failed = 0

        async def one(i: int) -> None:
            nonlocal failed
            async with gate:
                fut = await self.trigger("bench-echo", ECHO_TRIGGER, {"message": f"m{i}"})
                if not await fut:
                    failed += 1

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(runs))), PHASE_TIMEOUT)
        return time.perf_counter() - started, failed

    async def stream_seqs(self) -> dict[str, int]:
        """Last sequence of every stream: how many messages each has taken so far."""
        js = self.nc.jetstream()
        out = {}
        for info in await js.streams_info():
            out[info.config.name or "?"] = info.state.last_seq
        return out

    async def quiesce(self, limit: float = PHASE_TIMEOUT) -> None:
        """Wait until every consumer of the RUNS and EVENTS streams has caught up."""
        js = self.nc.jetstream()
        s = self.client.subjects
        deadline = time.monotonic() + limit
        while True:
            behind = 0
            for stream in (s.events_stream, s.results_stream, s.runs_stream):
                for info in await js.consumers_info(stream):
                    behind += (info.num_pending or 0) + (info.num_ack_pending or 0)
            if behind == 0:
                return
            self.stack.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumers still {behind} message(s) behind after {limit} s")
            await asyncio.sleep(0.05)

    async def throughput(self, runs: int, in_flight: int, baseline: Baseline) -> None:
        # Warm-up: caches, compiled expressions, the worker's pull requests at full size.
        await self.closed_loop(min(in_flight, runs), in_flight)
        await self.quiesce()
        self.watcher.reset_counts()
        seqs_before = await self.stream_seqs()
        pids = self.stack.cpu_pids()
        cpu_before = {n: cpu_seconds(pid) for n, pid in pids.items()}
        seconds, failed = await self.closed_loop(runs, in_flight)
        watcher = self.watcher
        records, appends = watcher.records, watcher.appends
        writes_acked, batched = watcher.writes, watcher.batched
        cpu = {n: cpu_seconds(pid) - cpu_before[n] for n, pid in pids.items()}
        await self.quiesce()
        seqs_after = await self.stream_seqs()
        writes = {
            name: (seqs_after[name] - seqs_before.get(name, 0)) / runs
            for name in sorted(seqs_after)
            if seqs_after[name] != seqs_before.get(name, 0)
        }
        rate = runs / seconds
        records_per_run = records / runs
        appends_per_run = appends / runs
        self.results["throughput"] = {
            "runs": runs,
            "in_flight": in_flight,
            "failed_runs": failed,
            "seconds": seconds,
            "runs_per_s": rate,
            "records_per_run": records_per_run,
            "appends_per_run": appends_per_run,
            "acked_writes_per_run": writes_acked / runs,
            "batched_appends_per_run": batched / runs,
            "stream_writes_per_run": writes,
            "cpu_ms_per_run": {n: 1000 * c / runs for n, c in cpu.items()},
            "ratio_by_records": rate / (baseline.pipelined_per_s / records_per_run),
            "ratio_by_appends": rate / (baseline.pipelined_per_s / appends_per_run),
            "target_ratio": TARGET_THROUGHPUT_RATIO,
        }

    async def latency(self, runs: int, baseline: Baseline) -> None:
        samples: list[float] = []
        failed = 0
        for i in range(runs):
            event = self._event(ECHO_TRIGGER, {"message": f"l{i}"})
            fut = self.watcher.expect(await self._run_id("bench-echo", event))
            started = time.perf_counter()
            await self.client.emit(event)
            ok = await asyncio.wait_for(fut, PHASE_TIMEOUT)
            samples.append(time.perf_counter() - started)
            failed += not ok
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        rtt = baseline.roundtrip_p50_s
        self.results["latency"] = {
            "runs": runs,
            "failed_runs": failed,
            "p50_s": p50,
            "p99_s": p99,
            "mean_s": statistics.fmean(samples),
            "p50_over_roundtrip": p50 / rtt,
            "p99_over_roundtrip": p99 / rtt,
        }

    async def memory(self, parked: int) -> None:
        pid = self.stack.pid("orchestrator")
        await self.quiesce()
        before_kb = proc_status_kb(pid, "VmRSS")
        started = time.perf_counter()
        js = self.nc.jetstream()
        subject = self.client.subjects.event(PARK_TRIGGER)
        for first in range(0, parked, WINDOW):
            batch = []
            for i in range(first, min(first + WINDOW, parked)):
                event = self._event(PARK_TRIGGER, {"ticket": i})
                batch.append(self._publish_event(js, subject, event))
            await asyncio.gather(*batch)
        await self.quiesce()
        seconds = time.perf_counter() - started
        index = await js.key_value(self.client.subjects.runs_bucket)
        waiting = 0
        for key in await index.keys():
            entry = await index.get(key)
            item = json.loads(entry.value or b"{}")
            if item.get("workflow") == "bench-park" and item.get("state") == "approval":
                waiting += 1
        rss_kb = proc_status_kb(pid, "VmRSS")
        self.results["memory"] = {
            "parked_runs": parked,
            "parked_seen_in_index": waiting,
            "seconds_to_park": seconds,
            "parked_per_s": parked / seconds,
            "rss_before_mb": before_kb / 1024,
            "rss_mb": rss_kb / 1024,
            "peak_rss_mb": proc_status_kb(pid, "VmHWM") / 1024,
            "rss_per_parked_run_kb": (rss_kb - before_kb) / parked,
            "target_rss_mb": TARGET_RSS_MB,
            "measured_process": "orchestrator" if self.stack.procs else "whole process",
        }

    async def _publish_event(self, js: Any, subject: str, event: CloudEvent) -> None:
        headers, payload = encode_binary(event)
        headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
        await js.publish(subject, payload, headers=headers)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement against one fresh embedded server; the results as a dict."""
    with tempfile.TemporaryDirectory(prefix="interlock-bench-") as tmp:
        workdir = Path(tmp)
        # The monitoring endpoint tells the orchestrator whether the server fsyncs every
        # write (then it group-commits), as it would find out in production.
        server = EmbeddedNats(
            workdir / "nats", args=("-m", "-1"), sync_always=args.fsync == "always"
        )
        server.start()
        stack = Stack(
            server.url, workdir, args.in_process, args.concurrency, server.pid, args.orchestrators
        )
        stack.monitor_url = server.monitor_url
        try:
            return await _measure(server.url, stack, args)
        finally:
            with contextlib.suppress(Exception):
                await stack.stop()
            server.stop()


async def _measure(url: str, stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    import interlock_agents

    opts = ConnectOptions.resolve(url)
    nc = await connect(opts)
    try:
        started = time.perf_counter()
        baseline = await raw_nats.measure(nc, window=WINDOW)
        client = InterlockClient(nc, opts.subjects)
        await client.ensure_provisioned()
        applied = await client.apply(
            [
                ("<echo agent>", interlock_agents.manifest_text("echo")),
                ("bench-echo.yaml", ECHO_WORKFLOW),
                ("bench-park.yaml", PARK_WORKFLOW),
            ]
        )
        applied.compiled.raise_for_errors()
        watcher = RunWatcher(opts.subjects)
        await nc.subscribe(opts.subjects.runs_all, cb=watcher.on_msg, pending_msgs_limit=-1)
        bench = Bench(nc, client, watcher, stack)
        await stack.start()
        await bench.wait_ready()
        if args.runs:
            await bench.throughput(args.runs, args.in_flight, baseline)
        if args.latency_runs:
            await bench.latency(args.latency_runs, baseline)
        if args.parked:
            await bench.memory(args.parked)
        results: dict[str, Any] = {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "stack": "in-process" if args.in_process else "subprocesses",
            "fsync": args.fsync,
            "worker_concurrency": args.concurrency,
            "orchestrators": 1 if args.in_process else args.orchestrators,
            "baseline": baseline.as_dict(),
            **bench.results,
            "total_seconds": time.perf_counter() - started,
        }
        return results
    finally:
        await nc.close()


# --- reporting -----------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    """The results as a plain-text table."""
    rows: list[tuple[str, str, str]] = []
    b = results["baseline"]
    rows.append(
        ("raw pipelined publish-ack", f"{b['pipelined_per_s']:,.0f} msg/s", f"window {b['window']}")
    )
    rows.append(
        (
            "raw publish-ack round trip",
            f"p50 {b['roundtrip_p50_s'] * 1e6:,.0f} us",
            f"p99 {b['roundtrip_p99_s'] * 1e6:,.0f} us, {b['sequential_per_s']:,.0f}/s",
        )
    )
    t = results.get("throughput")
    if t:
        rows.append(
            (
                "throughput",
                f"{t['runs_per_s']:,.0f} runs/s",
                f"{t['runs']} runs, {t['in_flight']} in flight, {t['failed_runs']} failed",
            )
        )
        rows.append(
            (
                "appends per run",
                f"{t['appends_per_run']:.2f} appends",
                f"{t['records_per_run']:.2f} records in them; acknowledged writes "
                f"{t['acked_writes_per_run']:.2f} (appends alone and batch commits), "
                f"{t['batched_appends_per_run']:.2f} appends in group-commit batches",
            )
        )
        writes = ", ".join(f"{k} {v:.2f}" for k, v in t["stream_writes_per_run"].items())
        rows.append(
            ("stream writes per run", f"{sum(t['stream_writes_per_run'].values()):.2f}", writes)
        )
        cpu = t["cpu_ms_per_run"]
        rows.append(
            (
                "CPU per run",
                f"{sum(cpu.values()):.2f} ms",
                ", ".join(f"{k} {v:.2f} ms" for k, v in cpu.items()),
            )
        )
        rows.append(
            (
                "throughput ratio (records)",
                f"{t['ratio_by_records']:.2f}",
                f"target >= {t['target_ratio']}: {_verdict(t['ratio_by_records'] >= 0.5)}",
            )
        )
        rows.append(
            (
                "throughput ratio (appends)",
                f"{t['ratio_by_appends']:.2f}",
                f"target >= {t['target_ratio']}: {_verdict(t['ratio_by_appends'] >= 0.5)}",
            )
        )
    lat = results.get("latency")
    if lat:
        rows.append(
            (
                "latency p50",
                f"{lat['p50_s'] * 1e3:.2f} ms",
                f"{lat['p50_over_roundtrip']:.1f}x the raw round trip",
            )
        )
        rows.append(
            (
                "latency p99",
                f"{lat['p99_s'] * 1e3:.2f} ms",
                f"{lat['p99_over_roundtrip']:.1f}x the raw round trip",
            )
        )
    m = results.get("memory")
    if m:
        rows.append(
            (
                f"{m['measured_process']} RSS, parked runs",
                f"{m['rss_mb']:.0f} MB",
                f"{m['parked_runs']:,} parked ({m['parked_seen_in_index']:,} indexed); "
                f"target < {m['target_rss_mb']:.0f} MB: "
                + _verdict(m["rss_mb"] < m["target_rss_mb"]),
            )
        )
        rows.append(
            (
                "RSS before / per parked run",
                f"{m['rss_before_mb']:.0f} MB",
                f"{m['rss_per_parked_run_kb']:.1f} kB per run, "
                f"parked at {m['parked_per_s']:,.0f}/s",
            )
        )
    width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    fsync = ", fsync every write" if results.get("fsync") == "always" else ""
    lines = [
        f"Interlock runtime benchmark ({results['stack']}{fsync}, {results['total_seconds']:.0f} s)"
    ]
    lines += [f"  {a:<{width}}  {b:>{value_width}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench runtime", description="Interlock runtime benchmarks"
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--runs", type=int, default=2000, help="throughput runs (0: skip)")
    p.add_argument("--in-flight", type=int, default=200, help="runs in flight for throughput")
    p.add_argument("--latency-runs", type=int, default=200, help="sequential runs (0: skip)")
    p.add_argument("--parked", type=int, default=10_000, help="parked runs for memory (0: skip)")
    p.add_argument("--concurrency", type=int, default=200, help="the echo worker's concurrency")
    p.add_argument(
        "--orchestrators",
        type=int,
        default=1,
        help="orchestrator replicas (subprocesses); memory is measured on the first",
    )
    p.add_argument(
        "--fsync",
        choices=["default", "always"],
        default="default",
        help="always: the server fsyncs every write (sync_interval: always)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the orchestrator and worker in this process instead of subprocesses",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m bench runtime``: measure, print a table, optionally write JSON."""
    args = parser().parse_args(argv)
    try:
        results = asyncio.run(run(args))
    except (RuntimeError, TimeoutError) as exc:
        sys.stderr.write(f"runtime benchmark failed: {exc}\n")
        return 1
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
