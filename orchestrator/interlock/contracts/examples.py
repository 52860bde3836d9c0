"""The sample values the wire contract's examples and permission checks use (a run, an
action, a capability, a worker, an event type), and what the encoders write for them: the
examples in the AsyncAPI document are the code's own output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interlock.core.events import SOURCE
from interlock.core.vocabulary import TASK_COMPLETED, ErrorClass
from interlock.transport import tasks
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.subjects import Subjects
from interlock.transport.tokens import TaskTokens

SUBJECTS = Subjects()

# Sample values: role permissions are matched against subjects built from these.
CAPABILITY = "acme.review"
RUN = "order-7f3a"
INSTANCE = "host1-4242"
EVENT_TYPE = "acme.order.placed"
TIME = "2026-01-01T12:00:00.000Z"
TOKENS = TaskTokens(b"an example key, not a real one!!")
ACTION_ID = f"{RUN}:3"


@dataclass(frozen=True, slots=True)
class Examples:
    """What the encoders write for the sample values: the messages' examples."""

    event_headers: dict[str, str]
    event_payload: bytes
    req_headers: dict[str, str]
    req_payload: bytes
    completed_headers: dict[str, str]
    completed_payload: bytes
    emitted_headers: dict[str, str]
    emitted_payload: bytes
    failed_headers: dict[str, str]
    failed_payload: bytes
    cancel_headers: dict[str, str]
    cancel_payload: bytes
    beat: tasks.Heartbeat


def examples() -> Examples:
    """A request, its three kinds of answer, a cancel notice, an event and a heartbeat,
    encoded by the code that sends them."""
    req_headers, req_payload = tasks.encode_request(
        run_id=RUN,
        action_id=ACTION_ID,
        capability=CAPABILITY,
        attempt=2,
        data={"diff": "..."},
        time=TIME,
        deadline="2026-01-01T12:05:00.000Z",
        token=TOKENS.token(CAPABILITY, RUN, ACTION_ID, 2),
    )
    request = tasks.TaskRequest.from_event(
        CloudEvent(
            id=ACTION_ID,
            source=SOURCE,
            type=tasks.TASK_REQUESTED,
            subject=RUN,
            time=TIME,
            extensions={"runid": RUN, "actionid": ACTION_ID, "attempt": "2"},
        ),
        CAPABILITY,
        req_headers,
    )
    failed_type, failed_data = tasks.failure(
        ErrorClass.AGENT_ERROR, "the diff is empty", retryable=False, code="empty_diff"
    )
    cancel_headers, cancel_payload = tasks.encode_cancel(
        run_id=RUN, action_id=ACTION_ID, attempt=2, time=TIME
    )
    event_headers, event_payload = _inbound_example()
    completed_headers, completed_payload = _answer(TASK_COMPLETED, {"score": 8}, request.token)
    emitted_headers, emitted_payload = _answer("review.approved", {"score": 9}, request.token)
    failed_headers, failed_payload = _answer(failed_type, failed_data, request.token)
    return Examples(
        event_headers=event_headers,
        event_payload=event_payload,
        req_headers=req_headers,
        req_payload=req_payload,
        completed_headers=completed_headers,
        completed_payload=completed_payload,
        emitted_headers=emitted_headers,
        emitted_payload=emitted_payload,
        failed_headers=failed_headers,
        failed_payload=failed_payload,
        cancel_headers=cancel_headers,
        cancel_payload=cancel_payload,
        beat=tasks.Heartbeat(
            name="review-agent",
            instance=INSTANCE,
            capabilities=[CAPABILITY],
            concurrency=4,
            in_flight=1,
            started_at=TIME,
            heartbeat_at=TIME,
            host="host1",
            pid=4242,
        ),
    )


def _answer(type_: str, data: Any, token: str | None) -> tuple[dict[str, str], bytes]:
    """The sample request's answer of ``type_``, as a worker encodes it."""
    event = tasks.answer_event(
        run_id=RUN,
        action_id=ACTION_ID,
        attempt=2,
        event_id=f"{ACTION_ID}.2.result",
        source=tasks.agent_source("review-agent"),
        type=type_,
        data=data,
        time=TIME,
    )
    return tasks.encode_result(event, token=token)


def _inbound_example() -> tuple[dict[str, str], bytes]:
    """An event from outside, binary mode, with its dedupe id."""
    headers, payload = encode_binary(
        CloudEvent(
            id="42",
            source="https://shop.example/orders",
            type=EVENT_TYPE,
            time=TIME,
            datacontenttype=tasks.JSON,
            data={"order": 42},
        )
    )
    headers[tasks.MSG_ID_HEADER] = "https://shop.example/orders:42"
    return headers, payload
