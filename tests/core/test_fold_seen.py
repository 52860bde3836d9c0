"""Folding many events copies the events a run remembers once, and gives what evolving
record by record gives: the same state, byte for byte, with the state it started from
left as it was."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.core import events as ev
from interlock.core import seen as seen_module
from interlock.core.state import RunState, encode_state, evolve, fold

ENVELOPE: dict[str, Any] = {
    "specversion": "1.0",
    "source": ev.SOURCE,
    "subject": "r-1",
    "time": "2026-01-01T00:00:00Z",
    "datacontenttype": "application/json",
}


def _record(n: int, kind: str, key: int) -> ev.AnyRecord:
    made: Any
    event = {"type": "tick", "source": f"s{key % 2}", "id": f"e-{key}", "data": {"k": {"p": key}}}
    if kind == "event":
        made = ev.EventReceived(**ENVELOPE, id=f"r-1:{n}", data=ev.EventReceivedData(event=event))
    elif kind == "evidence":
        data = ev.EvidenceRecordedData(event=event)
        made = ev.EvidenceRecorded(**ENVELOPE, id=f"r-1:{n}", data=data)
    else:
        made = ev.StateEntered(**ENVELOPE, id=f"r-1:{n}", data=ev.StateEnteredData(state="s"))
    return made


STEPS = st.lists(
    st.tuples(st.sampled_from(["event", "event", "evidence", "state"]), st.integers(0, 12)),
    max_size=40,
)


@given(before=STEPS, after=STEPS)
def test_fold_gives_what_evolving_record_by_record_gives(
    before: list[tuple[str, int]], after: list[tuple[str, int]]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(seen_module, "SEEN_KEPT", 5)  # so that the oldest are dropped often
        first = [_record(n + 1, kind, key) for n, (kind, key) in enumerate(before)]
        start = functools.reduce(evolve, first, RunState(run_id="r-1"))
        kept = copy.deepcopy(start)
        rest = [_record(len(first) + n + 1, kind, key) for n, (kind, key) in enumerate(after)]

        folded = fold(rest, start)

        assert encode_state(folded) == encode_state(functools.reduce(evolve, rest, start))
        assert list(folded.seen) == list(functools.reduce(evolve, rest, start).seen)
        assert len(folded.seen) <= 5
        assert start == kept, "the state folded from was changed"
        assert list(start.seen) == list(kept.seen)
