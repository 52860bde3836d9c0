"""What a fork refuses, and what it and a migration copy, on the golden logs (the forks
and migrations that work are in test_analysis.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
WORKFLOW = (GOLDEN / "code-review.yaml").read_text()
NOW = "2026-04-01T10:00:00Z"


def compiled(text: str) -> Definition:
    result = compile_sources([("code-review.yaml", text)])
    result.raise_for_errors()
    return result.workflows[0]


def golden(name: str) -> list[ev.AnyRecord]:
    return ev.decode_lines((GOLDEN / f"{name}.jsonl").read_bytes())


ORIGINAL = compiled(WORKFLOW)
RENAMED = compiled(
    WORKFLOW.replace("goto: approval", "goto: approve").replace("    approval:\n", "    approve:\n")
)
LOG = golden("code-review-fix-failed")  # r-golden-failed, 11 records; 9 ends a decision


def fork(records: list[ev.AnyRecord], at: int, **kw: object) -> list[ev.AnyRecord]:
    args: dict[str, object] = {
        "run_id": "r-fork",
        "definition": ORIGINAL,
        "version": 1,
        "now": NOW,
        **kw,
    }
    return analysis.fork(records, at, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("records", "at", "kw", "message"),
    [
        ([], 1, {}, "the log is empty"),
        (LOG, 12, {}, "--at 12: the log has records 1 to 11"),
        (LOG, 0, {}, "--at 0: the log has records 1 to 11"),
        (LOG, 9, {"run_id": "r-golden-failed"}, "a fork needs a run id of its own"),
        (
            LOG,
            9,
            {"definition": compiled(WORKFLOW.replace("name: code-review", "name: other", 1))},
            "the run is of workflow default/code-review, not default/other",
        ),
        (LOG, 2, {}, "record 2 is in the middle of a decision; fork at the end of one (4)"),
        (LOG, 1, {}, "record 1 is in the middle of a decision; fork at the end of one (4)"),
        # A log that lost its first record (its run.started): nothing there had ended.
        (LOG[1:], 3, {}, "the run had not started at record 3 (no run.started before it)"),
        (LOG[1:], 10, {}, "the run had already ended (failed) at record 10"),
        # Only its start: it never entered a state, whatever the definition forked onto.
        (LOG[:1], 1, {}, "at record 1 the run has not entered its first state yet"),
        (
            golden("code-review-guard-failure"),
            8,
            {"definition": RENAMED},
            "at record 8 the run is in state 'approval', which the definition forked onto "
            "does not have",
        ),
    ],
)
def test_a_fork_that_cannot_be_made_says_exactly_why(
    records: list[ev.AnyRecord], at: int, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(analysis.NotPossible) as caught:
        fork(records, at, **kw)
    assert str(caught.value) == message


def test_only_the_ids_of_the_forked_run_are_renamed() -> None:
    """Ids made from the run id (``<run>:<n>``) name the fork; any other id stays."""
    first = LOG[0]
    odd = msgspec.structs.replace(first, id="imported-1")
    forked = fork([odd, *LOG[1:]], 9)
    assert forked[0].id == "imported-1"
    assert forked[0].subject == "r-fork"
    assert [r.id for r in forked[1:9]] == [f"r-fork:{i}" for i in range(2, 10)]


def test_a_fork_of_a_child_run_answers_no_parent() -> None:
    started = LOG[0]
    assert isinstance(started, ev.RunStarted)
    child = msgspec.structs.replace(
        started,
        data=msgspec.structs.replace(
            started.data, parent=ev.ParentRef(run_id="r-parent", action_id="r-parent:3")
        ),
    )
    forked = fork([child, *LOG[1:]], 9)
    head = forked[0]
    assert isinstance(head, ev.RunStarted)
    assert head.data.parent is None
    assert msgspec.structs.replace(head.data, parent=None) == msgspec.structs.replace(
        child.data, parent=None
    )


def test_a_run_already_on_the_version_is_not_migrated() -> None:
    running = golden("code-review-merged-fix-loop")[:14]
    records, report = analysis.migration(running, ORIGINAL, version=1, now=NOW)
    assert records == []
    assert report["migrate"] == "the run is on version 1 already"
    finished = golden("code-review-merged-fix-loop")
    records, report = analysis.migration(finished, ORIGINAL, version=2, now=NOW)
    assert records == []
    assert report["migrate"] == "the run has ended (completed)"


def test_a_log_without_its_start_is_not_migrated() -> None:
    """A run whose log does not begin with its ``run.started`` never started: a migration
    says so rather than that it ended."""
    headless = golden("code-review-merged-fix-loop")[1:14]
    records, report = analysis.migration(headless, ORIGINAL, version=2, now=NOW)
    assert records == []
    assert report["migrate"] == "the run never started (its log holds no run.started)"


def test_the_same_definition_under_a_new_version_is_a_migration() -> None:
    running = golden("code-review-merged-fix-loop")[:14]
    records, report = analysis.migration(running, ORIGINAL, version=2, now=NOW)
    assert report["migrate"] is None
    assert report["against"]["version"] == 2
    [moved] = records
    assert isinstance(moved, ev.RunMigrated)
    assert moved.time == NOW
    assert (moved.data.from_version, moved.data.version) == (1, 2)
    assert moved.data.from_spec_hash == moved.data.spec_hash == ORIGINAL.spec_hash
