"""A trigger's window entry is never more than the server takes in a message, whatever
its events: ids at their bound (of quotes, escaped to twice their bytes), events and
batch items as large as taken, both windows (open and sealed) full and the references
of started windows kept. An id over the bound is refused where any event is decoded."""

from __future__ import annotations

import pytest

from interlock.core.bounds import MAX_EVENT_ID_BYTES, max_event_bytes
from interlock.core.windowing import (
    CUT,
    MAX_REFS,
    TOO_LARGE,
    Arrival,
    EventCopy,
    WindowEntry,
    encode,
    take_into,
    window_budget,
)
from interlock.transport.cloudevents import InvalidCloudEvent, decode_message, from_dict

PAYLOAD = 1024 * 1024
NOW = "2026-01-01T00:00:00Z"


def arrival(n: int, *, data: str = "", item: str = "") -> Arrival:
    event_id = f"{n:08d}" + '"' * (MAX_EVENT_ID_BYTES - 8)
    copy = EventCopy(type="acme.job", source="/p", id=event_id, data={"d": data})
    inputs = {"d": data}
    return Arrival(
        version=1,
        event=copy,
        ref=f"{n:020x}",
        inputs=inputs,
        item={"i": item},
        item_size=len(encode({"i": item})),
        last_size=len(encode(copy)) + len(encode(inputs)),
    )


@pytest.mark.parametrize("kind", ["batch", "debounce"])
@pytest.mark.parametrize("data", [0, 2_000, 200_000])
def test_an_entry_never_outgrows_the_payload_limit(kind: str, data: int) -> None:
    entry = WindowEntry(trigger="ns/wf#trigger1", key="k" * 1000, kind=kind)
    entry.taken = [f"{n:020x}" for n in range(MAX_REFS)]
    room = max_event_bytes(PAYLOAD)
    largest = 0
    cuts = 0
    both = False
    for n in range(2_400):
        if n == 1_200 and entry.sealed is None:
            # A timer closed the open window; its run is not started yet.
            entry.sealed, entry.open = entry.open, None
        before = len(encode(entry)) if n % 100 == 0 else 0
        got = take_into(
            entry,
            arrival(n, data="x" * data, item="y" * (data // 4)),
            kind=kind,
            max_events=1_000,
            room=room,
            now=NOW,
            budget=window_budget(entry, PAYLOAD),
        )
        assert got != TOO_LARGE
        if got == CUT:
            cuts += 1
            before = len(encode(entry))
            if cuts > 1:
                entry.sealed = None  # the later ones' runs started at once
        largest = max(largest, before)
        both = both or (entry.sealed is not None and entry.open is not None)
    largest = max(largest, len(encode(entry)))
    assert both  # both windows held at once, at the worst
    assert largest <= PAYLOAD


def test_an_event_larger_than_a_window_is_refused() -> None:
    entry = WindowEntry(trigger="ns/wf#trigger1", key="k", kind="debounce")
    huge = arrival(1, data="x" * (PAYLOAD // 2))
    got = take_into(
        entry, huge, kind="debounce", max_events=0, room=PAYLOAD, now=NOW,
        budget=window_budget(entry, PAYLOAD),
    )  # fmt: skip
    assert got == TOO_LARGE
    assert entry.open is None
    assert entry.sealed is None


def test_an_id_over_the_bound_is_refused_in_either_mode() -> None:
    long_id = "é" * (MAX_EVENT_ID_BYTES // 2 + 1)  # 2 bytes each: over by 2
    with pytest.raises(InvalidCloudEvent) as structured:
        from_dict({"specversion": "1.0", "id": long_id, "source": "/p", "type": "a.b"})
    assert structured.value.reason == "id-too-long"
    headers = {"ce-specversion": "1.0", "ce-id": "a" * 257, "ce-source": "/p", "ce-type": "a.b"}
    with pytest.raises(InvalidCloudEvent) as binary:
        decode_message(headers, b"")
    assert binary.value.reason == "id-too-long"
    headers["ce-id"] = "a" * MAX_EVENT_ID_BYTES
    assert decode_message(headers, b"").id == "a" * MAX_EVENT_ID_BYTES
