"""The task protocol: both ends of a capability request, in one place.

The orchestrator (the dispatcher) and the agent workers speak it; neither builds a task
subject, header or extension by hand.

- A **request** is a binary-mode CloudEvent of type ``io.interlock.task.requested`` on
  ``<prefix>.cap.<capability>`` (the TASKS work-queue stream), read by every worker of the
  capability through the durable pull consumer ``cap_<capability>``. Its id is the action
  id (``<run id>:<log position>``), its extensions carry ``runid``, ``actionid``,
  ``capability``, ``attempt`` and, when the action has one, ``deadline`` and
  ``traceparent``; its ``Nats-Msg-Id`` is ``<action id>.<attempt>``, so a re-dispatch of
  the same attempt is dropped by the stream.
  Every request carries an ``Interlock-Token`` header: base64url (unpadded) of
  HMAC-SHA256(key, ``"<capability>\n<run id>\n<action id>\n<attempt>"``), under a key
  only the orchestrator holds (:func:`load_token_key`).
- An **answer** is a CloudEvent published with JetStream to
  ``<prefix>.results.<capability>.<run id>``: ``task.completed``, a handler-chosen type,
  or ``task.failed`` with ``{"error": {"class", "message", "retryable"}}``. It carries
  ``runid``, ``actionid`` and ``attempt``, and echoes the request's ``Interlock-Token``
  header; its id is ``<action id>.<attempt>.result`` and its ``Nats-Msg-Id``
  ``<source>:<id>`` (the results stream keeps ids 0.1 s: every agent writes it, and a
  longer window let one drop another's answer by sending its id first; an answer stored
  twice is taken once, see :mod:`interlock.runtime.answering`). The orchestrator appends it
  only if it answers an attempt the run still awaits, of that capability, and the token
  verifies (:mod:`interlock.runtime.answers`).
- An answer is best sent first as a core-NATS **request** on ``<prefix>.answer.<capability>.
  <run id>``, replied to once appended (:data:`ANSWER_HEADER`); else as above.
- A **cancel notice** is a core-NATS CloudEvent of type ``io.interlock.task.cancel`` on
  ``<prefix>.control.<capability>.<run id>``, naming an action and optionally one attempt.
- A worker's **heartbeat** is a key ``<capability token>.<instance>`` of the workers
  bucket, one per capability it serves (:func:`heartbeat_key`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from interlock.core.events import SOURCE
from interlock.core.ids import capability_token
from interlock.core.rfc3339 import format_time
from interlock.core.vocabulary import TASK_FAILED, InterlockError
from interlock.transport.cloudevents import (
    SPECVERSION,
    CloudEvent,
    InvalidCloudEvent,
    encode_binary,
    sent_as_is,
)
from interlock.transport.subjects import Subjects

TASK_REQUESTED: Final = "io.interlock.task.requested"
TASK_CANCEL: Final = "io.interlock.task.cancel"
MSG_ID_HEADER: Final = "Nats-Msg-Id"
TOKEN_HEADER: Final = "Interlock-Token"  # noqa: S105 - a header name
"""The per-attempt token a request carries and its answer echoes."""
WORKFLOW_CAPABILITY: Final = "_workflow"
"""The capability token answers to a child-workflow action travel under (the platform's
own answers: no agent is ever asked for such an action)."""
JSON: Final = "application/json"
ANSWER_HEADER: Final = "Interlock-Answer"
"""The reply to an answer request: recorded (in the log), refused (dead-lettered, reason in
``Interlock-Answer-Reason``) or failed (no reply, no responders too: the results stream)."""
ANSWER_REASON_HEADER: Final = "Interlock-Answer-Reason"
ANSWER_DETAIL_HEADER: Final = "Interlock-Answer-Detail"
"""With ``refused``: what was wrong, for a person (the dead letter's detail, which an
agent's credential may not read), printable ASCII, at most :data:`ANSWER_DETAIL_MAX`."""
ANSWER_DETAIL_MAX: Final = 1000
ANSWER_RECORDED: Final = "recorded"
ANSWER_REFUSED: Final = "refused"
ANSWER_FAILED: Final = "failed"
ANSWER_LATE: Final = "late"
"""The run had stopped waiting for that attempt itself (it cancelled the action, the
attempt timed out, the run ended): dropped, not dead-lettered; the reason says which."""
HANDLER_RUNNING: Final = "handler_running"
"""The ``error.code`` of a cancelled attempt's answer sent while its handler still runs
(it ignored its cancellation): the attempt's concurrency slots stay held (until the
latest a cancelled attempt may take to stop). Any other answer to a cancelled attempt
says its work has ended, and gives them back."""

RUN_ID: Final = "runid"
ACTION_ID: Final = "actionid"
ATTEMPT: Final = "attempt"
CAPABILITY: Final = "capability"
DEADLINE: Final = "deadline"
TRACEPARENT: Final = "traceparent"

TASK_ACK_WAIT: Final = 30.0
"""Default ack wait of a capability's consumer (seconds); workers send progress acks."""
TASK_MAX_ACK_PENDING: Final = 1000
"""Tasks of one capability handed out and not yet acknowledged, over all its workers (the
server's default, stated so the contract can say it)."""

_KV_KEY_UNSAFE = re.compile(r"[^-/_=.A-Za-z0-9]")


# --- payloads (their JSON Schemas are published in contracts/asyncapi.yaml) ------------


class TaskError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why a task failed: the ``error`` of a ``task.failed`` answer."""

    error_class: str = msgspec.field(name="class")
    """One of the error classes (``agent_error``, ``timeout``, ``schema_error``,
    ``cancelled``, ...); a class the orchestrator does not know is taken as ``agent_error``
    with that class as its ``code``."""
    message: str
    retryable: bool | None = None
    """Whether the action's retry policy may try again (absent or false: only if the class
    is ``timeout`` or ``platform_error``)."""
    code: str | None = None
    """A finer reason a workflow can route on (``result.error.code``)."""
    retry_after: float | str | None = None
    """The earliest another attempt may go (a retryable failure): seconds from now, or an
    RFC 3339 instant with its offset, as HTTP's ``Retry-After`` (an API's 429). The retry
    waits for the later of this and the retry policy's backoff, at most an hour; a
    negative, non-finite or unreadable value is dead-lettered (``answer-retry-after``)."""


class TaskFailed(msgspec.Struct, kw_only=True):
    """The data of a ``task.failed`` answer."""

    error: TaskError


class Heartbeat(msgspec.Struct, kw_only=True):
    """The value of a worker's key in the workers bucket (JSON), rewritten every few seconds
    (the bucket forgets a key not written for its TTL)."""

    name: str
    """The worker's name (``interlock agents`` lists one line per name and instance)."""
    instance: str
    """This process's id, unique among the worker's processes."""
    capabilities: list[str]
    """Every capability the process serves (it writes one key per capability)."""
    concurrency: int
    in_flight: int
    started_at: str
    """RFC 3339 UTC."""
    heartbeat_at: str
    """RFC 3339 UTC."""
    host: str | None = None
    pid: int | None = None


class TimerBody(msgspec.Struct, kw_only=True):
    """The payload of a timer, scheduled and fired."""

    run_id: str
    timer_id: str


# --- names ----------------------------------------------------------------------------


def consumer_name(capability: str) -> str:
    """The durable pull consumer shared by every worker of ``capability``."""
    return "cap_" + capability_token(capability)


def answer_capability(capability: str) -> str:
    """The capability an answer to an action of ``capability`` names in its subject."""
    return capability or WORKFLOW_CAPABILITY


def task_consumer_config(
    subjects: Subjects,
    capability: str,
    *,
    ack_wait: float = TASK_ACK_WAIT,
    max_deliver: int = -1,
) -> ConsumerConfig:
    """The configuration of the capability's durable consumer, whoever creates it."""
    durable = consumer_name(capability)
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        description=f"Interlock capability {capability}",
        filter_subject=subjects.capability(capability),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=TASK_MAX_ACK_PENDING,
    )


def heartbeat_key(capability: str, instance: str) -> str:
    """The workers-bucket key one worker process heartbeats under for ``capability``."""
    return f"{capability_token(capability)}.{capability_token(instance) or '_'}"


def agent_source(worker_name: str) -> str:
    return f"interlock://agent/{worker_name}"


# --- requests -------------------------------------------------------------------------


def encode_request(
    *,
    run_id: str,
    action_id: str,
    capability: str,
    attempt: int,
    data: Any,
    time: str,
    deadline: str | None = None,
    traceparent: str | None = None,
    token: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """A task request as the dispatcher publishes it: headers (with ``Nats-Msg-Id`` and the
    attempt's token) and payload, for :func:`Subjects.capability` of ``capability``."""
    extensions = {
        RUN_ID: run_id,
        ACTION_ID: action_id,
        CAPABILITY: capability,
        ATTEMPT: str(attempt),
    }
    if deadline:
        extensions[DEADLINE] = deadline
    if traceparent:
        extensions[TRACEPARENT] = traceparent
    event = CloudEvent(
        id=action_id,
        source=SOURCE,
        type=TASK_REQUESTED,
        subject=run_id,
        time=time,
        datacontenttype=JSON,
        data=data,
        extensions=extensions,
    )
    headers, payload = encode_binary(event)
    headers[MSG_ID_HEADER] = f"{action_id}.{attempt}"
    if token:
        headers[TOKEN_HEADER] = token
    return headers, payload


def task_request(
    *,
    run_id: str,
    seq: int | str,
    capability: str,
    data: Any,
    attempt: int,
    deadline: datetime | None,
    now: datetime,
    traceparent: str | None = None,
    token: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """:func:`encode_request` for the action at log position ``seq`` of ``run_id``, with
    datetimes (what tests and other senders of requests have at hand)."""
    return encode_request(
        run_id=run_id,
        action_id=f"{run_id}.{seq}",
        capability=capability,
        attempt=attempt,
        data=data,
        time=format_time(now),
        deadline=None if deadline is None else format_time(deadline),
        traceparent=traceparent,
        token=token,
    )


class BadRequest(ValueError, InterlockError):
    """A task request that cannot be answered (no run id to answer to)."""


class TaskRequest(msgspec.Struct, frozen=True):
    """The fields of a task request a worker acts on (a Struct: made for every task a
    worker takes, in a tenth of a frozen dataclass's time)."""

    event: CloudEvent
    run_id: str
    action_id: str
    attempt: int
    capability: str
    deadline: datetime | None
    deadline_problem: str | None = None
    """Why the ``deadline`` extension was ignored, if it was present but unreadable."""
    token: str | None = None
    """The request's ``Interlock-Token``, echoed in the answer."""

    @classmethod
    def from_event(
        cls, event: CloudEvent, capability: str, headers: dict[str, str] | None = None
    ) -> TaskRequest:
        """Read a decoded request received from ``capability``'s consumer.

        Raises:
            BadRequest: there is no run to answer to.
        """
        ext = event.extensions
        run_id = ext.get(RUN_ID) or event.subject
        if not run_id:
            raise BadRequest(
                f"task {event.id!r} has neither a 'runid' extension nor a subject: "
                "there is no run to answer to"
            )
        try:
            attempt = int(ext.get(ATTEMPT, "1"))
        except ValueError:
            attempt = 1
        deadline: datetime | None = None
        problem: str | None = None
        raw = ext.get(DEADLINE)
        if raw:
            try:
                deadline = datetime.fromisoformat(raw)
            except ValueError:
                problem = f"unreadable deadline {raw!r}"
            else:
                if deadline.tzinfo is None:
                    deadline = deadline.replace(tzinfo=UTC)
        return cls(
            event=event,
            run_id=run_id,
            action_id=ext.get(ACTION_ID) or event.id,
            attempt=max(attempt, 1),
            capability=ext.get(CAPABILITY) or capability,
            deadline=deadline,
            deadline_problem=problem,
            token=(headers or {}).get(TOKEN_HEADER),
        )


# --- answers --------------------------------------------------------------------------


def answer_event(
    *,
    run_id: str,
    action_id: str,
    attempt: int,
    event_id: str,
    source: str,
    type: str,
    data: Any,
    time: str,
    traceparent: str | None = None,
) -> CloudEvent:
    """An answer to one attempt of an action (an agent's, or one the platform gives)."""
    extensions = {RUN_ID: run_id, ACTION_ID: action_id, ATTEMPT: str(attempt)}
    if traceparent:
        extensions[TRACEPARENT] = traceparent
    return CloudEvent(
        id=event_id,
        source=source,
        type=type,
        subject=run_id,
        time=time,
        datacontenttype=JSON,
        data=data,
        extensions=extensions,
    )


def failure(
    error_class: str,
    message: str,
    *,
    retryable: bool | None = None,
    code: str | None = None,
    retry_after: float | str | None = None,
) -> tuple[str, Any]:
    """The ``(type, data)`` of a ``task.failed`` answer."""
    error: dict[str, Any] = {"class": str(error_class), "message": message}
    if retryable is not None:
        error["retryable"] = retryable
    if code:
        error["code"] = code
    if retry_after is not None:
        error["retry_after"] = retry_after
    return TASK_FAILED, {"error": error}


def encode_result(event: CloudEvent, token: str | None = None) -> tuple[dict[str, str], bytes]:
    """An answer's binary-mode headers and payload, with the dedupe ``Nats-Msg-Id`` and the
    request's token echoed."""
    headers, payload = encode_binary(event)
    headers[MSG_ID_HEADER] = f"{event.source}:{event.id}"
    if token:
        headers[TOKEN_HEADER] = token
    return headers, payload


def encode_answer(
    request: TaskRequest, *, source: str, type: str, data: Any, time: str
) -> tuple[str, dict[str, str], bytes]:
    """A worker's answer to ``request`` on the wire: its id, headers and payload, what
    :func:`encode_result` makes of :func:`answer_event` (the same headers in the same order,
    the same payload and errors), built straight from the request where no value needs
    escaping."""
    event_id = f"{request.action_id}.{request.attempt}.result"
    run_id = request.run_id
    traceparent = request.event.extensions.get(TRACEPARENT)
    headers = {
        "ce-specversion": SPECVERSION,
        "ce-id": event_id,
        "ce-source": source,
        "ce-type": type,
        "ce-subject": run_id,
        "ce-time": time,
        "ce-datacontenttype": JSON,
        "ce-runid": run_id,
        "ce-actionid": request.action_id,
        "ce-attempt": str(request.attempt),
    }
    if traceparent:
        headers["ce-traceparent"] = traceparent
    if isinstance(data, bytes | bytearray | memoryview) or not sent_as_is(
        "".join(headers.values())
    ):
        event = answer_event(
            run_id=run_id,
            action_id=request.action_id,
            attempt=request.attempt,
            event_id=event_id,
            source=source,
            type=type,
            data=data,
            time=time,
            traceparent=traceparent,
        )
        return (event_id, *encode_result(event, token=request.token))
    try:
        payload = b"" if data is None else msgspec.json.encode(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidCloudEvent(
            "unencodable-data", f"event {event_id!r}: data cannot be encoded as JSON: {exc}"
        ) from exc
    headers["Content-Type"] = JSON
    if traceparent:
        headers["traceparent"] = traceparent
    headers[MSG_ID_HEADER] = f"{source}:{event_id}"
    if request.token:
        headers[TOKEN_HEADER] = request.token
    return event_id, headers, payload


# --- cancel notices -------------------------------------------------------------------


def encode_cancel(
    *, run_id: str, action_id: str, time: str, attempt: int | None = None
) -> tuple[dict[str, str], bytes]:
    """A cancel notice about one attempt of an action, or (None) all of it."""
    extensions = {RUN_ID: run_id, ACTION_ID: action_id}
    if attempt is not None:
        extensions[ATTEMPT] = str(attempt)
    event = CloudEvent(
        id=f"{action_id}.cancel" if attempt is None else f"{action_id}.{attempt}.cancel",
        source=SOURCE,
        type=TASK_CANCEL,
        subject=run_id,
        time=time,
        extensions=extensions,
    )
    return encode_binary(event)


@dataclass(frozen=True, slots=True)
class CancelNotice:
    action_id: str
    attempt: int | None
    """None: every attempt requested before :attr:`time`."""
    time: str | None


class BadNotice(ValueError, InterlockError):
    """A control message that is not a usable cancel notice."""


def read_cancel(event: CloudEvent) -> CancelNotice | None:
    """The cancel notice ``event`` is (None: another control event, ignored).

    Raises:
        BadNotice: a cancel notice without an action id, or with an unreadable attempt.
    """
    if event.type != TASK_CANCEL:
        return None
    action_id = event.extensions.get(ACTION_ID)
    if not action_id:
        raise BadNotice("a cancel notice without an action id")
    raw_attempt = event.extensions.get(ATTEMPT)
    attempt: int | None = None
    if raw_attempt is not None:
        try:
            attempt = int(raw_attempt)
        except ValueError:
            raise BadNotice(f"a cancel notice for {action_id}: attempt {raw_attempt!r}") from None
    return CancelNotice(action_id=action_id, attempt=attempt, time=event.time)
