"""CloudEvents 1.0 over NATS: the NATS protocol binding (binary and structured content modes).

Built on msgspec rather than on the cloudevents SDK's ``cloudevents.core`` event: the SDK
event parses ``time`` into a ``datetime`` (so a record does not round-trip byte for byte),
needs ``python-dateutil``, and validates through a layer of dict copies, while this codec
sits on every message the orchestrator reads or appends. The rules follow the CloudEvents
NATS protocol binding (1.0.3) and the JSON event format.

Content mode (decided by the receiver, per the binding):

- ``Content-Type: application/cloudevents+json`` (matched case-insensitively) → structured:
  the payload is one JSON event-format object, with ``data`` or ``data_base64``.
- otherwise, a ``ce-specversion`` header → binary: every attribute is a ``ce-<name>``
  header, percent-encoded (space, ``"``, ``%`` and everything outside printable ASCII), and
  the payload is the data. ``datacontenttype`` travels as ``ce-datacontenttype``; a plain
  ``Content-Type`` is accepted in its place (HTTP-style senders), and we also set it.
- neither → structured, as for servers without headers (before NATS 2.2).

How binary-mode data is read, by ``datacontenttype``:

- JSON (``application/json``, ``text/json``, ``*/*+json``): the payload is JSON-decoded.
- absent: JSON when the payload parses as JSON, else ``str`` when it is UTF-8, else ``bytes``.
- ``text/*`` and XML: ``str`` (the payload must be UTF-8).
- anything else: ``bytes``, untouched.
- an empty payload is no data (``None``).

Extension attributes are kept as their canonical string form (``dict[str, str]``): that is
how binary mode carries them anyway, and it keeps a record identical across both modes.
A ``traceparent`` extension is also sent as a plain ``traceparent`` header, and a received
``traceparent``/``tracestate`` header fills the extension when no ``ce-`` header carries it.

The event itself and the rules its attributes follow are in
:mod:`interlock.transport.cloudevents_model`; this module is where callers find both.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import quote, unquote

import msgspec

from interlock.core.bounds import MAX_DEPTH, too_deep
from interlock.transport.cloudevents_model import (
    CORE_ATTRS,
    OPTIONAL_ATTRS,
    SPECVERSION,
    CloudEvent,
    InvalidCloudEvent,
    build_event,
    check_extension_name,
    decode_json,
    extension_names_checked,
    from_dict,
)

__all__ = [
    "MAX_DEPTH",
    "SPECVERSION",
    "STRUCTURED_CONTENT_TYPE",
    "CloudEvent",
    "InvalidCloudEvent",
    "decode_message",
    "encode_binary",
    "encode_structured",
    "from_dict",
    "sent_as_is",
    "too_deep",
]

STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"


_CE_PREFIX: Final = "ce-"


_CONTENT_TYPE: Final = "content-type"


_TRACE_HEADERS: Final = ("traceparent", "tracestate")


_OTHER_HEADERS: Final = frozenset((_CONTENT_TYPE, *_TRACE_HEADERS))
"""The headers without the ``ce-`` prefix that a binary-mode event is read from."""

# Printable ASCII except space, double quote and percent stays as is (binding §3.1.3.2).


_HEADER_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')


_UNQUOTED = re.compile(r"[\x21\x23\x24\x26-\x7e]*")
"""A value made of ``_HEADER_SAFE`` characters only (left as it is by ``_quote``)."""


_PLAIN_HEADER = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")


def encode_structured(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Encode in structured mode: ``(headers, payload)`` with a JSON event-format payload."""
    headers = {"Content-Type": STRUCTURED_CONTENT_TYPE}
    traceparent = event.extensions.get("traceparent")
    if traceparent is not None:
        headers["traceparent"] = traceparent
    obj = event.to_dict()
    try:
        payload = msgspec.json.encode(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidCloudEvent(
            "unencodable-data", f"event {event.id!r}: data cannot be encoded as JSON: {exc}"
        ) from exc
    return headers, payload


def encode_binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Encode in binary mode: ``ce-*`` headers and the data as the payload."""
    headers = _plain_headers(event)
    if headers is None:
        headers = _quoted_headers(event)
    ct = event.datacontenttype
    if (
        ct is not None
        and _PLAIN_HEADER.fullmatch(ct)
        and not ct.lower().startswith("application/cloudevents")
    ):
        # Mirrored for readers that look at Content-Type; ce-datacontenttype is authoritative
        # (a CloudEvents media type here would make receivers read the message as structured).
        headers["Content-Type"] = ct
    traceparent = event.extensions.get("traceparent")
    if traceparent is not None:
        headers["traceparent"] = _quote(traceparent)
    return headers, _encode_data(event)


def _quoted_headers(event: CloudEvent) -> dict[str, str]:
    """The ``ce-`` headers, each value percent-encoded and each extension name checked."""
    headers = {
        "ce-specversion": _quote(event.specversion),
        "ce-id": _quote(event.id),
        "ce-source": _quote(event.source),
        "ce-type": _quote(event.type),
    }
    for name in OPTIONAL_ATTRS:
        value = getattr(event, name)
        if value is not None:
            headers[_CE_PREFIX + name] = _quote(value)
    for name, value in event.extensions.items():
        check_extension_name(name)
        headers[_CE_PREFIX + name] = _quote(value)
    return headers


def _plain_headers(event: CloudEvent) -> dict[str, str] | None:
    """:func:`_quoted_headers` when no value has anything to escape and every extension
    name was found valid before (most events): checked at once, not one by one. None
    otherwise."""
    extensions = event.extensions
    if not extension_names_checked(extensions):
        return None
    headers = {
        "ce-specversion": event.specversion,
        "ce-id": event.id,
        "ce-source": event.source,
        "ce-type": event.type,
    }
    if event.subject is not None:
        headers["ce-subject"] = event.subject
    if event.time is not None:
        headers["ce-time"] = event.time
    if event.datacontenttype is not None:
        headers["ce-datacontenttype"] = event.datacontenttype
    if event.dataschema is not None:
        headers["ce-dataschema"] = event.dataschema
    for name, value in extensions.items():
        headers[_CE_PREFIX + name] = value
    if not sent_as_is("".join(headers.values())):
        return None
    return headers


def _encode_data(event: CloudEvent) -> bytes:
    data = event.data
    if data is None:
        return b""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    kind = _media_kind(event.datacontenttype)
    if kind in ("json", "absent"):
        try:
            return msgspec.json.encode(data)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidCloudEvent(
                "unencodable-data", f"event {event.id!r}: data cannot be encoded as JSON: {exc}"
            ) from exc
    if isinstance(data, str):
        return data.encode("utf-8")
    raise InvalidCloudEvent(
        "unencodable-data",
        f"event {event.id!r}: data of type {type(data).__name__} cannot be sent as "
        f"{event.datacontenttype!r}; give str or bytes, or a JSON content type",
    )


def sent_as_is(values: str) -> bool:
    """Whether binary mode sends ``values`` (header values joined: each is sent as it is
    when they all are) without percent-encoding anything."""
    return _UNQUOTED.fullmatch(values) is not None


def _quote(value: str) -> str:
    if _UNQUOTED.fullmatch(value) is not None:
        return value  # nothing to escape: what quote() returns, without its per-byte loop
    return quote(value, safe=_HEADER_SAFE)


# --- decoding -------------------------------------------------------------------------


def decode_message(headers: dict[str, str] | None, payload: bytes) -> CloudEvent:
    """Decode a NATS message (either content mode) into a validated CloudEvent.

    Raises:
        InvalidCloudEvent: the message is not a valid CloudEvent 1.0; ``.reason`` says why.
    """
    if not headers:
        return _decode_structured(payload)
    # One pass over the headers, names lowered: the ``ce-`` ones read as attributes and
    # extensions, the binding's few others kept. A value to unescape or a name refused
    # is left to _decode_binary, which reads the headers again one by one.
    attrs: dict[str, str] = {}
    extensions: dict[str, str] = {}
    other: dict[str, str] = {}
    plain = True
    for key, raw in headers.items():
        lowered = key.lower()
        if lowered[:3] != _CE_PREFIX:
            if lowered in _OTHER_HEADERS:
                other[lowered] = raw
            continue
        name = lowered[3:]
        value = raw.strip()
        if "%" in value or value[:1] == '"':
            plain = False
        if name in CORE_ATTRS:
            attrs[name] = value
        else:
            extensions[name] = value
    content_type = other.get(_CONTENT_TYPE)
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media.startswith("application/cloudevents"):
            if media != STRUCTURED_CONTENT_TYPE:
                raise InvalidCloudEvent(
                    "unsupported-content-type",
                    f"content type {content_type!r} is not supported; "
                    f"use {STRUCTURED_CONTENT_TYPE} or binary mode",
                )
            return _decode_structured(payload)
    if "specversion" not in attrs:
        return _decode_structured(payload)
    if not plain or "data" in extensions or "data_base64" in extensions:
        return _decode_binary(headers, payload)
    return _binary_event(attrs, extensions, other, payload)


def _decode_structured(payload: bytes) -> CloudEvent:
    try:
        obj = decode_json(payload, "the structured CloudEvent")
    except msgspec.DecodeError as exc:
        raise InvalidCloudEvent(
            "bad-json", f"structured CloudEvent payload is not valid JSON: {exc}"
        ) from exc
    return from_dict(obj)


def _decode_binary(headers: dict[str, str], payload: bytes) -> CloudEvent:
    """A binary-mode event read header by header: values unescaped, names refused."""
    lowered = {k.lower(): v for k, v in headers.items()}
    attrs: dict[str, str] = {}
    extensions: dict[str, str] = {}
    for key, raw in lowered.items():
        if not key.startswith(_CE_PREFIX):
            continue
        name = key[len(_CE_PREFIX) :]
        value = raw.strip()
        if "%" in value or value[:1] == '"':
            value = _unquote(key, raw)
        if name in CORE_ATTRS:
            attrs[name] = value
        elif name in ("data", "data_base64"):
            raise InvalidCloudEvent(
                "bad-extension-name", f"header {key!r}: {name!r} is not an attribute name"
            )
        else:
            extensions[name] = value
    other = {k: v for k, v in lowered.items() if k in _OTHER_HEADERS}
    return _binary_event(attrs, extensions, other, payload)


def _binary_event(
    attrs: dict[str, str], extensions: dict[str, str], other: dict[str, str], payload: bytes
) -> CloudEvent:
    """The event of the ``ce-`` headers read (``attrs``, ``extensions``), the binding's
    other headers (``other``, by lowered name) and the payload."""
    if other:
        if "datacontenttype" not in attrs and _CONTENT_TYPE in other:
            attrs["datacontenttype"] = _unquote(_CONTENT_TYPE, other[_CONTENT_TYPE])
        for name in _TRACE_HEADERS:
            if name not in extensions and name in other:
                extensions[name] = _unquote(name, other[name])
    data = _decode_data(attrs.get("datacontenttype"), payload, attrs.get("id"))
    return build_event(attrs, extensions, data)


def _decode_data(content_type: str | None, payload: bytes, event_id: str | None) -> Any:
    if not payload:
        return None
    kind = _media_kind(content_type)
    if kind == "json":
        try:
            return decode_json(payload, f"event {event_id!r}: data")
        except msgspec.DecodeError as exc:
            raise InvalidCloudEvent(
                "undecodable-data",
                f"event {event_id!r}: data declared {content_type!r} is not valid JSON: {exc}",
            ) from exc
    if kind == "absent":
        try:
            return decode_json(payload, f"event {event_id!r}: data")
        except msgspec.DecodeError:
            pass
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError:
            return bytes(payload)
    if kind == "text":
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidCloudEvent(
                "undecodable-data",
                f"event {event_id!r}: data declared {content_type!r} is not UTF-8 text",
            ) from exc
    return bytes(payload)


def _media_kind(content_type: str | None) -> str:
    """Classify a content type: ``json``, ``text``, ``binary`` or ``absent``."""
    if content_type is None:
        return "absent"
    media = content_type.split(";", 1)[0].strip().lower()
    if media in ("application/json", "text/json") or media.endswith("+json"):
        return "json"
    if media.startswith("text/") or media == "application/xml" or media.endswith("+xml"):
        return "text"
    return "binary"


def _unquote(key: str, raw: str) -> str:
    value = raw.strip()
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        # Older senders may quote values (RFC 7230 §3.2.6): drop quotes, resolve escapes.
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    try:
        return unquote(value, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidCloudEvent(
            "bad-header-encoding",
            f"header {key!r}: percent-encoded value is not valid UTF-8: {raw!r}",
        ) from exc
