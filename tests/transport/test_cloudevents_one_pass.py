"""The binding's short cuts give what reading header by header gives.

``decode_message`` reads the headers in one pass and checks every value and extension name
at once; ``encode_binary`` escapes nothing when nothing needs escaping. Each is compared
here with the straightforward reading of the binding (every header lowered, unescaped and
checked one by one), written out below as it was before the short cuts: the same event, or
the same error with the same reason and message, on random messages.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.core.ids import InvalidRunId, is_run_id
from interlock.transport import cloudevents as ce
from interlock.transport import cloudevents_model as model
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent

# --- the binding read header by header --------------------------------------------------


def reference_decode(headers: dict[str, str] | None, payload: bytes) -> CloudEvent:
    lowered = {k.lower(): v for k, v in headers.items()} if headers else {}
    content_type = lowered.get("content-type")
    if content_type is not None:
        media = content_type.split(";", 1)[0].strip().lower()
        if media.startswith("application/cloudevents"):
            if media != ce.STRUCTURED_CONTENT_TYPE:
                raise InvalidCloudEvent(
                    "unsupported-content-type",
                    f"content type {content_type!r} is not supported; "
                    f"use {ce.STRUCTURED_CONTENT_TYPE} or binary mode",
                )
            return ce._decode_structured(payload)
    if "ce-specversion" not in lowered:
        return ce._decode_structured(payload)
    attrs: dict[str, str] = {}
    extensions: dict[str, str] = {}
    for key, raw in lowered.items():
        if not key.startswith("ce-"):
            continue
        name = key[3:]
        value = raw.strip()
        if "%" in value or value[:1] == '"':
            value = ce._unquote(key, raw)
        if name in model.CORE_ATTRS:
            attrs[name] = value
        elif name in ("data", "data_base64"):
            raise InvalidCloudEvent(
                "bad-extension-name", f"header {key!r}: {name!r} is not an attribute name"
            )
        else:
            extensions[name] = value
    if "datacontenttype" not in attrs and "content-type" in lowered:
        attrs["datacontenttype"] = ce._unquote("content-type", lowered["content-type"])
    for name in ("traceparent", "tracestate"):
        if name not in extensions and name in lowered:
            extensions[name] = ce._unquote(name, lowered[name])
    data = ce._decode_data(attrs.get("datacontenttype"), payload, attrs.get("id"))
    return reference_build(attrs, extensions, data)


def reference_build(attrs: dict[str, str], extensions: dict[str, str], data: Any) -> CloudEvent:
    specversion = attrs.get("specversion")
    if specversion is None:
        raise InvalidCloudEvent("missing-attribute", "required attribute 'specversion' is missing")
    if specversion != "1.0":
        raise InvalidCloudEvent(
            "bad-specversion", f"specversion must be '1.0', got {specversion!r}"
        )
    for name in ("id", "source", "type"):
        if not attrs.get(name):
            raise InvalidCloudEvent(
                "missing-attribute", f"required attribute {name!r} is missing or empty"
            )
    for name, value in attrs.items():
        model._check_string(name, value)
    for name, value in extensions.items():
        model.check_extension_name(name)
        model._check_string(name, value)
    if "runid" in extensions and not is_run_id(extensions["runid"]):
        raise InvalidCloudEvent(
            "bad-run-id", f"extension 'runid' is no run id: {InvalidRunId(extensions['runid'])}"
        )
    if attrs.get("time") is not None:
        model._check_time(attrs["time"])
    return CloudEvent(
        specversion=specversion,
        id=attrs["id"],
        source=attrs["source"],
        type=attrs["type"],
        subject=attrs.get("subject"),
        time=attrs.get("time"),
        datacontenttype=attrs.get("datacontenttype"),
        dataschema=attrs.get("dataschema"),
        data=data,
        extensions=extensions,
    )


def reference_encode(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    def q(value: str) -> str:
        return quote(value, safe=ce._HEADER_SAFE)

    headers = {
        "ce-specversion": q(event.specversion),
        "ce-id": q(event.id),
        "ce-source": q(event.source),
        "ce-type": q(event.type),
    }
    for name in model.OPTIONAL_ATTRS:
        value = getattr(event, name)
        if value is not None:
            headers["ce-" + name] = q(value)
    for name, value in event.extensions.items():
        model.check_extension_name(name)
        headers["ce-" + name] = q(value)
    ct = event.datacontenttype
    if (
        ct is not None
        and ce._PLAIN_HEADER.fullmatch(ct)
        and not ct.lower().startswith("application/cloudevents")
    ):
        headers["Content-Type"] = ct
    if event.extensions.get("traceparent") is not None:
        headers["traceparent"] = q(event.extensions["traceparent"])
    return headers, ce._encode_data(event)


# --- strategies -----------------------------------------------------------------------

# Mostly what Interlock's own messages carry, with now and then what breaks a rule: a
# control character, a percent escape, quotes, spaces around, a name of any case.
values = st.one_of(
    st.sampled_from(
        [
            "1.0",
            "r4421b07271dd4a1f9b0c2d3e4f5a6b7c",
            "r4421b07271dd4a1f9b0c2d3e4f5a6b7c.3",
            "interlock://orchestrator",
            "io.interlock.task.requested",
            "2026-12-03T23:13:08.688Z",
            "2026-02-30T00:00:00Z",
            "application/json",
            "text/plain",
            "application/cloudevents+json",
            "application/cloudevents-batch+json",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "",
            " spaced ",
            '"quoted \\" value"',
            "a%20b",
            "%C0%A0",
            "tab\there",
            "caf%C3%A9",
        ]
    ),
    st.text(max_size=12),
)
names = st.one_of(
    st.sampled_from(
        [
            "ce-specversion",
            "ce-id",
            "ce-source",
            "ce-type",
            "ce-subject",
            "ce-time",
            "ce-datacontenttype",
            "ce-dataschema",
            "ce-runid",
            "ce-actionid",
            "ce-attempt",
            "ce-traceparent",
            "ce-data",
            "ce-data_base64",
            "ce-My-Ext",
            "CE-ID",
            "Ce-Type",
            "Content-Type",
            "content-type",
            "traceparent",
            "TraceState",
            "Nats-Msg-Id",
            "Interlock-Token",
        ]
    ),
    st.text(max_size=10),
)
REQUIRED = {"ce-specversion": "1.0", "ce-id": "a", "ce-source": "s", "ce-type": "t"}
messages = st.tuples(
    st.one_of(st.none(), st.just(REQUIRED), st.just({})),
    st.lists(st.tuples(names, values), max_size=14),
    st.sampled_from([b"", b'{"n": 1}', b"[1, 2]", b"{nope", b"text", b"\xff"]),
)


def outcome(decode: Any, headers: dict[str, str] | None, payload: bytes) -> Any:
    try:
        return decode(headers, payload)
    except InvalidCloudEvent as exc:
        return (exc.reason, str(exc))
    except UnicodeError as exc:
        return (type(exc), str(exc))


@settings(max_examples=2000)
@given(messages)
def test_decoding_in_one_pass_reads_what_header_by_header_reads(message: Any) -> None:
    base, pairs, payload = message
    headers = None if base is None else {**base, **dict(pairs)}
    # Before and after the reference has seen (and remembered) the extension names:
    # names not seen before take the one-by-one checks, the others the check at once.
    first = outcome(ce.decode_message, headers, payload)
    expected = outcome(reference_decode, headers, payload)
    assert first == expected
    assert outcome(ce.decode_message, headers, payload) == expected


def test_a_task_request_is_read_in_one_pass() -> None:
    from interlock.transport.tasks import task_request

    headers, payload = task_request(
        run_id="r4421b07271dd4a1f9b0c2d3e4f5a6b7c",
        seq=3,
        capability="review",
        data={"n": 1},
        attempt=1,
        deadline=None,
        now=model.datetime(2026, 12, 3, tzinfo=model.datetime.now().astimezone().tzinfo),
        token="t",
    )
    assert ce.decode_message(headers, payload) == reference_decode(headers, payload)


events = st.builds(
    CloudEvent,
    id=values.filter(bool),
    source=values.filter(bool),
    type=values.filter(bool),
    subject=st.none() | values,
    time=st.none() | values,
    datacontenttype=st.none() | values,
    dataschema=st.none() | values,
    data=st.none() | st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    extensions=st.dictionaries(
        st.sampled_from(["runid", "actionid", "attempt", "traceparent", "Bad-Name", "x1"])
        | st.text(max_size=6),
        values,
        max_size=5,
    ),
)


@settings(max_examples=1000)
@given(events)
def test_headers_sent_as_they_are_are_what_escaping_each_gives(event: CloudEvent) -> None:
    def encoded(encode: Any) -> Any:
        try:
            return encode(event)
        except InvalidCloudEvent as exc:
            return (exc.reason, str(exc))
        except UnicodeError as exc:
            return (type(exc), str(exc))

    first = encoded(ce.encode_binary)
    expected = encoded(reference_encode)
    assert first == expected
    if isinstance(expected[0], dict):
        assert list(first[0]) == list(expected[0])  # the same order on the wire
    assert encoded(ce.encode_binary) == expected


@pytest.mark.parametrize(
    ("values_", "as_is"),
    [(["a", "b"], True), (["a b"], False), (["a", "%"], False), ([""], True), (['"'], False)],
)
def test_sent_as_is_means_nothing_to_escape(values_: list[str], as_is: bool) -> None:
    assert ce.sent_as_is("".join(values_)) is as_is
    assert all(ce._quote(v) == v for v in values_) is as_is
