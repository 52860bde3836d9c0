"""The worker side of the task wire contract: request fields, result events, names.

A capability request is a binary-mode CloudEvent of type ``io.interlock.task.requested``
on ``<prefix>.cap.<capability>`` (the TASKS work-queue stream); its extensions carry
``runid``, ``actionid``, ``capability``, ``attempt`` and ``deadline``. The answer is a
CloudEvent published with JetStream to ``<prefix>.results.<run id>``: ``task.completed``,
a handler-chosen type, or ``task.failed`` with ``{"error": {"class", "message",
"retryable"}}``; its id is ``<actionid>.<attempt>.result`` and its ``Nats-Msg-Id`` is
``<source>:<id>``, so a redelivered request that is answered twice is stored once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from interlock.runtime.cloudevents_nats import CloudEvent, encode_binary

from .context import TASK_FAILED
from .errors import ErrorClass

TASK_REQUESTED: Final = "io.interlock.task.requested"
TASK_CANCEL: Final = "io.interlock.task.cancel"
ORCHESTRATOR_SOURCE: Final = "interlock://orchestrator"
MSG_ID_HEADER: Final = "Nats-Msg-Id"
JSON: Final = "application/json"

_CONSUMER_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_KV_KEY_UNSAFE = re.compile(r"[^-/_=.A-Za-z0-9]")


def consumer_name(capability: str) -> str:
    """The durable pull consumer shared by every worker of ``capability``."""
    return "cap_" + _CONSUMER_UNSAFE.sub("_", capability)


def worker_key(name: str, instance: str) -> str:
    """The workers-bucket key of one worker process."""
    key = _KV_KEY_UNSAFE.sub("_", f"{name}.{instance}")
    key = re.sub(r"\.{2,}", ".", key).strip(".")  # empty subject tokens are not allowed
    return key or "_"


def agent_source(worker_name: str) -> str:
    return f"interlock://agent/{worker_name}"


def rfc3339(moment: datetime) -> str:
    """UTC, millisecond precision, ``Z`` suffix."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class BadRequest(ValueError):
    """A task request that cannot be answered (no run id to answer to)."""


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """The fields of a task request a worker acts on."""

    event: CloudEvent
    run_id: str
    action_id: str
    attempt: int
    capability: str
    deadline: datetime | None
    deadline_problem: str | None = None
    """Why the ``deadline`` extension was ignored, if it was present but unreadable."""

    @classmethod
    def from_event(cls, event: CloudEvent, capability: str) -> TaskRequest:
        ext = event.extensions
        run_id = ext.get("runid") or event.subject
        if not run_id:
            raise BadRequest(
                f"task {event.id!r} has neither a 'runid' extension nor a subject: "
                "there is no run to answer to"
            )
        try:
            attempt = int(ext.get("attempt", "1"))
        except ValueError:
            attempt = 1
        deadline: datetime | None = None
        problem: str | None = None
        raw = ext.get("deadline")
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
            action_id=ext.get("actionid") or event.id,
            attempt=max(attempt, 1),
            capability=ext.get("capability") or capability,
            deadline=deadline,
            deadline_problem=problem,
        )


def result_event(
    request: TaskRequest, *, worker_name: str, type: str, data: Any, now: datetime
) -> CloudEvent:
    """The answer to ``request``: a completed, emitted or failed result."""
    ext = {
        "runid": request.run_id,
        "actionid": request.action_id,
        "attempt": str(request.attempt),
    }
    traceparent = request.event.extensions.get("traceparent")
    if traceparent:
        ext["traceparent"] = traceparent
    return CloudEvent(
        id=f"{request.action_id}.{request.attempt}.result",
        source=agent_source(worker_name),
        type=type,
        subject=request.run_id,
        time=rfc3339(now),
        datacontenttype=JSON,
        data=data,
        extensions=ext,
    )


def failure(
    error_class: ErrorClass, message: str, *, retryable: bool, code: str | None = None
) -> tuple[str, Any]:
    """The ``(type, data)`` of a ``task.failed`` result."""
    error: dict[str, Any] = {"class": str(error_class), "message": message, "retryable": retryable}
    if code:
        error["code"] = code
    return TASK_FAILED, {"error": error}


def encode_result(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Binary-mode headers and payload, with the dedupe ``Nats-Msg-Id``."""
    headers, payload = encode_binary(event)
    headers[MSG_ID_HEADER] = f"{event.source}:{event.id}"
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
) -> tuple[dict[str, str], bytes]:
    """Encode a task request as the orchestrator sends it (headers incl. Nats-Msg-Id, payload).

    The action id is ``<run_id>.<seq>``; ``Nats-Msg-Id`` is ``<action id>.<attempt>`` so a
    re-dispatch of the same attempt is dropped by the TASKS stream.
    """
    action_id = f"{run_id}.{seq}"
    ext = {
        "runid": run_id,
        "actionid": action_id,
        "capability": capability,
        "attempt": str(attempt),
    }
    if deadline is not None:
        ext["deadline"] = rfc3339(deadline)
    if traceparent:
        ext["traceparent"] = traceparent
    event = CloudEvent(
        id=action_id,
        source=ORCHESTRATOR_SOURCE,
        type=TASK_REQUESTED,
        subject=run_id,
        time=rfc3339(now),
        datacontenttype=JSON,
        data=data,
        extensions=ext,
    )
    headers, payload = encode_binary(event)
    headers[MSG_ID_HEADER] = f"{action_id}.{attempt}"
    return headers, payload
