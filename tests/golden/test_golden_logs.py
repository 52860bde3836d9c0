"""Golden run logs: recorded logs under version control must keep folding to the same state.

Each ``<name>.jsonl`` (one CloudEvent per line) must fold to ``<name>.state.json`` byte for
byte. The log under ``divergent/`` deliberately does not: its divergence must be detected
and reported, naming the first field that differs. To record the logs again, or to refold
them after a deliberate change of the state's shape, see ``record.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.state import encode_state, fold

HERE = Path(__file__).resolve().parent
GOLDEN = sorted(HERE.glob("*.jsonl"))
DIVERGENT = sorted((HERE / "divergent").glob("*.jsonl"))


def _differences(folded: Any, expected: Any, path: str) -> list[str]:
    if isinstance(folded, dict) and isinstance(expected, dict):
        out: list[str] = []
        for key in [*expected, *(k for k in folded if k not in expected)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in folded:
                out.append(f"{where}: missing from the folded state (expected {expected[key]!r})")
            elif key not in expected:
                out.append(f"{where}: not expected (the log folds to {folded[key]!r})")
            else:
                out.extend(_differences(folded[key], expected[key], where))
        return out
    if isinstance(folded, list) and isinstance(expected, list) and len(folded) == len(expected):
        return [
            d
            for i, (f, e) in enumerate(zip(folded, expected, strict=True))
            for d in _differences(f, e, f"{path}[{i}]")
        ]
    if folded != expected or type(folded) is not type(expected):
        return [f"{path or 'state'}: the log folds to {folded!r}, expected {expected!r}"]
    return []


def compare_replay(log: bytes, expected: bytes) -> list[str]:
    """Fold a JSONL run log; name every field where the result differs from ``expected``
    (first differing field first). Empty when the bytes are identical."""
    folded = encode_state(fold(ev.decode_lines(log)))
    if folded == expected.rstrip(b"\n"):
        return []
    found = _differences(json.loads(folded), json.loads(expected), "")
    return found or ["the folded state has the same values but different bytes (key order)"]


@pytest.mark.parametrize("log", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_log_folds_to_its_recorded_state(log: Path) -> None:
    expected = log.with_suffix(".state.json").read_bytes()
    problems = compare_replay(log.read_bytes(), expected)
    assert problems == [], (
        f"{log.name} no longer folds to its recorded state (a replay would diverge):\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize("log", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_log_is_well_formed(log: Path) -> None:
    records = ev.decode_lines(log.read_bytes())
    assert b"".join(ev.encode(r) + b"\n" for r in records) == log.read_bytes()
    run_id = records[0].subject
    assert isinstance(records[0], ev.RunStarted)
    assert [r.id for r in records] == [f"{run_id}:{i}" for i in range(1, len(records) + 1)]
    assert ev.record_type(records[-1]) in ev.TERMINAL_TYPES
    assert all(r.subject == run_id for r in records)


def test_the_golden_logs_cover_the_scenarios() -> None:
    kinds = {p.stem: {ev.record_type(r) for r in ev.decode_lines(p.read_bytes())} for p in GOLDEN}
    assert any(ev.PREFIX + "guard.failed" in k for k in kinds.values())
    assert any(ev.PREFIX + "run.cancelled" in k for k in kinds.values())
    assert any(ev.PREFIX + "run.failed" in k for k in kinds.values())
    merged = ev.decode_lines((HERE / "code-review-merged-fix-loop.jsonl").read_bytes())
    visits = [r.data.state for r in merged if isinstance(r, ev.StateEntered)]
    assert visits == ["review", "fix", "review", "approval", "merge", "merged"]


@pytest.mark.parametrize("log", DIVERGENT, ids=[p.stem for p in DIVERGENT])
def test_a_divergent_log_is_reported(log: Path) -> None:
    expected = log.with_suffix(".state.json").read_bytes()
    problems = compare_replay(log.read_bytes(), expected)
    assert problems, f"{log.name} was meant to diverge from its stored state, and does not"
    assert problems[0] == "context.fixes: the log folds to 2, expected 1"


def test_there_is_a_divergent_log() -> None:
    assert DIVERGENT


def test_compare_replay_reports_structure_changes() -> None:
    log = (HERE / "code-review-cancelled.jsonl").read_bytes()
    expected = json.loads((HERE / "code-review-cancelled.state.json").read_bytes())
    assert compare_replay(log, json.dumps(expected, separators=(",", ":")).encode()) == []
    reordered = json.dumps(dict(reversed(expected.items())), separators=(",", ":")).encode()
    assert compare_replay(log, reordered) == [
        "the folded state has the same values but different bytes (key order)"
    ]
    renamed = {("stage" if k == "state" else k): v for k, v in expected.items()}
    problems = compare_replay(log, json.dumps(renamed).encode())
    assert problems[0].startswith("stage: missing from the folded state")
    assert problems[1].startswith("state: not expected (the log folds to ")
