"""``python -m bench peers`` judges each goal per round and over the rounds: a ratio of two
systems' figures in the same round, the median of those ratios, and how many rounds met it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _peers_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_bench", ROOT / "bench/peers_bench.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _result(p50: float, p99: float, runs_per_s: float) -> dict[str, Any]:
    return {"p50_ms": p50, "p99_ms": p99, "runs_per_s": runs_per_s}


FOUND = {
    ("nats-raw", "r1"): _result(2.0, 3.0, 3000),
    ("interlock", "r1"): _result(4.0, 6.0, 1200),  # 2.0x, 2.0x, 0.40
    ("nats-raw", "r2"): _result(2.0, 3.0, 3000),
    ("interlock", "r2"): _result(6.0, 7.5, 840),  # 3.0x, 2.5x, 0.28
    ("nats-raw", "r3"): _result(2.0, 3.0, 3000),
    ("interlock", "r3"): _result(4.6, 9.3, 960),  # 2.3x, 3.1x, 0.32
    ("interlock-fsync", "r3"): _result(6.0, 9.0, 400),
    ("restate", "r3"): _result(8.0, 12.0, 300),
}


def test_each_round_is_judged_on_its_own_figures() -> None:
    lines = _peers_bench().goals(FOUND)
    assert [line.split(":")[0] for line in lines] == ["r1", "r2", "r3"]
    assert "defaults runs/s 0.40 x nats-raw (goal >= 0.3: met)" in lines[0]
    assert "defaults p50 3.00 x nats-raw (goal <= 2.5: NOT met)" in lines[1]
    assert "defaults runs/s 0.28 x nats-raw (goal >= 0.3: NOT met)" in lines[1]
    assert "defaults p99 3.10 x nats-raw (goal <= 3: NOT met)" in lines[2]
    assert "fsync runs/s 1.33 x restate (goal > 1: met)" in lines[2]
    assert "fsync p50 0.75 x restate (goal < 1: met)" in lines[2]
    assert "fsync" not in lines[0]  # restate did not run in r1


def test_over_the_rounds_the_median_is_judged_and_the_rounds_that_met_counted() -> None:
    lines = _peers_bench().over_rounds(FOUND)
    assert lines == [
        "over 3 rounds: defaults runs/s 0.32 x nats-raw "
        "(goal >= 0.3: met on the median; met in 2 of 3, range 0.28 to 0.40)",
        "over 3 rounds: defaults p50 2.30 x nats-raw "
        "(goal <= 2.5: met on the median; met in 2 of 3, range 2.00 to 3.00)",
        "over 3 rounds: defaults p99 2.50 x nats-raw "
        "(goal <= 3: met on the median; met in 2 of 3, range 2.00 to 3.10)",
    ]  # the fsync goals were measured in one round only: no line over rounds


def _costed(runs_per_s: float, cpu_s: float, orchestrator_s: float) -> dict[str, Any]:
    cpu = {"orchestrator": orchestrator_s, "worker": cpu_s - orchestrator_s}
    return {**_result(4.0, 6.0, runs_per_s), "cpu_s_throughput": cpu, "tp_runs": 1000}


def test_a_limit_not_binding_is_judged_by_runs_per_second_beside_cpu_per_run() -> None:
    found = {
        ("interlock", "r1"): _costed(1000, 2.0, 1.0),
        ("interlock-limited", "r1"): _costed(950, 2.1, 1.1),  # 0.95, +5%, +10%
        ("interlock", "r2"): _costed(1000, 2.0, 1.0),
        ("interlock-limited", "r2"): _costed(800, 2.4, 1.2),  # 0.80, +20%, +20%
        ("interlock", "r3"): _costed(900, 2.0, 1.0),
        ("interlock-limited", "r3"): _costed(990, 2.0, 1.05),  # 1.10, +0%, +5%
    }
    assert _peers_bench().flow_control_cost(found) == [
        "run limit (interlock-limited) over 3 rounds: runs/s 0.95 (0.80 to 1.10) x "
        "interlock, 0.9 or better in 2 of 3; CPU per run +5% (+0% to +20%); "
        "orchestrator's +10% (+5% to +20%)"
    ]


def test_each_round_starts_one_system_further_on_after_raw_nats() -> None:
    bench = _peers_bench()
    systems = [bench.System(name, Path("python"), "x.py") for name in ["n", "a", "b", "c"]]
    orders = [[s.name for s in bench.in_turn(systems, i)] for i in range(4)]
    assert orders == [
        ["n", "a", "b", "c"],
        ["n", "b", "c", "a"],
        ["n", "c", "a", "b"],
        ["n", "a", "b", "c"],
    ]
