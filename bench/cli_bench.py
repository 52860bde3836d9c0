"""``python -m bench cli``: how long the CLI's read commands take against a running
``interlock dev``, beside baselines measured in the same run.

It starts ``interlock dev`` (its own nats-server with authentication on, the orchestrator
and the reference agents) in a temporary folder, applies examples/code-review.yaml, starts
a run that goes on to wait for an approval, and then runs each command ``--repeat`` times
from that folder (so each connects with the operator's credentials, as a user there would).
After one warm-up round, for each command it prints the median and the best wall time and
CPU time (user + system), the median wall time as a ratio to two baselines, and how many
modules the command imports (exact, where times are not):

- ``python -c pass``: starting Python at all;
- ``import nats``: Python importing asyncio and nats-py, nothing more (the import floor of
  any command that talks to NATS);
- ``nats-py connect``: a script that imports nats-py and connects with the same credentials
  (what any command that talks to NATS cannot avoid).

``--instructions`` also counts the instructions of one run of each command with valgrind's
callgrind (when valgrind is installed): a count a loaded machine does not skew, unlike
times (docs/architecture.md, "What a read command costs", quotes them).

``--baseline PATH`` names the ``interlock`` executable of another installation (a checkout
of an earlier commit with its own virtual environment, say): each command is then run with
it too, in the same interleaved rounds, so before and after are measured under the same
load.

The target is 0.15 s of wall time for ``--help`` and for each read command. The machines
are shared: the ratios, measured in the same run, say more than the absolute times.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "code-review.yaml"
TARGET_S = 0.15

CONNECT = """\
import asyncio, sys
import nats

async def main():
    nc = await nats.connect(sys.argv[1], user_credentials=sys.argv[2])
    await nc.close()

asyncio.run(main())
"""


def _once(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``; a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _modules(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """How many modules one run of ``argv`` imports (exact, unlike its time)."""
    done = subprocess.run(
        argv, cwd=cwd, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True, check=False
    )
    return done.stderr.count(b"import time:") - 1  # less the header line


def _instructions(argv: list[str], cwd: Path, env: dict[str, str]) -> int:
    """How many instructions one run of ``argv`` executes (valgrind's callgrind)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return int(found.group(1))


def _dev(folder: Path, env: dict[str, str], interlock: str) -> tuple[subprocess.Popen[str], str]:
    """``interlock dev`` on free ports in ``folder``; returns it and its NATS URL once the
    orchestrator runs."""
    proc = subprocess.Popen(
        [interlock, "dev", "--port", "0", "--http-port", "0"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    url = None
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        found = re.search(r"export INTERLOCK_URL=(\S+)", line)
        url = found.group(1) if found else url
        if line.startswith("orchestrator running") and url:
            return proc, url
        if time.monotonic() > deadline:
            break
    proc.terminate()
    raise SystemExit("interlock dev did not start")


def _run_waiting(folder: Path, env: dict[str, str], interlock: str) -> str:
    """A run of code-review that reaches its approval state (so it has a long log)."""
    subprocess.run([interlock, "apply", str(EXAMPLE)], cwd=folder, env=env, check=True)
    run_id = subprocess.run(
        [interlock, "start", "code-review", "--input", '{"repository": "a/b", "pr": 1}'],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            [interlock, "get", "run", run_id, "-o", "json"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if '"approval"' in state:
            return run_id
        time.sleep(0.2)
    raise SystemExit(f"run {run_id} never reached its approval state")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cli")
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command")
    parser.add_argument(
        "--baseline",
        metavar="PATH",
        help="another installation's interlock executable, measured beside this one",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count each command's instructions once with valgrind (slow: about 10 s each)",
    )
    args = parser.parse_args(argv)
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")

    python = sys.executable
    interlock = str(Path(python).with_name("interlock"))
    started_load = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="interlock-bench-cli-"))
    # As installed: Python may cache bytecode (the warm-up round below writes what is
    # missing), and nothing of the caller's INTERLOCK_* settings leaks in.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("INTERLOCK_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    dev, url = _dev(folder, env, interlock)
    try:
        env["INTERLOCK_URL"] = url
        run_id = _run_waiting(folder, env, interlock)
        creds = str(folder / ".interlock" / "creds" / "operator.creds")
        commands = [
            ("--help", ["--help"]),
            ("runs", ["runs"]),
            ("get run RUN", ["get", "run", run_id]),
            ("logs RUN", ["logs", run_id]),
            ("describe run RUN", ["describe", "run", run_id]),
            ("workflows", ["workflows"]),
        ]
        cases = [
            ("python -c pass", [python, "-c", "pass"]),
            ("import nats", [python, "-c", "import asyncio, nats"]),
            ("nats-py connect", [python, "-c", CONNECT, url, creds]),
        ]
        for name, rest in commands:
            cases.append((f"interlock {name}", [interlock, *rest]))
            if args.baseline:
                cases.append((f"  baseline {name}", [args.baseline, *rest]))
        # Interleaved rounds: a burst of load on the shared machine spreads over every
        # command instead of landing on one.
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cases}
        for _, command in cases:
            _once(command, folder, env)  # warm-up: bytecode written, files in the page cache
        modules = {name: _modules(command, folder, env) for name, command in cases}
        counted = (
            {name: _instructions(command, folder, env) for name, command in cases}
            if args.instructions
            else {}
        )
        for _ in range(args.repeat):
            for name, command in cases:
                samples[name].append(_once(command, folder, env))
    finally:
        dev.terminate()
        try:
            dev.wait(30)
        except subprocess.TimeoutExpired:
            dev.kill()
        shutil.rmtree(folder, ignore_errors=True)

    def median_wall(name: str) -> float:
        return statistics.median(w for w, _ in samples[name])

    floor, connect = median_wall("python -c pass"), median_wall("nats-py connect")
    header = f"{'command':28} {'wall median':>11} {'best':>7} {'cpu median':>10} {'best':>6}"
    print(f"{header}  vs python  vs connect  modules" + ("  M instr" if counted else ""))
    over = []
    for name, _ in cases:
        walls = [w for w, _ in samples[name]]
        cpus = [c for _, c in samples[name]]
        wall = statistics.median(walls)
        print(
            f"{name:28} {wall * 1000:8.0f} ms {min(walls) * 1000:4.0f} ms "
            f"{statistics.median(cpus) * 1000:7.0f} ms {min(cpus) * 1000:3.0f} ms  "
            f"x{wall / floor:8.1f}  x{wall / connect:8.2f}  {modules[name]:7}"
            + (f"  {counted[name] / 1e6:7.0f}" if counted else "")
        )
        if name.startswith("interlock") and wall > TARGET_S:
            over.append(name)
    load = os.getloadavg()[0]
    print(
        f"load average {started_load:.1f} at the start, {load:.1f} at the end, on "
        f"{os.cpu_count()} cores; target {TARGET_S} s wall"
    )
    if over:
        print("over the target: " + ", ".join(over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
