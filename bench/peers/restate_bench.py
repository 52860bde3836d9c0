"""Restate: restate-server (npm @restatedev/restate-server, linux-x64 binary from its optional
dependency) + Python service (restate-sdk) served by hypercorn, registered via the admin API,
invoked through the HTTP ingress. Everything binds to 127.0.0.1.

  restate-server  --base-dir <tmp> ; ingress 127.0.0.1:8080, admin 127.0.0.1:9070, fabric 127.0.0.1:<free>
  hypercorn       restate_service:app on 127.0.0.1:9080 (HTTP/2 cleartext, 1 worker process)
  POST http://127.0.0.1:9070/deployments {"uri": "http://127.0.0.1:9080"}
  per run: POST http://127.0.0.1:8080/Approval/run {"n": i}  -> {"merged": true}
           (HTTP/1.1 keep-alive, aiohttp by default; --client httpx for the client restate.client uses)

Durability: single node, default config (replicated loglet, replication 1, local log-server on
RocksDB with WAL fsync enabled: log-server.rocksdb-disable-wal-fsync=false). Telemetry disabled.

Usage: $PEERS/venv-restate/bin/python restate_bench.py --label r1
       [--restate-bin PATH] (default: $PEERS/restate-node/node_modules/.../restate-server)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version as _ver

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BIN = os.path.join(
    os.environ.get("PEERS", os.path.join(tempfile.gettempdir(), "peers")),
    "restate-node/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server",
)


def main() -> None:
    def extra(p):
        p.add_argument("--restate-bin", default=DEFAULT_BIN)
        p.add_argument("--ingress-port", type=int, default=8080)
        p.add_argument("--admin-port", type=int, default=9070)
        p.add_argument("--service-port", type=int, default=9080)
        p.add_argument("--keep-data", action="store_true")
        p.add_argument(
            "--client",
            choices=["aiohttp", "httpx"],
            default="aiohttp",
            help="HTTP client of the driver (httpx is what restate.client uses)",
        )

    args = common.parse_args("restate", extra)
    asyncio.run(bench(args))


async def bench(args) -> None:
    wd = common.workdir_for(args, "restate")
    fabric = common.free_port()
    cfg = wd / "restate.toml"
    cfg.write_text(
        f'''node-name = "bench"
base-dir = "{wd / "restate-data"}"
disable-telemetry = true
listen-mode = "tcp"
bind-address = "127.0.0.1:{fabric}"
advertised-address = "http://127.0.0.1:{fabric}/"
log-filter = "warn,restate=warn"

[admin]
bind-address = "127.0.0.1:{args.admin_port}"
disable-web-ui = true

[ingress]
bind-address = "127.0.0.1:{args.ingress_port}"
'''
    )
    ver = subprocess.run(
        [args.restate_bin, "--version"], capture_output=True, text=True
    ).stdout.strip()
    env = dict(os.environ, RESTATE_DISABLE_TELEMETRY="true", DO_NOT_TRACK="1")
    srv = subprocess.Popen(
        [args.restate_bin, "--config-file", str(cfg), "--no-logo"],
        cwd=str(wd),
        env=env,
        stdout=open(wd / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    svc = None
    try:
        common.wait_port(args.admin_port, 120, srv)
        common.wait_port(args.ingress_port, 120, srv)
        svc = subprocess.Popen(
            [
                os.path.join(os.path.dirname(sys.executable), "hypercorn"),
                "--bind",
                f"127.0.0.1:{args.service_port}",
                "--workers",
                "1",
                "--log-level",
                "warning",
                "restate_service:app",
            ],
            cwd=HERE,
            stdout=open(wd / "service.log", "w"),
            stderr=subprocess.STDOUT,
        )
        common.wait_port(args.service_port, 60, svc)

        admin = f"http://127.0.0.1:{args.admin_port}"
        async with httpx.AsyncClient(timeout=30) as ac:
            # admin API may need a moment after the port opens (cluster auto-provision)
            for attempt in range(120):
                try:
                    r = await ac.post(
                        f"{admin}/deployments",
                        json={"uri": f"http://127.0.0.1:{args.service_port}"},
                    )
                    if r.status_code < 300:
                        break
                    last = f"{r.status_code} {r.text[:300]}"
                except httpx.HTTPError as e:
                    last = repr(e)
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"deployment registration failed: {last}")
            reg = r.json()
            print("registered:", r.status_code, json.dumps(reg)[:200], flush=True)
            dep = (await ac.get(f"{admin}/deployments/{reg['id']}")).json()
            deployment = {k: v for k, v in dep.items() if k != "services"}

        ingress = f"http://127.0.0.1:{args.ingress_port}/Approval/run"
        if args.client == "httpx":  # what the Restate SDK's own restate.client uses
            limits = httpx.Limits(
                max_connections=args.inflight, max_keepalive_connections=args.inflight
            )
            client = httpx.AsyncClient(timeout=60, limits=limits)

            async def post(body: dict):
                r = await client.post(ingress, json=body)
                return r.status_code, r.content

            close = client.aclose
        else:  # aiohttp: same HTTP/1.1 keep-alive requests at a fraction of httpx's CPU cost
            import aiohttp

            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=args.inflight),
                timeout=aiohttp.ClientTimeout(total=60),
            )

            async def post(body: dict):
                async with session.post(
                    ingress,
                    data=json.dumps(body).encode(),
                    headers={"content-type": "application/json"},
                ) as r:
                    return r.status, await r.read()

            close = session.close
        # wait until the ingress routes to the new deployment
        for attempt in range(120):
            try:
                status, body = await post({"n": -1})
                if status == 200:
                    break
                last = f"{status} {body[:300]!r}"
            except Exception as e:
                last = repr(e)
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"ingress never became ready: {last}")

        async def run_one(i: int) -> dict:
            status, body = await post({"n": i})
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
            return json.loads(body)

        res = await common.measure_async(
            run_one, args, pids={"restate-server": srv.pid, "service": svc.pid}
        )
        await close()

        # sanity: what the server retained (completed invocations are kept for the journal retention period)
        try:
            async with httpx.AsyncClient(timeout=60) as ac:
                q = await ac.post(
                    f"{admin}/query",
                    headers={"accept": "application/json"},
                    json={
                        "query": "SELECT status, count(*) AS n FROM sys_invocation GROUP BY status"
                    },
                )
                res["durable_records"] = {
                    "sys_invocation": q.json() if q.status_code == 200 else q.text[:300],
                    "expected_invocations": args.warmup + args.seq + res["tp_ok"] + 1,
                }
        except Exception as e:  # informational only
            res["durable_records"] = {"error": repr(e)}

        res["rss_mib"] = {
            "engine(restate-server)": common.peak_rss_mib(srv.pid)["total"],
            "service(hypercorn tree)": common.peak_rss_mib(svc.pid)["total"],
            "driver(client)": common.self_peak_rss_mib(),
        }
        res["peak_rss_engine_mib"] = res["rss_mib"]["engine(restate-server)"]
        res["versions"] = {
            "restate-server": ver,
            "restate-sdk": _ver("restate-sdk"),
            "hypercorn": _ver("hypercorn"),
            "client": f"{args.client} {_ver(args.client)}",
        }
        res["durability"] = (
            "single node, default config: replicated loglet R1 on local log-server, "
            "RocksDB WAL fsync on (rocksdb-disable-wal-fsync=false)"
        )
    finally:
        common.stop(svc)
        common.stop(srv, timeout=30)
    res["client"] = args.client
    res["deployment"] = deployment
    common.write_result("restate" + ("-httpx" if args.client == "httpx" else ""), args, res)
    if not args.keep_data:
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
