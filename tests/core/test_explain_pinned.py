"""What `explain` says about recorded runs, pinned whole: every key and every line of text
of the report (docs/debugging.md documents its shape). A change to what it says is a
visible, reviewed change of a file in tests/golden/explain, re-recorded with

    .venv/bin/python tests/core/test_explain_pinned.py
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
PINNED = GOLDEN / "explain"
CASES = {
    # name: (log under tests/golden, at); each folder holds the logs of the workflow in it
    "code-review-guard-failure": ("code-review-guard-failure", None),
    "code-review-merged-fix-loop-at-14": ("code-review-merged-fix-loop", 14),
    # waiting for an event: its guards and where the state's timer goes
    "code-review-merged-fix-loop-at-18": ("code-review-merged-fix-loop", 18),
    "code-review-retried-then-caught": ("code-review-retried-then-caught", None),
    # a failure not caught, a cancellation
    "code-review-fix-failed": ("code-review-fix-failed", None),
    "code-review-cancelled": ("code-review-cancelled", None),
    # retries after a backoff, answers of a state's earlier actions, branches
    "control-flow-done": ("control-flow/control-flow-done", None),
    # evidence events, a quorum, a DAG
    "constructs-shipped": ("constructs/constructs-shipped", None),
}
WORKFLOWS = {
    "": "code-review.yaml",
    "control-flow": "control-flow/control-flow.yaml",
    "constructs": "constructs/constructs.yaml",
}


def report(log: str, at: int | None) -> Any:
    workflow = GOLDEN / WORKFLOWS[str(Path(log).parent).strip(".")]
    compiled = compile_sources([(workflow.name, workflow.read_text())])
    compiled.raise_for_errors()
    records = ev.decode_lines((GOLDEN / f"{log}.jsonl").read_bytes())
    explained = analysis.explain(records, compiled.workflows[0], at=at)
    return json.loads(msgspec.json.encode(explained))


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_says_what_it_said(name: str) -> None:
    pinned = json.loads((PINNED / f"{name}.json").read_text())
    assert report(*CASES[name]) == pinned


if __name__ == "__main__":
    PINNED.mkdir(exist_ok=True)
    for name, (log, at) in sorted(CASES.items()):
        text = json.dumps(report(log, at), indent=1, sort_keys=True) + "\n"
        (PINNED / f"{name}.json").write_text(text)
        print(f"wrote {PINNED / name}.json", file=sys.stderr)
