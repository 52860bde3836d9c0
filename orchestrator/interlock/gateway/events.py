"""CloudEvents over HTTP (the HTTP protocol binding 1.0) into the EVENTS stream.

The three content modes of the binding:

- binary: ``ce-*`` headers carry the attributes (percent-encoded), the body is the data and
  ``Content-Type`` its ``datacontenttype``;
- structured: ``Content-Type: application/cloudevents+json``, the body one JSON event;
- batched: ``Content-Type: application/cloudevents-batch+json``, the body a JSON array of
  structured events.

Header and JSON rules are the same as the NATS binding's (percent-encoding, extension names,
``data``/``data_base64``), so the codec of ``interlock.transport.cloudevents`` reads
them; the ``cloudevents`` SDK has no batched mode and rewrites ``time``, so the tests use
it as the reference *sender* instead. Each event is then stored by ``Client.emit``, as a
program or ``interlock emit`` stores one (``Nats-Msg-Id`` = source + id), which says which
runs it starts: their ids are derived from the workflow and the event's source and id, so
they are known before the orchestrator has started them.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from interlock.core.bounds import MAX_DEPTH, too_deep
from interlock.core.ids import InvalidEventType, check_event_type
from interlock.core.names import EVENT_TYPE
from interlock.gateway.problems import Problem
from interlock.runtime.addressing import RESERVED_TYPES
from interlock.transport.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    CloudEvent,
    InvalidCloudEvent,
    decode_message,
    from_dict,
)

BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
MAX_BATCH = 100
_RESERVED_EXTENSIONS = ("actionid", "timerid", "attempt")


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def parse_http(headers: Mapping[str, str], body: bytes) -> tuple[str, list[CloudEvent]]:
    """The content mode and the events of one HTTP request.

    Raises:
        Problem: 400 naming what is wrong (and which event of a batch), 415 for a body that
            is no CloudEvent in any mode.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    media = media_type(lowered.get("content-type"))
    if media == BATCH_CONTENT_TYPE:
        try:
            items = msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise Problem(400, "invalid-event", f"the batch is not valid JSON: {exc}") from exc
        except RecursionError:
            raise Problem(
                400,
                "invalid-event",
                f"the batch nests deeper than {MAX_DEPTH} levels in an event",
                reason="too-deep",
            ) from None
        if not isinstance(items, list):
            raise Problem(400, "invalid-event", "a batch is a JSON array of structured events")
        if not items:
            raise Problem(400, "invalid-event", "the batch is empty")
        if len(items) > MAX_BATCH:
            raise Problem(
                413, "batch-too-large", f"{len(items)} events in one batch; at most {MAX_BATCH}"
            )
        events = []
        for index, item in enumerate(items):
            try:
                events.append(check(_from_batch(item)))
            except InvalidCloudEvent as exc:
                raise Problem(
                    400,
                    "invalid-event",
                    f"event {index} of the batch: {exc}",
                    reason=exc.reason,
                    index=index,
                ) from exc
        return "batched", events
    if media.startswith("application/cloudevents"):
        if media != STRUCTURED_CONTENT_TYPE:
            raise Problem(
                415,
                "unsupported-media-type",
                f"content type {media!r}: use {STRUCTURED_CONTENT_TYPE}, "
                f"{BATCH_CONTENT_TYPE} or binary mode (ce-* headers)",
            )
        mode = "structured"
    elif "ce-specversion" in lowered:
        mode = "binary"
    else:
        raise Problem(
            415,
            "unsupported-media-type",
            "not a CloudEvent: send ce-specversion and the other ce-* headers (binary mode), "
            f"or Content-Type {STRUCTURED_CONTENT_TYPE} (structured) or {BATCH_CONTENT_TYPE} "
            "(batched)",
        )
    nats_headers = {
        k: v
        for k, v in lowered.items()
        if k.startswith("ce-") or k in ("content-type", "traceparent", "tracestate")
    }
    try:
        return mode, [check(decode_message(nats_headers, body))]
    except InvalidCloudEvent as exc:
        raise Problem(400, "invalid-event", str(exc), reason=exc.reason) from exc


def _from_batch(item: object) -> CloudEvent:
    if too_deep(item):
        raise InvalidCloudEvent("too-deep", f"it nests deeper than {MAX_DEPTH} levels")
    return from_dict(item)


def check(event: CloudEvent) -> CloudEvent:
    """What the orchestrator would refuse from outside, refused here with the reason."""
    if not EVENT_TYPE.match(event.type):
        raise InvalidCloudEvent(
            "bad-attribute",
            f"type {event.type[:80]!r} cannot be routed: dot-separated words of letters, "
            "digits, '_' or '-'",
        )
    try:
        check_event_type(event.type)  # its length too: the type is a subject's tail
    except InvalidEventType as exc:
        raise InvalidCloudEvent("bad-attribute", f"{exc} (it has {len(event.type):,})") from None
    if event.type in RESERVED_TYPES or any(k in event.extensions for k in _RESERVED_EXTENSIONS):
        raise InvalidCloudEvent(
            "reserved-attribute",
            "events from outside may not carry actionid, timerid or attempt, nor be of the "
            f"types of answers and timers ({', '.join(RESERVED_TYPES)})",
        )
    return event
