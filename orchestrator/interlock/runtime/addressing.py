"""What an inbound event may reach, decided from the subject it came on.

JetStream does not record who published a message, so the orchestrator cannot tell a
publisher's event from the operator's by the message itself. What it can trust is the
subject: NATS lets each identity publish only the subjects its permissions allow
(``interlock.auth.roles``). So the subject, not the event, says what the event may do:

- ``<prefix>.events.<type>``: an event for whichever workflows want it, by their triggers
  and correlation keys (declared by the workflow's author). Its ``type`` must be the
  subject's (a publisher allowed ``acme.>`` could otherwise send any type under its own
  subject), and it may not carry ``runid``: steering a run by its id is not a publisher's
  right, and here any publisher could have sent it.
- ``<prefix>.events.@run.<run_id>.<type>``: an event for that one run (``interlock signal``,
  the gateway's signal endpoint, a signed webhook's signal). Only the operator, the gateway
  and the orchestrator may publish there; its ``runid``, when present, must be the
  subject's.

On either, nobody from outside may speak for an action or a timer: ``actionid`` and
``timerid``, a timer firing's type and the answer types ``task.completed``/``task.failed``
come only from agents' answers and the timers, which arrive on subjects of their own.
"""

from __future__ import annotations

from typing import Final

import msgspec

from interlock.core.engine import TASK_COMPLETED, TASK_FAILED, TIMER_FIRED
from interlock.core.ids import is_run_id
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import ADDRESSED, Subjects

__all__ = ["RESERVED_EXTENSIONS", "RESERVED_TYPES", "Refused", "admit"]

RESERVED_EXTENSIONS: Final = ("actionid", "timerid")
RESERVED_TYPES: Final = (TIMER_FIRED, TASK_COMPLETED, TASK_FAILED)


class Refused(Exception):
    """An inbound event that may not go where it asks: dead-lettered with ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def admit(subjects: Subjects, subject: str, event: CloudEvent) -> tuple[CloudEvent, str | None]:
    """``event`` (received on ``subject``) and the run it is addressed to; None when it is
    for triggers and correlation.

    Raises:
        Refused: the event may not be taken from that subject (see the module's doc).
    """
    route = subjects.inbound_route(subject)
    if route is None:
        raise Refused("bad-subject", f"{subject!r} is no inbound events subject")
    run_id, subject_type = route
    if event.type != subject_type:
        raise Refused(
            "type-mismatch",
            f"the event's type {event.type!r} is not its subject's ({subject_type!r}): an "
            "event is published on the subject of its own type",
        )
    if event.type in RESERVED_TYPES or any(k in event.extensions for k in RESERVED_EXTENSIONS):
        raise Refused(
            "reserved-attribute",
            "external events may not carry actionid or timerid, nor be of the types of "
            f"answers and timers ({', '.join(RESERVED_TYPES)})",
        )
    claimed = event.extensions.get("runid")
    if run_id is None:
        if claimed is not None:
            raise Refused(
                "runid-refused",
                f"an event on {subject} may not carry runid: events reach runs through their "
                "workflows' triggers and correlation keys; only the operator and the gateway "
                f"address one run (on {subjects.prefix}.events.{ADDRESSED}.<run>.<type>)",
            )
        return event, None
    if not is_run_id(run_id):
        raise Refused("bad-run-id", f"{subject!r} names no run: {run_id!r} is no run id")
    if claimed is not None and claimed != run_id:
        raise Refused(
            "runid-mismatch", f"the event's runid {claimed!r} is not its subject's ({run_id!r})"
        )
    if claimed is None:
        # The subject is the address: the recorded copy names its run as a signal's does.
        event = msgspec.structs.replace(event, extensions={**event.extensions, "runid": run_id})
    return event, run_id
