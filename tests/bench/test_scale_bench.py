"""python -m bench scale: what it tells to expect from the machine's cores, and its medians."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
GRID = [(p, r) for p in (1, 2, 4) for r in (1, 2, 4)]


def _scale_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "bench/scale_bench.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_it_says_what_to_expect_from_the_cores_it_has() -> None:
    expectation = _scale_bench()._expectation
    assert "expect no growth" in expectation(2, GRID)
    assert "up to about 4 replicas" in expectation(6, GRID)
    assert "grow with replicas" in expectation(32, GRID)


def test_a_cells_figure_over_rounds_is_the_median_rounds() -> None:
    bench = _scale_bench()
    cells = [bench.Cell(2, 2, runs_per_s=r, p50_ms=1000 / r) for r in (300.0, 100.0, 200.0)]
    assert bench._median(cells).runs_per_s == 200.0
    assert bench._median(cells).p50_ms == 5.0
