"""Peers comparison: the "approval" workload on Interlock beside raw NATS and other engines.

Runs the harness in ``bench/peers`` (one driver per system, each with its own virtualenv
made by ``bench/peers/install.sh``) round by round, then prints every system's p50, p99 and
runs/s as ratios to raw NATS of the same round, Interlock's stream writes per run, and the
CPU per run (every process of the system, and Interlock's orchestrator alone), then the
goals per round and over the rounds (three by default: one round on a shared machine
moves by tens of percent), and what a flow-control limit that does not bind costs: runs/s
beside CPU per run, median and spread over the rounds. Each round starts, after raw NATS,
one system further on than the last (``--fixed-order``: always the same order). Peers
that are not installed under ``$PEERS`` are skipped with
a note; raw NATS is needed for the ratios. Interlock runs from this checkout's venv
(``sys.executable``); ``--baseline-venv`` also runs another checkout's venv beside it, each
of Interlock's systems right after its twin, as ``interlock-base`` (``interlock-base-fsync``,
``interlock-base-cap-concurrency``...).

    python -m bench peers      # 3 rounds of nats-raw, interlock, their fsync twins, restate
    python -m bench peers --only "nats-raw interlock" --rounds "r1 r2"
    python -m bench peers --only "nats-raw interlock interlock-limited"   # flow control's cost
    python -m bench peers --only "nats-raw interlock interlock-partitioned" --partitions 4
    python -m bench peers --only "nats-raw interlock interlock-cap-concurrency interlock-cap-rate"
    PEERS=/path/to/peers python -m bench peers --baseline-venv /path/to/other/.venv
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "peers"
DEFAULT_ONLY = "nats-raw interlock nats-raw-fsync interlock-fsync restate"
RESTATE_BIN = "restate-node/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
TIMEOUT_S = 900


@dataclass(frozen=True)
class System:
    name: str
    python: Path
    script: str
    args: tuple[str, ...] = ()
    needs: tuple[Path, ...] = ()

    def missing(self) -> str | None:
        for path in (self.python, *self.needs):
            if not path.exists():
                return f"{path} not found"
        return None


def systems(
    peers: Path, interlock: Path, baseline: Path | None, partitions: int = 4
) -> list[System]:
    """Every system the harness knows, in the order a round runs them (``partitions``:
    the run-log partitions of ``interlock-partitioned``)."""
    nats = peers / "venv-nats/bin/python"
    restate = peers / "venv-restate/bin/python"
    found = [
        System("nats-raw", nats, "nats_raw.py"),
        System("interlock", interlock, "interlock_bench.py"),
        # The same workflow with a concurrency limit it never reaches (200 runs in flight).
        System(
            "interlock-limited",
            interlock,
            "interlock_bench.py",
            ("--system", "interlock-limited", "--limit", "100000"),
        ),
        # Each capability with a concurrency limit, then a rate, it never reaches (at most
        # 200 requests at work; some 1,000 requests a second).
        System(
            "interlock-cap-concurrency",
            interlock,
            "interlock_bench.py",
            ("--system", "interlock-cap-concurrency", "--cap-concurrency", "100000"),
        ),
        System(
            "interlock-cap-rate",
            interlock,
            "interlock_bench.py",
            ("--system", "interlock-cap-rate", "--cap-rate", "100000"),
        ),
        System("nats-raw-fsync", nats, "nats_raw.py", ("--fsync", "always")),
        System("interlock-fsync", interlock, "interlock_bench.py", ("--fsync", "always")),
        System("dbos", peers / "venv-dbos/bin/python", "dbos_sqlite.py"),
        System("dbos-sync", peers / "venv-dbos/bin/python", "dbos_sqlite.py", ("--mode", "sync")),
        System("restate", restate, "restate_bench.py", (), (peers / RESTATE_BIN,)),
        System("temporal", peers / "venv-temporal/bin/python", "temporal_bench.py"),
        # The same with its run logs spread over several streams, one replica relaying all.
        System(
            "interlock-partitioned",
            interlock,
            "interlock_bench.py",
            ("--system", "interlock-partitioned", "--partitions", str(partitions)),
        ),
    ]
    if baseline is not None:
        # Each of Interlock's systems again on the other checkout, right after it:
        # interlock-base, interlock-base-cap-concurrency, interlock-base-fsync...
        python = baseline / "bin/python"
        twins: list[System] = []
        for system in found:
            twins.append(system)
            if system.python != interlock:
                continue
            name = "interlock-base" + system.name.removeprefix("interlock")
            args = list(system.args)
            if "--system" in args:
                args[args.index("--system") + 1] = name
            else:
                args = ["--system", name, *args]
            twins.append(System(name, python, system.script, tuple(args), system.needs))
        found = twins
    return found


def isolate() -> list[str]:
    """A fresh network namespace with loopback only, where allowed (restate-server asks
    the internet for its latest version at every start)."""
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        return ["unshare", "--net", "--", "bash", "-c", 'ip link set lo up && exec "$@"', "x"]
    return []


def run_one(system: System, label: str, results: Path, peers: Path, extra: list[str]) -> bool:
    env = dict(os.environ, PEERS=str(peers), PEERS_RESULTS=str(results))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [*isolate(), str(system.python), system.script, *system.args, "--label", label, *extra]
    print(f"=== {time.strftime('%H:%M:%S')} {system.name} {label}", flush=True)
    try:
        done = subprocess.run(
            cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        print(f"    timed out after {TIMEOUT_S} s")
        return False
    for line in done.stdout.splitlines():
        if line.startswith(("sequential", "throughput")):
            print("    " + line)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        print("    failed:\n      " + "\n      ".join(tail))
        return False
    return True


def load(results: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        out[(data["system"], data["label"])] = data
    return out


def writes_per_run(result: dict[str, Any]) -> float | None:
    streams = result.get("durable_records", {}).get("streams")
    if not streams:
        return None
    return sum(s["writes_per_run"] for n, s in streams.items() if not n.startswith("KV_il_w"))


def cpu_per_run(
    result: dict[str, Any], process: str | None = None, *, phase: str = "throughput"
) -> float | None:
    """Milliseconds of CPU per run during the throughput (or the sequential) phase: of
    every process of the system (engine, workers, service, driver), or of one
    (``orchestrator``)."""
    cpu = result.get(f"cpu_s_{phase}") or {}
    runs = result.get("tp_runs" if phase == "throughput" else "seq_n") or 0
    if not cpu or not runs:
        return None
    if process is not None:
        return cpu[process] * 1000 / runs if process in cpu else None
    return sum(cpu.values()) * 1000 / runs


def messages_per_run(result: dict[str, Any]) -> float | None:
    """NATS messages per run through the server, both directions, summed over the
    system's client connections (Interlock's drivers report them; others do not)."""
    conns = result.get("nats_messages_per_run")
    if not conns:
        return None
    return sum(c["in_per_run"] + c["out_per_run"] for c in conns.values())


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(found: dict[tuple[str, str], dict[str, Any]], order: list[str]) -> str:
    head = "| system | round | p50 ms | p99 ms | runs/s | p50 x NATS | p99 x NATS | runs/s / NATS |"
    head += " writes/run | NATS msgs/run | CPU ms/run | orchestrator CPU ms/run |"
    head += " worker CPU ms/run | sequential CPU ms/run |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    labels = sorted({label for _, label in found})
    for label in labels:
        base = found.get(("nats-raw", label))
        for name in order:
            r = found.get((name, label))
            if r is None:
                continue

            def ratio(key: str, r: dict[str, Any] = r, base: dict[str, Any] | None = base) -> str:
                return f"{r[key] / base[key]:.2f}" if base and base[key] else "-"

            writes = writes_per_run(r)
            msgs = messages_per_run(r)
            lines.append(
                f"| {name} | {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['runs_per_s']:,.0f} | {ratio('p50_ms')} | {ratio('p99_ms')} | "
                f"{ratio('runs_per_s')} | {'-' if writes is None else f'{writes:.2f}'} | "
                f"{'-' if msgs is None else f'{msgs:.1f}'} | "
                f"{_ms(cpu_per_run(r))} | {_ms(cpu_per_run(r, 'orchestrator'))} | "
                f"{_ms(cpu_per_run(r, 'worker'))} | {_ms(cpu_per_run(r, phase='sequential'))} |"
            )
    return "\n".join(lines)


GOALS: list[tuple[str, str, str, str, Callable[[float], bool], str]] = [
    # (what, system, compared with, figure, the goal, the goal in words)
    ("defaults runs/s", "interlock", "nats-raw", "runs_per_s", lambda r: r >= 0.3, ">= 0.3"),
    ("defaults p50", "interlock", "nats-raw", "p50_ms", lambda r: r <= 2.5, "<= 2.5"),
    ("defaults p99", "interlock", "nats-raw", "p99_ms", lambda r: r <= 3, "<= 3"),
    ("fsync runs/s", "interlock-fsync", "restate", "runs_per_s", lambda r: r > 1, "> 1"),
    (
        "flow control declared, not binding, runs/s",
        "interlock-limited",
        "interlock",
        "runs_per_s",
        lambda r: r >= 0.9,
        ">= 0.9",
    ),
    (
        "capability concurrency declared, not binding, runs/s",
        "interlock-cap-concurrency",
        "interlock",
        "runs_per_s",
        lambda r: r >= 0.9,
        ">= 0.9",
    ),
    (
        "capability rate declared, not binding, runs/s",
        "interlock-cap-rate",
        "interlock",
        "runs_per_s",
        lambda r: r >= 0.9,
        ">= 0.9",
    ),
    ("fsync p50", "interlock-fsync", "restate", "p50_ms", lambda r: r < 1, "< 1"),
]
"""Each goal is a ratio of one system's figure to another's in the same round."""


def _ratios(
    found: dict[tuple[str, str], dict[str, Any]], system: str, other: str, figure: str
) -> dict[str, float]:
    """Per round that measured both: ``system``'s figure over ``other``'s."""
    out = {}
    for (name, label), result in found.items():
        base = found.get((other, label))
        if name == system and base and base[figure]:
            out[label] = result[figure] / base[figure]
    return out


def goals(found: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The performance goals, judged per round on the same round's figures."""
    per_round: dict[str, list[str]] = {}
    for what, system, other, figure, ok, words in GOALS:
        for label, ratio in _ratios(found, system, other, figure).items():
            per_round.setdefault(label, []).append(
                f"{what} {ratio:.2f} x {other} (goal {words}: {_met(ok(ratio))})"
            )
    return [f"{label}: " + ", ".join(parts) for label, parts in sorted(per_round.items())]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


FLOW_CONTROL = [
    ("run limit", "interlock-limited"),
    ("capability concurrency", "interlock-cap-concurrency"),
    ("capability rate", "interlock-cap-rate"),
]
"""The flow-control systems whose cost, declared but not binding, is judged against
``interlock`` of the same round (goal: at most 10%)."""


def _cpu_ratios(
    found: dict[tuple[str, str], dict[str, Any]], system: str, process: str | None
) -> list[float]:
    """Per round that measured both: ``system``'s CPU per run over ``interlock``'s."""
    out = []
    for (name, label), result in sorted(found.items()):
        base = found.get(("interlock", label))
        if name != system or base is None:
            continue
        mine, theirs = cpu_per_run(result, process), cpu_per_run(base, process)
        if mine is not None and theirs:
            out.append(mine / theirs)
    return out


def _spread(ratios: list[float], *, percent: bool = False) -> str:
    def show(r: float) -> str:
        return f"{(r - 1) * 100:+.0f}%" if percent else f"{r:.2f}"

    median = statistics.median(ratios)
    return f"{show(median)} ({show(min(ratios))} to {show(max(ratios))})"


def flow_control_cost(found: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Per flow-control system, over the rounds that ran it beside ``interlock``: runs/s
    as a ratio (median, spread, rounds at 0.9 or better) beside what a run costs in CPU,
    of every process and of the orchestrator, as a change (median and spread). On a busy
    shared machine runs/s moves by tens of percent from round to round; CPU per run is
    the steadier of the two."""
    out = []
    for what, system in FLOW_CONTROL:
        ratios = list(_ratios(found, system, "interlock", "runs_per_s").values())
        if not ratios:
            continue
        met = sum(r >= 0.9 for r in ratios)
        line = (
            f"{what} ({system}) over {len(ratios)} rounds: runs/s {_spread(ratios)} x "
            f"interlock, 0.9 or better in {met} of {len(ratios)}"
        )
        for process, name in ((None, "CPU per run"), ("orchestrator", "orchestrator's")):
            cpu = _cpu_ratios(found, system, process)
            if cpu:
                line += f"; {name} {_spread(cpu, percent=True)}"
        out.append(line)
    return out


def in_turn(systems: list[System], round_index: int) -> list[System]:
    """A round's systems, those after the first (raw NATS) taken from a different one in
    each round: a system measured right after raw NATS spent some 8% more CPU a run than
    the same code measured next, so a fixed order favours some ratios every round."""
    if len(systems) < 3:
        return systems
    first, rest = systems[:1], systems[1:]
    turn = round_index % len(rest)
    return first + rest[turn:] + rest[:turn]


def over_rounds(found: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Each goal over every round that measured it: the median ratio, whether the median
    meets the goal, and in how many rounds the goal was met (one round on a shared machine
    moves by tens of percent; the median of several is what to judge)."""
    out = []
    for what, system, other, figure, ok, words in GOALS:
        ratios = list(_ratios(found, system, other, figure).values())
        if len(ratios) < 2:
            continue
        median = statistics.median(ratios)
        met = sum(ok(r) for r in ratios)
        out.append(
            f"over {len(ratios)} rounds: {what} {median:.2f} x {other} "
            f"(goal {words}: {_met(ok(median))} on the median; met in {met} of {len(ratios)}, "
            f"range {min(ratios):.2f} to {max(ratios):.2f})"
        )
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench peers", description=__doc__.split("\n")[0])
    p.add_argument("--only", default=os.environ.get("ONLY", DEFAULT_ONLY), help="systems to run")
    p.add_argument("--rounds", default=os.environ.get("ROUNDS", "r1 r2 r3"), help="round labels")
    p.add_argument(
        "--peers",
        default=os.environ.get("PEERS", str(Path(tempfile.gettempdir()) / "peers")),
        help="where bench/peers/install.sh installed the peers ($PEERS)",
    )
    p.add_argument("--results", help="folder for the per-run JSON files (default: a temp dir)")
    p.add_argument("--baseline-venv", type=Path, help="another checkout's venv, run beside")
    p.add_argument("--quick", action="store_true", help="fewer runs (a smoke test of the harness)")
    p.add_argument(
        "--fixed-order",
        action="store_true",
        help="every round in the same order (default: each round starts, after raw NATS, "
        "one system further on)",
    )
    p.add_argument("--tp-runs", type=int, help="runs of the throughput phase (default 2000)")
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="run-log partitions of the interlock-partitioned system (default 4)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m bench peers``: run the installed peers, print the ratios."""
    args = parser().parse_args(argv)
    peers = Path(args.peers)
    only = args.only.split()
    every = systems(peers, Path(sys.executable), args.baseline_venv, args.partitions)
    order = [s.name for s in every]
    if args.baseline_venv is not None:
        only += [f"interlock-base{n[len('interlock') :]}" for n in only if n.startswith("interl")]
    chosen = [s for s in every if s.name in only]
    runnable = []
    for system in chosen:
        why = system.missing()
        if why:
            print(f"skipping {system.name}: {why} (bench/peers/install.sh installs it)")
        else:
            runnable.append(system)
    if not any(s.name == "nats-raw" for s in runnable):
        print("peers: raw NATS is not installed, so there is nothing to compare with; skipped")
        return 0
    extra = ["--warmup", "5", "--seq", "50", "--tp-runs", "400"] if args.quick else []
    if args.tp_runs:
        extra += ["--tp-runs", str(args.tp_runs)]
    with tempfile.TemporaryDirectory(prefix="interlock-peers-") as tmp:
        results = Path(args.results or tmp)
        results.mkdir(parents=True, exist_ok=True)
        failed = 0
        for index, label in enumerate(args.rounds.split()):
            order_now = runnable if args.fixed_order else in_turn(runnable, index)
            for system in order_now:
                failed += not run_one(system, label, results, peers, extra)
        found = load(results)
    print()
    print(table(found, order))
    print()
    loads = [
        f"{name} {label} {r['loadavg_at_start'][0]:.1f}"
        for (name, label), r in sorted(found.items())
        if r.get("loadavg_at_start")
    ]
    if loads:
        print("load average (1 min) at each start: " + ", ".join(loads))
    for line in goals(found) + over_rounds(found) + flow_control_cost(found):
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
