"""The CloudEvent 1.0 record and the rules its attributes follow, whatever carried it:
the required attributes, extension names, strings without control characters, RFC 3339
times, a bounded depth of nesting, and a run id where one is named. The NATS binding that
encodes and decodes it is :mod:`interlock.transport.cloudevents`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

import msgspec

from interlock.core.bounds import MAX_DEPTH, MAX_EVENT_ID_BYTES, too_deep
from interlock.core.ids import InvalidRunId, is_run_id
from interlock.core.vocabulary import InterlockError

SPECVERSION: Final = "1.0"


OPTIONAL_ATTRS: Final = ("subject", "time", "datacontenttype", "dataschema")


REQUIRED_ATTRS: Final = ("id", "source", "type")


CORE_ATTRS: Final = frozenset(("specversion", *REQUIRED_ATTRS, *OPTIONAL_ATTRS))


_RESERVED_NAMES: Final = CORE_ATTRS | {"data", "data_base64"}


_EXTENSION_NAME = re.compile(r"[a-z0-9]+")
# Control characters are not allowed in CloudEvents strings (spec "Type System").


_CHECKED_NAMES: set[str] = set()
"""Extension names found valid (the same few come with every event)."""
_CHECKED_KEPT = 1_024
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
)


def decode_json(payload: bytes, what: str) -> Any:
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
            ``unsupported-content-type``, ``too-deep``, ``bad-run-id``, ``id-too-long``),
            fit for a metric label or a dead-letter subject.
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
        for name in OPTIONAL_ATTRS:
            value = getattr(self, name)
            if value is not None:
                obj[name] = value
        for name, value in self.extensions.items():
            check_extension_name(name)
            obj[name] = value
        data = self.data
        if isinstance(data, bytes | bytearray | memoryview):
            obj["data_base64"] = base64.b64encode(data).decode("ascii")
        elif data is not None:
            obj["data"] = data
        return obj


# --- encoding -------------------------------------------------------------------------


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
        if name in CORE_ATTRS:
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
    return build_event(attrs, extensions, data)


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


def check_extension_name(name: str) -> None:
    if name in _CHECKED_NAMES:
        return
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
    if len(_CHECKED_NAMES) < _CHECKED_KEPT:
        _CHECKED_NAMES.add(name)


def extension_names_checked(names: Iterable[str]) -> bool:
    """Whether every one of ``names`` was found a valid extension name before (then
    :func:`check_extension_name` has nothing to say about any of them)."""
    return _CHECKED_NAMES.issuperset(names)


def build_event(attrs: dict[str, str], extensions: dict[str, str], data: Any) -> CloudEvent:
    specversion = attrs.get("specversion")
    if specversion is None:
        raise InvalidCloudEvent("missing-attribute", "required attribute 'specversion' is missing")
    if specversion != SPECVERSION:
        raise InvalidCloudEvent(
            "bad-specversion",
            f"specversion must be {SPECVERSION!r}, got {specversion!r}",
        )
    for name in REQUIRED_ATTRS:
        if not attrs.get(name):
            raise InvalidCloudEvent(
                "missing-attribute", f"required attribute {name!r} is missing or empty"
            )
    # One search over every value, and the names checked at once when all were seen
    # before; one by one (to say which) only when something is wrong or new.
    values = "".join(attrs.values()) + "".join(extensions.values())
    if _CONTROL_CHARS.search(values) is not None or not _CHECKED_NAMES.issuperset(extensions):
        for name, value in attrs.items():
            _check_string(name, value)
        for name, value in extensions.items():
            check_extension_name(name)
            _check_string(name, value)
    check_event_id(attrs["id"])
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


def check_event_id(value: str) -> None:
    """Refuse an id longer than :data:`MAX_EVENT_ID_BYTES` (``id-too-long``)."""
    if len(value) > MAX_EVENT_ID_BYTES // 4 and len(value.encode()) > MAX_EVENT_ID_BYTES:
        raise InvalidCloudEvent(
            "id-too-long",
            f"the event's id takes {len(value.encode()):,} bytes; ids take at most "
            f"{MAX_EVENT_ID_BYTES} (UTF-8), starting {value[:40]!r}",
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
