"""``python -m bench console``: how fast the web console's pages render, in headless
Chromium, against a real stack with a large run index and a long run log.

Set-up: a nats-server, the orchestrator, an echo worker and the gateway on a socket; one
real run of a loop workflow whose log holds ``--records`` records (5,000 by default), and
the run index filled up to ``--runs`` entries (10,000 by default; the extra entries are
written to the index bucket in the shape the orchestrator writes).

Measured, best and median of ``--rounds`` page loads each (a fresh tab each time):

- the runs page: from navigation to the first page of 50 runs in the table;
- the run page: from navigation to its first paint (header, the diagram of its workflow,
  and the timeline's newest 200 records, the only page of the log it reads), and to the
  page complete (the run's status and its current state on the diagram); both for a load
  whose log the gateway has not read yet (as after a start:
  the gateway's kept logs are dropped before it) and for a load after it; then to the
  guards from ``explain`` given to the timeline, and from a click on "Earlier records" to
  the page before drawn;
- the baseline in the same run: the same API answers fetched by the same browser without
  drawing anything (``fetch`` of ``/runs?limit=50``, and of the description and the whole
  log), so the ratio says what the console adds to what the API costs.

These times are taken by the benchmark's process, which drives the browser through
Playwright: each wait for an element is a round trip to the browser and back, tens of
milliseconds when the machine is busy. The page's own clock is given too ("in the page"):
from the start of the navigation to the marks the pages set once the rows, the first
paint or the complete page are in the document.

The target is under 1 s for each page. Needs Chromium (``apt-get install chromium``) and
Playwright (``pip install -e '.[dev]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TARGET_S = 1.0
FIRST_DRAWN = 200
"""Records the run page draws at once (the timeline's first chunk)."""

LOOPER = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: looper}
spec:
  budget: {max_actions: 100000, max_transitions: 100000}
  initial_state: poll
  states:
    poll:
      loop:
        until: iteration >= ITERATIONS
        max_iterations: ITERATIONS
        action:
          capability: echo
          input: {iteration: "{{ iteration }}"}
      on:
        - {event: task.completed, guard: "result.iteration > 0", goto: done}
    done:
      type: terminal
      outputs: {last: "$.states.poll.output.iteration"}
"""
AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: bench}
spec:
  capabilities:
    - name: echo
"""


async def _fill_index(js: Any, bucket: str, n: int) -> None:
    kv = await js.key_value(bucket)
    statuses = ("completed", "failed", "cancelled", "running")
    base = time.time() - n
    batch = 500
    for start in range(0, n, batch):
        puts = []
        for i in range(start, min(start + batch, n)):
            run_id = f"rbench{i:019d}"
            at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + i))
            entry = {
                "run_id": run_id,
                "workflow": "looper",
                "namespace": "default",
                "version": 1,
                "status": statuses[i % 4],
                "state": "done" if i % 4 != 3 else "poll",
                "started_at": f"{at}.000Z",
                "updated_at": f"{at}.500Z",
                "seq": 3,
            }
            puts.append(kv.put(run_id, json.dumps(entry).encode()))
        await asyncio.gather(*puts)


async def _stack(url: str, records: int, runs: int) -> dict[str, Any]:
    """Everything up; the long run finished; the index filled."""
    import nats

    from interlock.client import Client
    from interlock.gateway.app import build_app
    from interlock.gateway.service import Gateway
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.service import Orchestrator
    from interlock.sdk import TaskContext, Worker
    from interlock.transport.httpserver import HttpServer
    from interlock.transport.subjects import Subjects

    subjects = Subjects(prefix=f"b{uuid.uuid4().hex[:8]}")
    conns = [await nats.connect(url) for _ in range(4)]
    ops = InterlockClient(conns[0], subjects)
    await ops.ensure_provisioned()
    looper = LOOPER.replace("ITERATIONS", str(max(1, (records - 4) // 2)))
    applied = await ops.apply([("looper.yaml", looper), ("agent.yaml", AGENT)])
    applied.compiled.raise_for_errors()
    orchestrator = Orchestrator(conns[1], subjects)
    await orchestrator.start()
    worker = Worker("bench", concurrency=8)

    @worker.capability("echo")
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return inp

    worker_task = asyncio.create_task(worker.run(conns[2], prefix=subjects.prefix))
    await worker.wait_ready()
    gateway = Gateway(conns[3], subjects)
    await gateway.start()
    server = HttpServer(build_app(gateway), 0)
    await server.start()
    token = await gateway.tokens.issue("bench", "operator")
    client = Client(conns[0], subjects)
    started = time.perf_counter()
    run_id = await client.start("looper", {})
    await client.result(run_id, wait=True, timeout=600)
    made = time.perf_counter() - started
    log = await client.records(run_id)
    await _fill_index(ops.js, subjects.runs_bucket, runs - 1)
    listed = len(await client.runs())

    async def stop() -> None:
        await server.stop()
        await gateway.stop()
        await worker.stop(force=True)
        await worker_task
        await orchestrator.stop()
        for nc in conns:
            await nc.close()

    return {
        "url": server.url,
        "token": token,
        "run_id": run_id,
        "records": len(log),
        "runs": listed,
        "made_s": made,
        "stop": stop,
        "subjects": subjects,
        "forget": gateway.run_logs.forget,
    }


async def _drawn(page: Any, last: int, t0: float) -> tuple[float, float]:
    """Seconds from ``t0`` to the run page's first paint (its header, the diagram of its
    workflow and the timeline's first records: the rest is drawn as the reader scrolls),
    and to the page complete (the run's status, and its path on the diagram, which need
    the whole log)."""
    await page.locator("svg.diagram").wait_for(state="attached")
    await page.locator(f"#rec-{last}").wait_for(state="attached")
    painted = time.perf_counter() - t0
    await page.locator("svg.diagram .node.current").wait_for(state="attached")
    await page.locator(".title-row .status").wait_for(state="attached")
    return painted, time.perf_counter() - t0


async def _marks(page: Any, out: dict[str, list[float]], prefix: str) -> None:
    """Where the run page's time went, from the marks it sets."""
    marks = await page.evaluate(
        """() => Object.fromEntries(performance.getEntriesByType('mark')
             .map(m => [m.name, m.startTime / 1000]))"""
    )
    marks["navigation"] = 0.0
    for name, a, b in (
        ("loading the modules", "navigation", "run:start"),
        ("fetching the first page", "run:start", "run:fetched"),
        ("building", "run:fetched", "run:built"),
        ("the diagram's version, drawn", "run:built", "run:painted"),
        ("to complete", "run:built", "run:complete"),
        ("in the page: first paint", "navigation", "run:painted"),
        ("in the page: complete", "navigation", "run:complete"),
    ):
        if a in marks and b in marks:
            out.setdefault(prefix + name, []).append(marks[b] - marks[a])


async def _fetch_run(page: Any, env: dict[str, Any]) -> float:
    """The run page's data fetched by the browser, drawing nothing: the description and
    the whole log."""
    seconds: float = await page.evaluate(
        """async ([token, id]) => {
          const h = {headers: {Authorization: 'Bearer ' + token}};
          const t0 = performance.now();
          await Promise.all([
            fetch('/runs/' + id, h).then(r => r.json()),
            fetch('/runs/' + id + '/log?limit=5000', h).then(r => r.json()),
          ]);
          return (performance.now() - t0) / 1000;
        }""",
        [env["token"], env["run_id"]],
    )
    return seconds


async def _open_run(
    context: Any, url: str, last: int, out: dict[str, list[float]], label: str
) -> tuple[Any, float]:
    """A new page on a run, timed until it is drawn and its explanation has arrived: its
    first paint and complete times (named with ``label``), its marks; (the page, when the
    navigation started)."""
    page = await context.new_page()
    async with page.expect_response(
        lambda r: r.url.endswith("/explain"), timeout=300_000
    ) as explained:
        t0 = time.perf_counter()
        await page.goto(url)
        painted, complete = await _drawn(page, last, t0)
        out[f"run page, {label}first paint"].append(painted)
        out[f"run page, {label}complete" if label else "run page"].append(complete)
        await _marks(page, out, f"  {label}")
    await explained.value
    return page, t0


async def _measure(env: dict[str, Any], chromium: str, rounds: int) -> dict[str, list[float]]:
    from playwright.async_api import async_playwright

    out: dict[str, list[float]] = {
        "runs page": [],
        "runs API (fetch)": [],
        "run page, first paint": [],
        "run page": [],
        "run page, first load: first paint": [],
        "run page, first load: complete": [],
        "run page + guards": [],
        "Earlier records: click to the page before": [],
        "run API (fetch)": [],
        "run API (fetch), first read": [],
    }
    ui = f"{env['url']}/ui/"
    run_id = env["run_id"]
    last = env["records"]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        # bypass_csp: Playwright's waits for a condition evaluate it in the page, which the
        # console's Content-Security-Policy (no eval) would refuse.
        context = await browser.new_context(
            viewport={"width": 1280, "height": 800}, bypass_csp=True
        )
        context.set_default_timeout(60_000)
        await context.add_init_script(
            f"sessionStorage.setItem('interlock.token', {env['token']!r})"
        )
        warm = await context.new_page()
        await warm.goto(ui)
        await warm.locator("#runs-listing tbody tr").first.wait_for()
        await warm.close()
        for _ in range(rounds):
            page = await context.new_page()
            t0 = time.perf_counter()
            await page.goto(f"{ui}#/runs")
            await page.locator("#runs-listing tbody tr:nth-child(50)").wait_for()
            out["runs page"].append(time.perf_counter() - t0)
            shown = await page.evaluate(
                "() => performance.getEntriesByName('runs:shown')[0]?.startTime / 1000"
            )
            if shown is not None:
                out.setdefault("  in the page: runs shown", []).append(shown)
            slowest = await page.evaluate(
                """() => performance.getEntriesByType('resource')
                     .map(e => [e.duration / 1000, new URL(e.name).pathname])
                     .sort((a, b) => b[0] - a[0]).slice(0, 3)"""
            )
            for seconds, name in slowest:
                out.setdefault(f"  {name}", []).append(seconds)
            fetched = await page.evaluate(
                """async (token) => {
                  const t0 = performance.now();
                  const h = {headers: {Authorization: 'Bearer ' + token}};
                  const r = await fetch('/runs?limit=50', h);
                  await r.json();
                  return (performance.now() - t0) / 1000;
                }""",
                env["token"],
            )
            out["runs API (fetch)"].append(fetched)
            await page.close()

            # The first load of the run after the gateway started: its log not read yet.
            env["forget"]()
            page, _ = await _open_run(context, f"{ui}#/runs/{run_id}", last, out, "first load: ")
            env["forget"]()
            out["run API (fetch), first read"].append(await _fetch_run(page, env))
            await page.close()

            page, t0 = await _open_run(context, f"{ui}#/runs/{run_id}", last, out, "")
            await page.wait_for_function("performance.getEntriesByName('run:explained').length > 0")
            out["run page + guards"].append(time.perf_counter() - t0)
            # The page before the newest ("Earlier records"), from the same navigation.
            clicked = time.perf_counter()
            if last > FIRST_DRAWN:
                await page.locator("#timeline-earlier").click()
                first = max(1, last - 2 * FIRST_DRAWN + 1)
                await page.locator(f"#rec-{first}").wait_for(state="attached")
                out["Earlier records: click to the page before"].append(
                    time.perf_counter() - clicked
                )
            out["run API (fetch)"].append(await _fetch_run(page, env))
            await page.close()
        await browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench console", description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000, help="entries in the run index")
    parser.add_argument("--records", type=int, default=5_000, help="records of the long run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium: apt-get install chromium", file=sys.stderr)
        return 2

    from interlock.runtime.embedded import EmbeddedNats

    async def go(url: str) -> tuple[dict[str, Any], dict[str, list[float]]]:
        env = await _stack(url, args.records, args.runs)
        try:
            return env, await _measure(env, chromium, args.rounds)
        finally:
            await env["stop"]()

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedNats(Path(data))
        server.start()
        try:
            env, got = asyncio.run(go(server.url))
        finally:
            server.stop()
    load = (load_before, os.getloadavg()[0])
    summary = {
        name: {"best_s": min(v), "median_s": statistics.median(v)} for name, v in got.items()
    }
    if args.json:
        print(
            json.dumps(
                {"runs": env["runs"], "records": env["records"], "load": load, "pages": summary}
            )
        )
        return 0
    print(
        f"run index: {env['runs']} runs; long run: {env['records']} records "
        f"(made by the engine in {env['made_s']:.1f} s); {args.rounds} rounds, fresh tab each; "
        f"load average {load[0]:.1f} before, {load[1]:.1f} after ({os.cpu_count()} cores)"
    )
    for name, s in summary.items():
        print(f"{name:34} best {s['best_s'] * 1000:7.0f} ms  median {s['median_s'] * 1000:7.0f} ms")
    pairs = (
        ("runs page", "runs API (fetch)"),
        ("run page", "run API (fetch)"),
        ("run page, first load: first paint", "run API (fetch), first read"),
        ("run page, first load: complete", "run API (fetch), first read"),
    )
    for page, api in pairs:
        ratio = summary[page]["median_s"] / summary[api]["median_s"]
        verdict = "under" if summary[page]["median_s"] < TARGET_S else "OVER"
        print(f"{page}: x{ratio:.1f} the API's own time; {verdict} the {TARGET_S:g} s target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
