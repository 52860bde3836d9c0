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
