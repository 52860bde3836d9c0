"""The CloudEvents NATS binding: round trips in both modes, interop shapes, malformed input."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.transport.cloudevents import (
    _HEADER_SAFE,
    STRUCTURED_CONTENT_TYPE,
    CloudEvent,
    InvalidCloudEvent,
    _quote,
    decode_message,
    encode_binary,
    encode_structured,
    from_dict,
)

# --- strategies -----------------------------------------------------------------------

# CloudEvents strings: any Unicode except control characters (Cc) and surrogates (Cs).
ce_text = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc")), max_size=30)
non_empty_text = ce_text.filter(bool)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ce_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(ce_text, children, max_size=4)
    ),
    max_leaves=12,
)
reserved = {"specversion", "id", "source", "type", "subject", "time"}
reserved |= {"datacontenttype", "dataschema", "data", "data_base64"}
extension_names = st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True).filter(
    lambda n: n not in reserved
)
times = st.builds(
    lambda secs, micros: datetime.fromtimestamp(secs, UTC).replace(microsecond=micros).isoformat(),
    st.integers(0, 253402300799),
    st.integers(0, 999_999),
) | st.sampled_from(["2018-04-05T03:56:24Z", "1990-12-31t23:59:60.123456789-08:00"])


@st.composite
def events(draw: st.DrawFn) -> CloudEvent:
    """Events whose data survives both modes unchanged (see the module's data rules)."""
    kind = draw(st.sampled_from(["json", "absent", "text", "binary", "none"]))
    content_type: str | None
    data: Any
    if kind == "json":
        content_type = draw(st.sampled_from(["application/json", "application/vnd.x+json"]))
        data = draw(json_values.filter(lambda v: v is not None))
    elif kind == "absent":
        content_type = None
        data = draw(json_values.filter(lambda v: v is not None))
    elif kind == "text":
        content_type = draw(st.sampled_from(["text/plain", "text/csv; charset=utf-8"]))
        data = draw(non_empty_text)
    elif kind == "binary":
        content_type = "application/octet-stream"
        data = draw(st.binary(min_size=1, max_size=40))
    else:
        content_type = draw(st.none() | st.just("application/json"))
        data = None
    return CloudEvent(
        id=draw(non_empty_text),
        source=draw(non_empty_text),
        type=draw(non_empty_text),
        subject=draw(st.none() | ce_text),
        time=draw(st.none() | times),
        datacontenttype=content_type,
        dataschema=draw(st.none() | non_empty_text),
        data=data,
        extensions=draw(st.dictionaries(extension_names, ce_text, max_size=4)),
    )


# --- round trips ----------------------------------------------------------------------


@settings(max_examples=300)
@given(events())
def test_binary_mode_round_trips(event: CloudEvent) -> None:
    headers, payload = encode_binary(event)
    assert all(0x21 <= ord(c) <= 0x7E or c == " " for v in headers.values() for c in v)
    assert decode_message(headers, payload) == event


@settings(max_examples=300)
@given(events())
def test_structured_mode_round_trips(event: CloudEvent) -> None:
    headers, payload = encode_structured(event)
    assert headers["Content-Type"] == STRUCTURED_CONTENT_TYPE
    assert decode_message(headers, payload) == event


@given(events())
def test_to_dict_and_from_dict_are_inverse(event: CloudEvent) -> None:
    assert from_dict(event.to_dict()) == event


def test_binary_headers_follow_the_binding() -> None:
    event = CloudEvent(
        id="1",
        source="/src",
        type="com.example.x",
        subject='Euro € 😀 "q" 100%',
        datacontenttype="application/json",
        data={"a": 1},
        extensions={"runid": "r-1", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    )
    headers, payload = encode_binary(event)
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-subject"] == "Euro%20%E2%82%AC%20%F0%9F%98%80%20%22q%22%20100%25"
    assert headers["ce-datacontenttype"] == "application/json"
    assert headers["Content-Type"] == "application/json"
    assert headers["ce-runid"] == "r-1"
    assert headers["traceparent"] == event.extensions["traceparent"]
    assert payload == b'{"a":1}'


def test_structured_bytes_travel_as_base64() -> None:
    event = CloudEvent(id="1", source="s", type="t", data=b"\x00\xff")
    obj = msgspec.json.decode(encode_structured(event)[1])
    assert obj["data_base64"] == base64.b64encode(b"\x00\xff").decode()
    assert "data" not in obj


# --- what other senders put on the wire ------------------------------------------------


def test_structured_without_headers_as_before_nats_2_2() -> None:
    payload = b'{"specversion":"1.0","id":"a","source":"s","type":"t","data":{"x":1}}'
    event = decode_message(None, payload)
    assert event.data == {"x": 1}


def test_header_names_are_case_insensitive() -> None:
    headers = {"CE-SpecVersion": "1.0", "Ce-Id": "a", "ce-source": "s", "CE-TYPE": "t"}
    assert decode_message(headers, b"").id == "a"


def test_structured_content_type_with_parameters() -> None:
    headers = {"content-type": "Application/CloudEvents+JSON; charset=utf-8"}
    payload = b'{"specversion":"1.0","id":"a","source":"s","type":"t"}'
    assert decode_message(headers, payload).type == "t"


def test_http_style_content_type_stands_for_datacontenttype() -> None:
    headers = {"ce-specversion": "1.0", "ce-id": "a", "ce-source": "s", "ce-type": "t"}
    headers["Content-Type"] = "text/plain"
    event = decode_message(headers, b"{}")
    assert event.datacontenttype == "text/plain"
    assert event.data == "{}"


def test_double_quoted_header_values_are_accepted() -> None:
    headers = {"ce-specversion": '"1.0"', "ce-id": '"a b\\"c"', "ce-source": "s", "ce-type": "t"}
    assert decode_message(headers, b"").id == 'a b"c'


def test_lowercase_percent_escapes_are_accepted() -> None:
    headers = {"ce-specversion": "1.0", "ce-id": "%e2%82%ac", "ce-source": "s", "ce-type": "t"}
    assert decode_message(headers, b"").id == "€"


def test_trace_headers_fill_the_extensions() -> None:
    headers = {"ce-specversion": "1.0", "ce-id": "a", "ce-source": "s", "ce-type": "t"}
    headers |= {"traceparent": "00-abc-def-01", "tracestate": "k=v"}
    event = decode_message(headers, b"")
    assert event.extensions == {"traceparent": "00-abc-def-01", "tracestate": "k=v"}


def test_structured_non_string_extensions_keep_canonical_strings() -> None:
    obj = {"specversion": "1.0", "id": "a", "source": "s", "type": "t", "n": 5, "ok": True}
    assert from_dict(obj).extensions == {"n": "5", "ok": "true"}


@pytest.mark.parametrize(
    ("content_type", "payload", "expected"),
    [
        (None, b'{"a":[1,2]}', {"a": [1, 2]}),
        (None, b"plain words", "plain words"),
        (None, b"\xff\xfe", b"\xff\xfe"),
        ("application/json; charset=utf-8", b"[1]", [1]),
        ("application/cloudevents-ish+json", b"true", True),
        ("text/plain", b'{"a":1}', '{"a":1}'),
        ("application/xml", b"<a/>", "<a/>"),
        ("application/octet-stream", b"abc", b"abc"),
        ("application/json", b"", None),
    ],
)
def test_binary_data_follows_the_content_type(
    content_type: str | None, payload: bytes, expected: Any
) -> None:
    headers = {"ce-specversion": "1.0", "ce-id": "a", "ce-source": "s", "ce-type": "t"}
    if content_type is not None:
        headers["ce-datacontenttype"] = content_type
    assert decode_message(headers, payload).data == expected


# --- malformed input -------------------------------------------------------------------

REASONS = {
    "missing-attribute",
    "bad-specversion",
    "bad-attribute",
    "bad-extension-name",
    "bad-time",
    "bad-json",
    "bad-header-encoding",
    "undecodable-data",
    "unsupported-content-type",
}
BINARY_OK = {"ce-specversion": "1.0", "ce-id": "a", "ce-source": "s", "ce-type": "t"}


@pytest.mark.parametrize(
    ("headers", "payload", "reason", "mentions"),
    [
        ({**BINARY_OK, "ce-specversion": "0.3"}, b"", "bad-specversion", "'0.3'"),
        ({k: v for k, v in BINARY_OK.items() if k != "ce-id"}, b"", "missing-attribute", "'id'"),
        ({**BINARY_OK, "ce-source": ""}, b"", "missing-attribute", "'source'"),
        ({**BINARY_OK, "ce-my-ext": "x"}, b"", "bad-extension-name", "'my-ext'"),
        ({**BINARY_OK, "ce-data": "x"}, b"", "bad-extension-name", "'data'"),
        ({**BINARY_OK, "ce-id": "%C0%A0"}, b"", "bad-header-encoding", "ce-id"),
        ({**BINARY_OK, "ce-id": "a%0Ab"}, b"", "bad-attribute", "control character"),
        ({**BINARY_OK, "ce-time": "yesterday"}, b"", "bad-time", "'yesterday'"),
        ({**BINARY_OK, "ce-time": "2024-02-30T00:00:00Z"}, b"", "bad-time", "RFC 3339"),
        (
            {**BINARY_OK, "ce-datacontenttype": "application/json"},
            b"{nope",
            "undecodable-data",
            "not valid JSON",
        ),
        (
            {**BINARY_OK, "ce-datacontenttype": "text/plain"},
            b"\xff",
            "undecodable-data",
            "UTF-8",
        ),
        ({"content-type": STRUCTURED_CONTENT_TYPE}, b"{not json", "bad-json", "not valid JSON"),
        ({"content-type": STRUCTURED_CONTENT_TYPE}, b"[1, 2]", "bad-json", "an array"),
        (
            {"content-type": "application/cloudevents-batch+json"},
            b"[]",
            "unsupported-content-type",
            "batch",
        ),
        (None, b"", "bad-json", "not valid JSON"),
    ],
)
def test_malformed_messages_are_rejected_with_a_reason(
    headers: dict[str, str] | None, payload: bytes, reason: str, mentions: str
) -> None:
    with pytest.raises(InvalidCloudEvent) as caught:
        decode_message(headers, payload)
    assert caught.value.reason == reason
    assert caught.value.reason in REASONS
    assert mentions in str(caught.value)


STRUCTURED_OK = {"specversion": "1.0", "id": "a", "source": "s", "type": "t"}


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ({"id": "a", "source": "s", "type": "t"}, "missing-attribute"),
        ({**STRUCTURED_OK, "specversion": 1.0}, "bad-attribute"),
        ({**STRUCTURED_OK, "id": 7}, "bad-attribute"),
        ({**STRUCTURED_OK, "x": {}}, "bad-attribute"),
        ({**STRUCTURED_OK, "Ext": "v"}, "bad-extension-name"),
        ({**STRUCTURED_OK, "data_base64": "!!"}, "undecodable-data"),
        ({**STRUCTURED_OK, "data": 1, "data_base64": "AA=="}, "undecodable-data"),
    ],
)
def test_malformed_structured_objects(obj: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidCloudEvent) as caught:
        from_dict(obj)
    assert caught.value.reason == reason


def test_encoders_refuse_bad_extension_names() -> None:
    event = CloudEvent(id="a", source="s", type="t", extensions={"Run-Id": "x"})
    for encode in (encode_binary, encode_structured):
        with pytest.raises(InvalidCloudEvent) as caught:
            encode(event)
        assert caught.value.reason == "bad-extension-name"


def test_non_text_data_under_a_text_content_type_is_refused() -> None:
    event = CloudEvent(id="a", source="s", type="t", datacontenttype="text/plain", data={"a": 1})
    with pytest.raises(InvalidCloudEvent) as caught:
        encode_binary(event)
    assert caught.value.reason == "unencodable-data"
    assert "text/plain" in str(caught.value)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=6), st.binary())
def test_arbitrary_input_either_decodes_or_raises_invalid(
    headers: dict[str, str], payload: bytes
) -> None:
    reason = ""
    try:
        decode_message(headers, payload)
    except InvalidCloudEvent as exc:
        reason = exc.reason
    assert reason in REASONS or not reason


@given(st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=12) | ce_text)
def test_header_values_are_escaped_as_quote_escapes_them(value: str) -> None:
    """The short cut for values with nothing to escape gives what ``urllib.parse.quote``
    gives (printable ASCII but space, double quote and percent kept as is)."""
    assert _quote(value) == quote(value, safe=_HEADER_SAFE)
