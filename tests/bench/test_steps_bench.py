"""``python -m bench steps`` on a few runs: every step of a run found, in every run, timed.

The suite runs as a user runs it (a process of its own: nats-server, ``interlock serve`` and
the worker started by ``bench/peers/interlock_bench.py``, the tracer on their
``PYTHONPATH``). A step the tracer stops seeing (a message not written through asyncio's
streams any more, a subject or header it matches by that changed) leaves runs unmatched,
and this fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = 20
PROCESSES = ("orchestrator", "worker", "server/wire")
ROW = re.compile(
    r"^  (?P<step>\S.*?\S)\s+(?P<where>orchestrator|worker|server/wire)\s+"
    r"(?P<p50>-?[\d.]+|nan)\s+(?P<p25>-?[\d.]+|nan)\s+(?P<p75>-?[\d.]+|nan)$"
)


def test_every_step_of_every_run_is_timed() -> None:
    wrap = "interlock.transport.natsclient:NatsClient.publish_nowait,interlock.nowhere:f"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "steps",
            "--runs",
            str(RUNS),
            "--warmup",
            "5",
            "--wrap",
            wrap,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    rows = [m for line in out.splitlines() if (m := ROW.match(line))]
    steps = [m["step"] for m in rows]
    assert len(steps) == 17, out
    assert len(set(steps)) == len(steps), out
    assert {m["where"] for m in rows} == set(PROCESSES), out
    for m in rows:
        p50, p25, p75 = float(m["p50"]), float(m["p25"]), float(m["p75"])
        assert 0 < p25 <= p50 <= p75 < 1_000_000, m.group(0)
    assert f"runs matched (this, per round): {RUNS}/{RUNS}\n" in out, out
    total = re.search(r"sum of the medians\s+(\d+)", out)
    whole = re.search(r"whole run \(trigger -> completion\)\s+(\d+)", out)
    assert total, out
    assert whole, out
    assert int(total[1]) > 0
    assert int(whole[1]) > 0
    # --wrap: a function that is there is timed in every process that calls it; one that
    # is not is named, and the rest is traced all the same
    calls = re.findall(r"^  (\w+)\s+NatsClient\.publish_nowait\s+([\d.]+) calls", out, re.M)
    assert {role for role, _ in calls} >= {"orchestrator", "worker"}, out
    assert all(float(n) >= 1 for _, n in calls), out
    assert "not wrapped (this): interlock.nowhere:f: no process imported it" in out, out
