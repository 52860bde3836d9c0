"""``python -m bench runlist``: the gateway's run list over a small and a large run index.

For each size, a fresh nats-server's run index is filled with that many entries (written
straight into the bucket as the relay writes them, with their listing keys: 1 run in 100
failed, the rest completed, over 10 workflows). Then a process of its own does what a
gateway does with the run list: connects, makes its ``RunList`` and answers the first
``GET /runs`` page (its start), then pages of 50 (newest first), filtered pages of 50
(one workflow, status failed: 1 run in 1,000), pages of one workflow (1 run in 10) and
pages at offset 5,000, each timed 30 times. Reported per size, and as ratios to
the smallest size measured in the same run: the start, the p50 of each page, and the
process's resident memory (RSS) after them.

Goal: at the largest size, each within 1.5x of the smallest's (RSS: within 1.2x).

    python -m bench runlist [--sizes 10000,1000000] [--pages 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELLO = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: wf0}
spec:
  initial_state: done
  states:
    done: {type: terminal}
"""

PROBE = """
import asyncio, json, sys, time
t0 = time.perf_counter()
from interlock.gateway.runlist import RunList
import nats
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0

async def main(url, pages):
    started = time.perf_counter()
    nc = await nats.connect(url)
    runs = RunList(jetstream(nc), Subjects())
    first, _ = await runs.page(limit=50)
    start_ms = (time.perf_counter() - started) * 1000
    def timed(**kw):
        async def one():
            t = time.perf_counter()
            found, _ = await runs.page(**kw)
            return (time.perf_counter() - t) * 1000
        return one
    page = [await timed(limit=50)() for _ in range(pages)]
    filtered = [await timed(workflow="wf3", status="failed", limit=50)() for _ in range(pages)]
    by_workflow = [await timed(workflow="wf3", limit=50)() for _ in range(pages)]
    deep = [await timed(offset=5000, limit=50)() for _ in range(pages)]
    print(json.dumps({
        "start_ms": start_ms,
        "page_p50_ms": sorted(page)[len(page) // 2],
        "filtered_p50_ms": sorted(filtered)[len(filtered) // 2],
        "workflow_p50_ms": sorted(by_workflow)[len(by_workflow) // 2],
        "offset5000_p50_ms": sorted(deep)[len(deep) // 2],
        "rss_mib": rss_mib(),
    }))
    await nc.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def _fill(url: str, size: int) -> float:
    import nats

    from interlock.runtime.runlisting import put_entries
    from interlock.transport.subjects import Subjects

    nc = await nats.connect(url)
    subjects = Subjects()
    began = time.perf_counter()
    batch = 1000
    for first in range(0, size, batch):
        await put_entries(
            nc,
            subjects,
            [
                {
                    "run_id": f"r{i:08d}",
                    "workflow": f"wf{i % 10}",
                    "namespace": "default",
                    "version": 1,
                    "status": "failed" if i % 100 == 3 else "completed",
                    "state": "done",
                    "started_at": f"2026-01-01T00:00:00.{i:06d}Z",
                    "updated_at": f"2026-01-01T00:00:00.{i:06d}Z",
                }
                for i in range(first, min(size, first + batch))
            ],
        )
    await nc.close()
    return time.perf_counter() - began


async def _provision(url: str, folder: Path) -> None:
    from interlock import Client

    client = await Client.connect(url)
    (folder / "wf.yaml").write_text(HELLO)
    await client.apply([folder / "wf.yaml"])
    await client.close()


def _probe(url: str, pages: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, url, str(pages)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _bench(sizes: list[int], pages: int) -> int:
    from interlock.runtime.embedded import EmbeddedNats

    results: dict[int, dict[str, float]] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            server = EmbeddedNats(Path(tmp) / "nats")
            server.start()
            try:
                asyncio.run(_provision(server.url, Path(tmp)))
                took = asyncio.run(_fill(server.url, size))
                print(f"{size:,} entries written in {took:.1f} s", flush=True)
                _probe(server.url, 3)  # warm the server's caches
                results[size] = _probe(server.url, pages)
            finally:
                server.stop()
    base = results[sizes[0]]
    print(f"\n{'runs':>10} " + " ".join(f"{k:>22}" for k in base) + "   (/ first)")
    for size, found in results.items():
        cells = " ".join(f"{v:>12.2f} ({v / base[k]:>5.2f}x)" for k, v in found.items())
        print(f"{size:>10,} {cells}")
    last = results[sizes[-1]]
    met = all(last[k] / base[k] <= (1.2 if k == "rss_mib" else 1.5) for k in base if base[k] > 0)
    print(f"goals (each <= 1.5x at {sizes[-1]:,}, RSS <= 1.2x): {'met' if met else 'NOT met'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench runlist", description=__doc__)
    parser.add_argument("--sizes", default="10000,1000000", help="runs in the index")
    parser.add_argument("--pages", type=int, default=30, help="pages timed per kind")
    args = parser.parse_args(argv)
    return _bench([int(s) for s in args.sizes.split(",")], args.pages)


if __name__ == "__main__":
    sys.exit(main())
