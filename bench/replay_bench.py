"""Replay benchmarks: what the debugging analyses cost (``python -m bench replay``).

One run measures, over the golden logs (tests/golden) repeated to ``--runs`` runs:

(a) re-driving: recorded inputs fed through ``decide`` again (``analysis.redrive``), the
    baseline: it is what deciding the runs live cost, mostly CEL evaluation;
(b) ``analysis.shadow`` against the run's own definition (every record compared) and
    against a candidate whose guard sends some runs elsewhere (divergences classified);
(c) folding the same logs, for scale.

The ratios shadow / re-drive say what comparing and classifying add to re-deciding
(target: at most 1.5). Each figure is the best of several rounds: the machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition
from interlock.core.state import fold

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
TARGET = 1.5


def _compiled(text: str) -> Definition:
    compiled = compile_sources([("code-review.yaml", text)])
    compiled.raise_for_errors()
    return compiled.workflows[0]


def _best(rounds: int, body: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        body()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    text = (GOLDEN / "code-review.yaml").read_text()
    own = _compiled(text)
    candidate = _compiled(text.replace("guard: result.score > 7", "guard: result.score > 8"))
    golden = [ev.decode_lines(p.read_bytes()) for p in sorted(GOLDEN.glob("*.jsonl"))]
    logs = [golden[i % len(golden)] for i in range(args.runs)]
    records = sum(len(log) for log in logs)

    redrive = _best(args.rounds, lambda: [analysis.redrive(log, own) for log in logs])
    same = _best(args.rounds, lambda: analysis.shadow(logs, own))
    other = _best(args.rounds, lambda: analysis.shadow(logs, candidate))
    folding = _best(args.rounds, lambda: [fold(log) for log in logs])
    result = {
        "runs": len(logs),
        "records": records,
        "redrive_runs_per_s": round(len(logs) / redrive),
        "shadow_own_runs_per_s": round(len(logs) / same),
        "shadow_candidate_runs_per_s": round(len(logs) / other),
        "fold_runs_per_s": round(len(logs) / folding),
        "shadow_own_over_redrive": round(same / redrive, 2),
        "shadow_candidate_over_redrive": round(other / redrive, 2),
        "target": TARGET,
    }
    ok = max(result["shadow_own_over_redrive"], result["shadow_candidate_over_redrive"]) <= TARGET
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{len(logs)} runs ({records} records): re-drive {result['redrive_runs_per_s']} "
            f"runs/s; shadow (own definition) {result['shadow_own_runs_per_s']} runs/s, "
            f"x{result['shadow_own_over_redrive']}; shadow (candidate) "
            f"{result['shadow_candidate_runs_per_s']} runs/s, "
            f"x{result['shadow_candidate_over_redrive']}; fold {result['fold_runs_per_s']} "
            f"runs/s  [{'ok' if ok else 'ABOVE TARGET'} <= x{TARGET}]"
        )
    return 0 if ok else 1
