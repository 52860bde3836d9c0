"""Golden run logs: what the engine writes, and how each record folds, pinned byte for byte.

Each scenario of ``record.py`` is driven again in memory, through start/decide/cancel: the
engine must write exactly the stored ``<name>.jsonl``, and folding the stored log must pass
through exactly the stored ``states/<name>.jsonl`` (the state after each record) and end at
``<name>.state.json``. A change to what the engine writes or how a record folds therefore
shows as a golden file to re-record (``record.py``) and review, in a commit of its own.

The log under ``divergent/`` deliberately does not fold to its stored state: its divergence
must be detected and reported, naming the first field that differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import record

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.state import RunState, encode_state, evolve, fold

HERE = Path(__file__).resolve().parent
GOLDEN = sorted(
    [
        *HERE.glob("*.jsonl"),
        *(HERE / "control-flow").glob("*.jsonl"),
        *(HERE / "constructs").glob("*.jsonl"),
    ]
)
DIVERGENT = sorted((HERE / "divergent").glob("*.jsonl"))
RERECORD = "if the change is meant, re-record with tests/golden/record.py and commit it alone"


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


def compare_state(folded: bytes, expected: bytes) -> list[str]:
    """Every field where an encoded state differs from ``expected`` (first differing field
    first); empty when the bytes are identical."""
    if folded == expected.rstrip(b"\n"):
        return []
    found = _differences(json.loads(folded), json.loads(expected), "")
    return found or ["the folded state has the same values but different bytes (key order)"]


def compare_replay(log: bytes, expected: bytes) -> list[str]:
    """Fold a JSONL run log; name every field where the result differs from ``expected``."""
    return compare_state(encode_state(fold(ev.decode_lines(log))), expected)


# --- the engine's output --------------------------------------------------------------


@pytest.mark.parametrize("name", record.SCENARIOS)
def test_the_engine_writes_the_recorded_log(name: str) -> None:
    written = record.log_bytes(record.replay(name).log).splitlines()
    stored = record.log_path(name).read_bytes().splitlines()
    for position, (new, old) in enumerate(zip(written, stored, strict=False), start=1):
        assert new == old, (
            f"{name}: record {position} is not what was recorded ({RERECORD})\n"
            f"  recorded: {old.decode()}\n  written:  {new.decode()}"
        )
    assert len(written) == len(stored), (
        f"{name}: the engine wrote {len(written)} records, {len(stored)} were recorded"
    )


@pytest.mark.parametrize("name", record.SCENARIOS)
def test_every_record_folds_to_the_recorded_state(name: str) -> None:
    """The state after each record, not only the last: a field that goes wrong in the middle
    of a run and is overwritten later shows here."""
    records = ev.decode_lines(record.log_path(name).read_bytes())
    expected = record.states_path(name).read_bytes().splitlines()
    assert len(expected) == len(records)
    state = RunState()
    for position, (record_, stored) in enumerate(zip(records, expected, strict=True), start=1):
        state = evolve(state, record_)
        problems = compare_state(encode_state(state), stored)
        assert problems == [], (
            f"{name}: after record {position} ({ev.record_type(record_)}) the state differs "
            f"({RERECORD}):\n" + "\n".join(problems)
        )
    assert expected[-1] == record.state_path(name).read_bytes().rstrip(b"\n")


def test_every_golden_log_has_its_scenario() -> None:
    assert sorted(p.stem for p in GOLDEN) == sorted(record.SCENARIOS)
    for name in record.SCENARIOS:
        assert record.log_path(name) in GOLDEN
        assert record.state_path(name).exists()
        assert record.states_path(name).exists()


@pytest.mark.parametrize("name", record.SCENARIOS)
def test_each_recorded_run_re_drives_to_its_own_log(name: str) -> None:
    """The analyses re-drive a log from its inputs (answers, events, evidence, timers):
    with the run's own definition that gives the recorded log again, and `explain` says it
    reproduces."""
    records = ev.decode_lines(record.log_path(name).read_bytes())
    definition = record.definition(record.SCENARIOS[name].workflow)
    again = analysis.redrive(records, definition)
    assert [ev.encode(r) for r in again] == [ev.encode(r) for r in records]
    explained = analysis.explain(records, definition)
    assert explained["reproduces"] is True, explained.get("mismatch")
    assert analysis.replay(records, definition)["agree"] is True


# --- the stored logs ------------------------------------------------------------------


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


def _kinds() -> dict[str, set[str]]:
    return {p.stem: {ev.record_type(r) for r in ev.decode_lines(p.read_bytes())} for p in GOLDEN}


def test_the_golden_logs_cover_the_scenarios() -> None:
    every = set().union(*_kinds().values())
    for kind in (
        "guard.failed",
        "run.cancelled",
        "run.failed",
        "run.completed",
        "map.started",
        "map.completed",
        "action.cancelled",
        "event.received",
        "timer.fired",
    ):
        assert ev.PREFIX + kind in every, kind
    merged = ev.decode_lines((HERE / "code-review-merged-fix-loop.jsonl").read_bytes())
    visits = [r.data.state for r in merged if isinstance(r, ev.StateEntered)]
    assert visits == ["review", "fix", "review", "approval", "merge", "merged"]


def test_a_retried_parallel_branch_asks_its_own_capability_again() -> None:
    """Branch 1 (capability ``test``) fails, is retried, and is requested again as ``test``
    with its own input, not as branch 0's ``lint``."""
    log = ev.decode_lines(record.log_path("control-flow-done").read_bytes())
    asked = [
        (r.data.item, r.data.capability, r.data.attempt, r.data.input)
        for r in log
        if isinstance(r, ev.ActionRequested) and r.data.state == "checks"
    ]
    assert asked == [
        (0, "lint", 1, {"branch": 0}),
        (1, "test", 1, {"branch": 1}),
        (1, "test", 2, {"branch": 1}),
    ]


# --- a divergent log is reported ------------------------------------------------------


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


def test_a_changed_engine_output_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte comparison fails on a one-field change of what the engine writes."""
    stored = (HERE / "code-review-cancelled.jsonl").read_bytes()
    monkeypatch.setattr(ev, "SOURCE", "interlock://elsewhere")
    written = record.log_bytes(record.replay("code-review-cancelled").log)
    assert written != stored
    assert written.replace(b"interlock://elsewhere", b"interlock://orchestrator") == stored
