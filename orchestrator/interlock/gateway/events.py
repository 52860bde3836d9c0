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
it as the reference *sender* instead. Each event is stored as ``emit`` stores one (binary
mode, ``Nats-Msg-Id`` = source + id, so a repeat within the stream's duplicate window is
stored once).

The orchestrator starts runs asynchronously, after the event is stored. What the gateway
can say at once, and honestly, is which runs the event *starts*: a triggered run's id is
derived from the workflow and the event's source and id (``derive_run_id``), so the ids
of the workflows whose triggers match (read from the registry, as the orchestrator reads
it) are the runs it started or will start; ``GET /runs/<id>`` finds each once it exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from nats.js import JetStreamContext

from interlock.core.engine import TIMER_FIRED, derive_run_id, matching_trigger
from interlock.core.names import EVENT_TYPE
from interlock.gateway.problems import Problem
from interlock.runtime.flow import to_incoming
from interlock.runtime.registry import Registry
from interlock.transport.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    CloudEvent,
    InvalidCloudEvent,
    decode_message,
    encode_binary,
    from_dict,
)
from interlock.transport.subjects import Subjects

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
                events.append(check(from_dict(item)))
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


def check(event: CloudEvent) -> CloudEvent:
    """What the orchestrator would refuse from outside, refused here with the reason."""
    if not EVENT_TYPE.match(event.type):
        raise InvalidCloudEvent(
            "bad-attribute",
            f"type {event.type!r} cannot be routed: dot-separated words of letters, digits, "
            "'_' or '-'",
        )
    if event.type == TIMER_FIRED or any(k in event.extensions for k in _RESERVED_EXTENSIONS):
        raise InvalidCloudEvent(
            "reserved-attribute",
            "events from outside may not be timer firings or carry actionid, timerid or attempt",
        )
    return event


def triggered_runs(registry: Registry, event: CloudEvent) -> list[dict[str, Any]]:
    """The runs ``event`` starts: one per workflow whose trigger matches, its id derived."""
    if event.extensions.get("runid"):
        return []
    incoming = to_incoming(event)
    out = []
    for definition, version in list(registry.triggered_by(event.type)):
        if matching_trigger(definition, incoming) is None:
            continue
        out.append(
            {
                "run_id": derive_run_id(definition, event.source, event.id),
                "workflow": f"{definition.namespace}/{definition.name}",
                "version": version,
            }
        )
    return out


async def publish(js: JetStreamContext, subjects: Subjects, event: CloudEvent) -> tuple[int, bool]:
    """Store ``event`` in the EVENTS stream; returns (stream sequence, was a duplicate)."""
    headers, payload = encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    ack = await js.publish(subjects.event(event.type), payload, headers=headers)
    return int(ack.seq), bool(getattr(ack, "duplicate", False))


async def accept(
    js: JetStreamContext, subjects: Subjects, registry: Registry, events: list[CloudEvent]
) -> list[dict[str, Any]]:
    """Store every event (in order) and say, per event, where it went and what it starts."""
    out = []
    for event in events:
        seq, duplicate = await publish(js, subjects, event)
        item: dict[str, Any] = {
            "id": event.id,
            "source": event.source,
            "type": event.type,
            "seq": seq,
            "duplicate": duplicate,
            "runs": triggered_runs(registry, event),
        }
        if event.extensions.get("runid"):
            item["to_run"] = event.extensions["runid"]
        out.append(item)
    return out
