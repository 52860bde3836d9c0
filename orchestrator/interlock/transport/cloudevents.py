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
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Any, Final
from urllib.parse import quote, unquote

import msgspec

from interlock.core.ids import InvalidRunId, is_run_id
from interlock.core.vocabulary import InterlockError

__all__ = [
    "SPECVERSION",
    "STRUCTURED_CONTENT_TYPE",
    "CloudEvent",
    "InvalidCloudEvent",
    "decode_message",
    "encode_binary",
    "encode_structured",
    "from_dict",
]

SPECVERSION: Final = "1.0"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"

_CE_PREFIX: Final = "ce-"
_CONTENT_TYPE: Final = "content-type"
_OPTIONAL_ATTRS: Final = ("subject", "time", "datacontenttype", "dataschema")
_REQUIRED_ATTRS: Final = ("id", "source", "type")
_CORE_ATTRS: Final = frozenset(("specversion", *_REQUIRED_ATTRS, *_OPTIONAL_ATTRS))
_RESERVED_NAMES: Final = _CORE_ATTRS | {"data", "data_base64"}
_TRACE_HEADERS: Final = ("traceparent", "tracestate")

# Printable ASCII except space, double quote and percent stays as is (binding §3.1.3.2).
_HEADER_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_PLAIN_HEADER = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")
_EXTENSION_NAME = re.compile(r"[a-z0-9]+")
# Control characters are not allowed in CloudEvents strings (spec "Type System").
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
)


MAX_DEPTH: Final = 64
"""Deepest nesting of objects and arrays accepted in an event (its data, or the whole
structured-mode object); deeper is refused with reason ``too-deep`` before anything
recursive (CEL, the log's encoder) sees it."""


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (walked level by level, no recursion)."""
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            if type(node) is dict or type(node) is list:
                below += [c for c in children if type(c) is list or type(c) is dict]
        level = below
    return False


def _json(payload: bytes, what: str) -> Any:
    """``payload`` decoded as JSON, refused when it nests beyond ``MAX_DEPTH``."""
    try:
        value = msgspec.json.decode(payload)
    except RecursionError:
        value = None
        deep = True
    else:
        # Fewer opening brackets than the limit cannot nest beyond it: most events
        # are not walked at all.
        deep = payload.count(b"[") + payload.count(b"{") > MAX_DEPTH and too_deep(value)
    if deep:
        raise InvalidCloudEvent(
            "too-deep", f"{what} nests deeper than {MAX_DEPTH} levels ({len(payload):,} bytes)"
        )
    return value


class InvalidCloudEvent(ValueError, InterlockError):
    """A message that is not a valid CloudEvent 1.0.

    Attributes:
        reason: a short machine-readable slug (``missing-attribute``, ``bad-specversion``,
            ``bad-attribute``, ``bad-extension-name``, ``bad-time``, ``bad-json``,
            ``bad-header-encoding``, ``undecodable-data``, ``unencodable-data``,
            ``unsupported-content-type``, ``too-deep``, ``bad-run-id``), fit for a metric
            label or a dead-letter subject.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class CloudEvent(msgspec.Struct, kw_only=True, frozen=True):
    """One CloudEvent 1.0.

    ``data`` is a JSON value, ``str`` or ``bytes`` (``None``: no data). ``extensions``
    holds extension attributes such as ``runid``, ``actionid`` or ``traceparent``, each in
    its canonical string form. Construction does not validate; ``decode_message`` and
    ``from_dict`` do, and the encoders check extension names.
    """

    specversion: str = SPECVERSION
    id: str
    source: str
    type: str
    subject: str | None = None
    time: str | None = None
    datacontenttype: str | None = None
    dataschema: str | None = None
    data: Any = None
    extensions: dict[str, str] = {}

    def to_dict(self) -> dict[str, Any]:
        """The structured-mode JSON object: extensions flattened, bytes as ``data_base64``."""
        obj: dict[str, Any] = {
            "specversion": self.specversion,
            "id": self.id,
            "source": self.source,
            "type": self.type,
        }
        for name in _OPTIONAL_ATTRS:
            value = getattr(self, name)
            if value is not None:
                obj[name] = value
        for name, value in self.extensions.items():
            _check_extension_name(name)
            obj[name] = value
        data = self.data
        if isinstance(data, bytes | bytearray | memoryview):
            obj["data_base64"] = base64.b64encode(data).decode("ascii")
        elif data is not None:
            obj["data"] = data
        return obj


# --- encoding -------------------------------------------------------------------------


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
    headers = {
        "ce-specversion": _quote(event.specversion),
        "ce-id": _quote(event.id),
        "ce-source": _quote(event.source),
        "ce-type": _quote(event.type),
    }
    for name in _OPTIONAL_ATTRS:
        value = getattr(event, name)
        if value is not None:
            headers[_CE_PREFIX + name] = _quote(value)
    for name, value in event.extensions.items():
        _check_extension_name(name)
        headers[_CE_PREFIX + name] = _quote(value)
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


def _quote(value: str) -> str:
    return quote(value, safe=_HEADER_SAFE)


# --- decoding -------------------------------------------------------------------------


def decode_message(headers: dict[str, str] | None, payload: bytes) -> CloudEvent:
    """Decode a NATS message (either content mode) into a validated CloudEvent.

    Raises:
        InvalidCloudEvent: the message is not a valid CloudEvent 1.0; ``.reason`` says why.
    """
    lowered = {k.lower(): v for k, v in headers.items()} if headers else {}
    content_type = lowered.get(_CONTENT_TYPE)
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
    if _CE_PREFIX + "specversion" in lowered:
        return _decode_binary(lowered, payload)
    return _decode_structured(payload)


def from_dict(obj: Any) -> CloudEvent:
    """Validate a structured-mode JSON object (as from ``to_dict``) into a CloudEvent."""
    if not isinstance(obj, dict):
        raise InvalidCloudEvent(
            "bad-json", f"a structured CloudEvent is a JSON object, not {_json_kind(obj)}"
        )
    attrs: dict[str, str] = {}
    extensions: dict[str, str] = {}
    for name, value in obj.items():
        if name in ("data", "data_base64") or value is None:
            continue
        if name in _CORE_ATTRS:
            if not isinstance(value, str):
                raise InvalidCloudEvent(
                    "bad-attribute", f"attribute {name!r} must be a string, not {_json_kind(value)}"
                )
            attrs[name] = value
        else:
            extensions[name] = _extension_string(name, value)
    data = obj.get("data")
    encoded = obj.get("data_base64")
    if encoded is not None:
        if data is not None:
            raise InvalidCloudEvent(
                "undecodable-data", "the event carries both 'data' and 'data_base64'"
            )
        if not isinstance(encoded, str):
            raise InvalidCloudEvent("undecodable-data", "'data_base64' must be a string")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidCloudEvent(
                "undecodable-data", f"'data_base64' is not valid base64: {exc}"
            ) from exc
    return _build(attrs, extensions, data)


def _decode_structured(payload: bytes) -> CloudEvent:
    try:
        obj = _json(payload, "the structured CloudEvent")
    except msgspec.DecodeError as exc:
        raise InvalidCloudEvent(
            "bad-json", f"structured CloudEvent payload is not valid JSON: {exc}"
        ) from exc
    return from_dict(obj)


def _decode_binary(lowered: dict[str, str], payload: bytes) -> CloudEvent:
    attrs: dict[str, str] = {}
    extensions: dict[str, str] = {}
    for key, raw in lowered.items():
        if not key.startswith(_CE_PREFIX):
            continue
        name = key[len(_CE_PREFIX) :]
        value = _unquote(key, raw)
        if name in _CORE_ATTRS:
            attrs[name] = value
        elif name in ("data", "data_base64"):
            raise InvalidCloudEvent(
                "bad-extension-name", f"header {key!r}: {name!r} is not an attribute name"
            )
        else:
            extensions[name] = value
    if "datacontenttype" not in attrs and _CONTENT_TYPE in lowered:
        attrs["datacontenttype"] = _unquote(_CONTENT_TYPE, lowered[_CONTENT_TYPE])
    for name in _TRACE_HEADERS:
        if name not in extensions and name in lowered:
            extensions[name] = _unquote(name, lowered[name])
    data = _decode_data(attrs.get("datacontenttype"), payload, attrs.get("id"))
    return _build(attrs, extensions, data)


def _decode_data(content_type: str | None, payload: bytes, event_id: str | None) -> Any:
    if not payload:
        return None
    kind = _media_kind(content_type)
    if kind == "json":
        try:
            return _json(payload, f"event {event_id!r}: data")
        except msgspec.DecodeError as exc:
            raise InvalidCloudEvent(
                "undecodable-data",
                f"event {event_id!r}: data declared {content_type!r} is not valid JSON: {exc}",
            ) from exc
    if kind == "absent":
        try:
            return _json(payload, f"event {event_id!r}: data")
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


def _extension_string(name: str, value: Any) -> str:
    # JSON booleans and integers are the other extension types; keep their canonical string.
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise InvalidCloudEvent(
        "bad-attribute",
        f"extension attribute {name!r} must be a string, boolean or integer, "
        f"not {_json_kind(value)}",
    )


def _check_extension_name(name: str) -> None:
    if not _EXTENSION_NAME.fullmatch(name):
        raise InvalidCloudEvent(
            "bad-extension-name",
            f"extension attribute name {name!r} must be lowercase letters and digits only",
        )
    if name in _RESERVED_NAMES:
        raise InvalidCloudEvent(
            "bad-extension-name",
            f"{name!r} is a core attribute name and cannot be an extension",
        )


def _build(attrs: dict[str, str], extensions: dict[str, str], data: Any) -> CloudEvent:
    specversion = attrs.get("specversion")
    if specversion is None:
        raise InvalidCloudEvent("missing-attribute", "required attribute 'specversion' is missing")
    if specversion != SPECVERSION:
        raise InvalidCloudEvent(
            "bad-specversion",
            f"specversion must be {SPECVERSION!r}, got {specversion!r}",
        )
    for name in _REQUIRED_ATTRS:
        if not attrs.get(name):
            raise InvalidCloudEvent(
                "missing-attribute", f"required attribute {name!r} is missing or empty"
            )
    for name, value in attrs.items():
        _check_string(name, value)
    for name, value in extensions.items():
        _check_extension_name(name)
        _check_string(name, value)
    if "runid" in extensions and not is_run_id(extensions["runid"]):
        raise InvalidCloudEvent(
            "bad-run-id", f"extension 'runid' is no run id: {InvalidRunId(extensions['runid'])}"
        )
    time = attrs.get("time")
    if time is not None:
        _check_time(time)
    return CloudEvent(
        specversion=specversion,
        id=attrs["id"],
        source=attrs["source"],
        type=attrs["type"],
        subject=attrs.get("subject"),
        time=time,
        datacontenttype=attrs.get("datacontenttype"),
        dataschema=attrs.get("dataschema"),
        data=data,
        extensions=extensions,
    )


def _check_string(name: str, value: str) -> None:
    if _CONTROL_CHARS.search(value):
        raise InvalidCloudEvent(
            "bad-attribute", f"attribute {name!r} contains a control character: {value!r}"
        )


def _check_time(value: str) -> None:
    match = _RFC3339.fullmatch(value)
    ok = match is not None
    if match is not None:
        date, hour_minute, second, _fraction, offset = match.groups()
        # Python has no leap second; a :60 is valid RFC 3339, so check it as :59.
        second = "59" if second == "60" else second
        offset = "+00:00" if offset in ("Z", "z") else offset
        try:
            datetime.fromisoformat(f"{date}T{hour_minute}:{second}{offset}")
        except ValueError:
            ok = False
    if not ok:
        raise InvalidCloudEvent(
            "bad-time", f"attribute 'time' must be an RFC 3339 timestamp, got {value!r}"
        )


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    return type(value).__name__
