"""What `replay --against` says about recorded runs, pinned whole: every key, every position
(the recorded run's and the new run's) and every line of the report (docs/debugging.md
documents its shape). A change to what it says is a visible, reviewed change of a file in
tests/golden/replay, re-recorded with

    .venv/bin/python tests/core/test_replay_pinned.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PINNED = GOLDEN / "replay"
REVIEW_TIMEOUT = (
    "      description: An agent reviews the diff.\n",
    "      description: An agent reviews the diff.\n"
    "      timeout:\n        after: 72h\n        goto: rejected\n",
)
NO_EXPIRY = (
    "      timeout:\n        after: 72h\n        goto: rejected\n"
    "        set:\n          reason: no approval within 72h\n",
    "",
)
CASES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    # name: (log, edits of code-review.yaml that make the candidate)
    # a record more early on: every later record is one further in the new run
    "merged-fix-loop-review-timeout": ("code-review-merged-fix-loop", [REVIEW_TIMEOUT]),
    # the run ends at its first review: the later inputs are skipped
    "merged-fix-loop-no-fix": (
        "code-review-merged-fix-loop",
        [("guard: context.fixes < 3", "guard: context.fixes < 0")],
    ),
    # a record no longer written: the new run's position is null
    "approval-expired-no-expiry": ("code-review-approval-expired", [NO_EXPIRY]),
}


def report(log: str, edits: list[tuple[str, str]]) -> Any:
    text = (GOLDEN / "code-review.yaml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    compiled = compile_sources([("code-review.yaml", text)])
    compiled.raise_for_errors()
    records = ev.decode_lines((GOLDEN / f"{log}.jsonl").read_bytes())
    return json.loads(msgspec.json.encode(analysis.replay(records, compiled.workflows[0])))


@pytest.mark.parametrize("name", sorted(CASES))
def test_replay_says_what_it_said(name: str) -> None:
    pinned = json.loads((PINNED / f"{name}.json").read_text())
    assert report(*CASES[name]) == pinned


def test_replay_refuses_an_empty_log() -> None:
    original = compile_sources([("code-review.yaml", (GOLDEN / "code-review.yaml").read_text())])
    with pytest.raises(ValueError) as caught:
        analysis.replay([], original.workflows[0])
    assert str(caught.value) == "an empty log"


def test_replay_of_a_run_that_has_only_started_names_it() -> None:
    original = compile_sources([("code-review.yaml", (GOLDEN / "code-review.yaml").read_text())])
    log = ev.decode_lines((GOLDEN / "code-review-cancelled.jsonl").read_bytes())[:1]
    found = analysis.replay(log, original.workflows[0])
    assert (found["run_id"], found["records"]) == ("r-golden-cancelled", 1)


if __name__ == "__main__":
    PINNED.mkdir(exist_ok=True)
    for name, case in sorted(CASES.items()):
        text = json.dumps(report(*case), indent=1, sort_keys=True) + "\n"
        (PINNED / f"{name}.json").write_text(text)
        print(f"wrote {PINNED / name}.json", file=sys.stderr)
