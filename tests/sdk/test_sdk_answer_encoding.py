"""What a worker sends, made the short way: its answers and their times.

``encode_answer`` builds an answer's headers straight from the request; it must give
byte for byte what the generic path gives (``encode_result`` of ``answer_event``: a
CloudEvent made, then encoded in binary mode), errors included. ``utc_now`` makes each
second's text once; it must read as ``format_time`` does.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.core.rfc3339 import format_time
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent
from interlock.transport.tasks import (
    TaskRequest,
    agent_source,
    answer_event,
    encode_answer,
    encode_result,
)

texts = st.sampled_from(
    ["r4421b07271dd4a1f9b0c2d3e4f5a6b7c", "r1.4", "approval agent", "a%b", 'q"', "é", ""]
) | st.text(max_size=8)
json_data = st.none() | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@st.composite
def requests(draw: st.DrawFn) -> TaskRequest:
    run_id = draw(texts.filter(bool))
    traceparent = draw(st.none() | st.just("") | texts)
    event = CloudEvent(
        id="x",
        source="s",
        type="t",
        extensions={} if traceparent is None else {"traceparent": traceparent},
    )
    return TaskRequest(
        event=event,
        run_id=run_id,
        action_id=draw(texts.filter(bool)),
        attempt=draw(st.integers(1, 12)),
        capability="review",
        deadline=None,
        token=draw(st.none() | st.just("") | texts),
    )


def outcome(make: Any) -> Any:
    try:
        return make()
    except InvalidCloudEvent as exc:
        return (exc.reason, str(exc))


@settings(max_examples=1000)
@given(
    requests(),
    texts,
    st.sampled_from(["task.completed", "task.failed", "review.approved"]) | texts,
    json_data | st.binary(max_size=4) | st.just({1: 2}) | st.builds(object),
    st.sampled_from(["2026-12-03T23:13:08.688Z"]) | texts,
)
def test_an_answer_is_encoded_as_the_generic_path_encodes_it(
    request: TaskRequest, worker: str, type_: str, data: Any, when: str
) -> None:
    def generic() -> tuple[str, dict[str, str], bytes]:
        event = answer_event(
            run_id=request.run_id,
            action_id=request.action_id,
            attempt=request.attempt,
            event_id=f"{request.action_id}.{request.attempt}.result",
            source=agent_source(worker),
            type=type_,
            data=data,
            time=when,
            traceparent=request.event.extensions.get("traceparent"),
        )
        return (event.id, *encode_result(event, token=request.token))

    short = outcome(
        lambda: encode_answer(
            request, source=agent_source(worker), type=type_, data=data, time=when
        )
    )
    expected = outcome(generic)
    assert short == expected
    if isinstance(expected[1], dict):
        assert list(short[1]) == list(expected[1])  # the same order on the wire


@pytest.mark.parametrize(
    "ns",
    [
        0,
        1_764_803_588_688_123_456,
        1_764_803_588_999_999_999,  # the last nanosecond of a second
        1_764_803_589_000_000_000,  # and the next second: its own text
        1_764_803_589_000_999_999,
        1_764_803_588_001_000_000,  # back to an earlier second
    ],
)
def test_utc_now_reads_as_format_time(ns: int) -> None:
    moment = datetime.fromtimestamp(ns // 1_000 / 1_000_000, UTC)
    assert utc_now(ns) == format_time(moment)


def test_utc_now_is_now() -> None:
    before = format_time(datetime.now(UTC))
    now = utc_now()
    after = format_time(datetime.now(UTC))
    assert before <= now <= after
    assert utc_now(time.time_ns()) >= now
