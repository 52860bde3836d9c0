"""DBOS Transact (Python) with its SQLite system database.

Workflow `approval` = @DBOS.workflow with two @DBOS.step calls (review, then merge or fix).
DBOS is a library: the engine runs inside this process, steps execute in-process and every
workflow start, step output and workflow result is written to the system database
(SQLite file; DBOS does not change SQLite's defaults: rollback journal, synchronous=FULL,
i.e. fsync on every commit).

Modes:
  --mode async (default): async workflow/steps, the driver awaits `approval(...)` directly;
                          200 in flight = 200 concurrent asyncio tasks.
  --mode sync:            plain def workflow/steps; each run is called in a thread of a
                          200-thread pool (DBOS's documented sync style).

Usage: $PEERS/venv-dbos/bin/python dbos_sqlite.py --label r1 [--mode sync]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import sqlite3
import sys
from importlib.metadata import version as _ver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from dbos import DBOS, DBOSConfig


# ---- async flavour ------------------------------------------------------
@DBOS.step()
async def review_a(n: int) -> dict:
    return {"score": 8}


@DBOS.step()
async def merge_a() -> dict:
    return {"merged": True}


@DBOS.step()
async def fix_a() -> dict:
    return {"merged": False}


@DBOS.workflow()
async def approval_a(inp: dict) -> dict:
    r = await review_a(inp["n"])
    m = await (merge_a() if r["score"] > 7 else fix_a())
    return {"merged": m["merged"]}


# ---- sync flavour -------------------------------------------------------
@DBOS.step()
def review_s(n: int) -> dict:
    return {"score": 8}


@DBOS.step()
def merge_s() -> dict:
    return {"merged": True}


@DBOS.step()
def fix_s() -> dict:
    return {"merged": False}


@DBOS.workflow()
def approval_s(inp: dict) -> dict:
    r = review_s(inp["n"])
    m = merge_s() if r["score"] > 7 else fix_s()
    return {"merged": m["merged"]}


def main() -> None:
    def extra(p):
        p.add_argument("--mode", choices=["async", "sync"], default="async")
        p.add_argument("--keep-data", action="store_true")

    args = common.parse_args("dbos", extra)
    wd = common.workdir_for(args, "dbos")
    db = wd / "dbos_sys.sqlite"
    config: DBOSConfig = {
        "name": "peerbench",
        "system_database_url": f"sqlite:///{db}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)

    if args.mode == "async":

        async def run_one(i: int) -> dict:
            return await approval_a({"n": i})

        res = asyncio.run(common.measure_async(run_one, args))
    else:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.inflight)

        async def run_one(i: int) -> dict:
            return await asyncio.get_running_loop().run_in_executor(pool, approval_s, {"n": i})

        res = asyncio.run(common.measure_async(run_one, args))
        pool.shutdown()

    con = sqlite3.connect(str(db))
    wf = con.execute("select status, count(*) from workflow_status group by status").fetchall()
    ops = con.execute("select count(*) from operation_outputs").fetchone()[0]
    jm = con.execute("pragma journal_mode").fetchone()[0]
    con.close()
    total_runs = args.warmup + args.seq + res["tp_ok"]
    res["durable_records"] = {
        "workflow_status": dict(wf),
        "operation_outputs": ops,
        "expected_workflows": total_runs,
        "expected_step_rows": 2 * total_runs,
    }
    res["rss_mib"] = {"engine+driver (in-process library)": common.self_peak_rss_mib()}
    res["peak_rss_engine_mib"] = res["rss_mib"]["engine+driver (in-process library)"]
    res["versions"] = {
        "dbos": _ver("dbos"),
        "sqlalchemy": _ver("sqlalchemy"),
        "sqlite": sqlite3.sqlite_version,
    }
    res["durability"] = (
        f"SQLite system DB, journal_mode={jm}, synchronous=FULL (SQLite default; DBOS sets no PRAGMA)"
    )
    res["mode"] = args.mode
    DBOS.destroy()
    common.write_result("dbos" + ("-sync" if args.mode == "sync" else ""), args, res)
    if not args.keep_data:
        shutil.rmtree(wd, ignore_errors=True)


if __name__ == "__main__":
    main()
