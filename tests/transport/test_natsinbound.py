"""Messages in on Interlock's client: the same messages, headers and statuses as nats-py's
parser and header parser make of the same bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats import errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.protocol.parser import Parser

from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.natsclient import NatsClient, round_trip
from interlock.transport.natsinbound import (
    LazyHeadersMsg,
    MessageParser,
    parse_header_lines,
    parse_headers,
    status_of,
)

# Header lines as clients write them, and every way to be slightly off that form.
NAMES = ["ce-type", "Nats-Msg-Id", "Status", "a", "x.y~z", "", "b c", "é"]
VALUES = ["", "v", "a b", " v", "v ", "\tv", "v\x0b", "\x0cv", "x:y", "v\x1c", "é", "\r", "a\nb"]
SEPARATORS = [": ", ":", ":  ", " : ", ":\t", " ", "\x1c: "]
ENDS = [b"\r\n", b"\r\n", b"\r\n", b"\n", b"", b"\r\n\r\n"]
_NAMES = st.sampled_from(NAMES)
_VALUES = st.sampled_from(VALUES)
_SEPARATORS = st.sampled_from(SEPARATORS)
_PLAIN_NAMES = st.sampled_from(["ce-type", "Nats-Msg-Id", "Status", "a", "x.y~z"])
_LINE = st.one_of(
    st.tuples(_PLAIN_NAMES, st.just(": "), _VALUES),  # plain but for the value, maybe
    st.tuples(_NAMES, _SEPARATORS, _VALUES),
).map(lambda t: "".join(t).encode())
_ENDS = st.sampled_from(ENDS)
_BLOCK = st.lists(st.tuples(_LINE, _ENDS).map(b"".join), max_size=8).map(b"".join)


@settings(max_examples=500)
@given(_BLOCK)
def test_header_lines_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert list(parse_header_lines(raw).items()) == list(Client._parse_header_lines(raw).items())


def test_every_line_of_a_kind_parses_as_nats_py_parses_it() -> None:
    for name, separator, value, end in itertools.product(NAMES, SEPARATORS, VALUES, ENDS):
        raw = f"{name}{separator}{value}".encode() + end
        assert parse_header_lines(raw) == Client._parse_header_lines(raw), raw


def test_a_block_with_names_seen_before_parses_as_before() -> None:
    raw = b"ce-type: a.b\r\nce-id: 1\r\nempty: \r\nce-type: again\r\n\r\n"
    assert parse_header_lines(raw) == {"ce-type": "again", "ce-id": "1", "empty": ""}
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)


_STATUS_LINES = st.sampled_from(
    [
        b"NATS/1.0\r\n",
        b"NATS/1.0 404\r\n",
        b"NATS/1.0 408 Request Timeout\r\n",
        b"NATS/1.0 100 Idle Heartbeat\r\n",
        b"NATS/1.0 100 FlowControl Request\r\n",
        b"NATS/1.0 503\r\n",
        b"NATS/1.0 abc\r\n",
        b"NATS/1.0  4\r\n",
        b"NATS/1.0 ",
        b"NATS/1.0",
    ]
)
_HEADER_BLOCKS = st.tuples(_STATUS_LINES, _BLOCK, st.sampled_from([b"\r\n", b""])).map(b"".join)


async def _nats_py_headers(raw: bytes) -> Any:
    try:
        hdr = await Client()._process_headers(raw)
    except Exception as exc:  # noqa: BLE001
        return type(exc)
    return None if hdr is None else [(type(k), k, v) for k, v in hdr.items()]


def _our_headers(raw: bytes) -> Any:
    try:
        hdr = parse_headers(raw)
    except Exception as exc:  # noqa: BLE001
        return type(exc)
    return None if hdr is None else [(type(k), k, v) for k, v in hdr.items()]


@settings(max_examples=500)
@given(_HEADER_BLOCKS)
def test_header_blocks_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert _our_headers(raw) == asyncio.run(_nats_py_headers(raw))


def _lazy(raw: bytes, reply: str = "") -> LazyHeadersMsg:
    msg = object.__new__(LazyHeadersMsg)
    msg.__dict__ = {"_client": None, "subject": "s", "reply": reply, "data": b"", "_raw": raw}
    return msg


@settings(max_examples=500)
@given(_HEADER_BLOCKS.filter(lambda raw: len(raw) > len(b"NATS/1.0")))
def test_a_status_is_what_the_parsed_headers_say(raw: bytes) -> None:
    try:
        expected = _lazy(raw).headers
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)):
            status_of(_lazy(raw))
        return
    want = expected.get("Status") if expected else None
    msg = _lazy(raw)
    assert status_of(msg) == want
    assert msg.headers == expected
    assert status_of(msg) == want  # once parsed, read from the headers


def test_a_delivered_messages_own_status_header_is_no_server_status() -> None:
    """A server status has no reply; a message JetStream delivers has an ack subject, and
    a ``Status`` header on it is its publisher's (a status look-alike taken for "no
    messages" was left unacknowledged and never handled)."""
    ack = "$JS.ACK.IL_EVENTS.ingress.1.7.7.1796380935101700304.0"
    own = b"NATS/1.0\r\nStatus: 404\r\nDescription: No Messages\r\n\r\n"
    assert status_of(_lazy(own, reply=ack)) is None
    assert status_of(Msg(None, subject="s", reply=ack, headers={"Status": "409"})) is None
    assert status_of(_lazy(b"NATS/1.0 404 No Messages\r\n\r\n")) == "404"
    assert status_of(_lazy(b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")) == "100"
    assert status_of(Msg(None, subject="s", headers={"Status": "408"})) == "408"


def test_lazy_headers_read_and_change_as_a_msgs_do() -> None:
    msg = _lazy(b"NATS/1.0\r\nce-id: 1\r\n\r\n")
    assert "headers" not in msg.__dict__
    assert msg._ackd is False
    assert msg._metadata is None
    assert msg.headers == {"ce-id": "1"}
    assert msg.header == {"ce-id": "1"}
    assert dataclasses.asdict(msg)["headers"] == {"ce-id": "1"}
    msg.headers = {"other": "2"}
    assert msg.headers == {"other": "2"}
    assert dataclasses.replace(msg, data=b"x").headers == {"other": "2"}
    assert LazyHeadersMsg.headers is None  # the field's default, as on Msg
    assert isinstance(msg, Msg)


class _Recorder(NatsClient):
    """What a parser hands to its client, in order (a message to a direct handler and one
    to ``_process_msg`` alike)."""

    def __init__(self, direct: set[int]) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []
        self._direct = dict.fromkeys(direct, lambda _: None)

    def _deliver(self, handler: Any, *args: Any) -> Exception | None:
        self.seen.append(("msg", *args))
        return None

    async def _process_msg(self, *args: Any) -> None:
        self.seen.append(("msg", *args))

    async def _process_ping(self) -> None:
        self.seen.append(("ping",))

    async def _process_pong(self) -> None:
        self.seen.append(("pong",))

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        self.seen.append(("info", info))

    async def _process_err(self, err_msg: str) -> None:
        self.seen.append(("err", err_msg))


_TOKENS = st.sampled_from(["a", "il.runs.r1", "_INBOX.x.1", "$JS.ACK.S.C.1.2.3.4.0"])
_GAPS = st.sampled_from([" ", " ", "\t", "  "])
_PAYLOADS = st.sampled_from([b"", b"x", b"hello\r\nMSG a 1 2\r\n", b"y" * 300])


@st.composite
def _op(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(["msg", "msg", "hmsg", "hmsg", "ping", "pong", "ok", "info", "err"])
    )
    if kind in ("msg", "hmsg"):
        gap = draw(_GAPS)
        sid = draw(st.sampled_from(["1", "2", "3", "12"]))
        parts = [kind.upper(), draw(_TOKENS), sid]
        if draw(st.booleans()):
            parts.append(draw(_TOKENS))
        payload = draw(_PAYLOADS)
        if kind == "hmsg":
            headers = draw(_HEADER_BLOCKS.filter(lambda raw: len(raw) > 8)) + b"\r\n"
            parts += [str(len(headers)), str(len(headers) + len(payload))]
            payload = headers + payload
        else:
            parts.append(str(len(payload)))
        return gap.join(parts).encode() + b"\r\n" + payload + b"\r\n"
    return {
        "ping": b"PING\r\n",
        "pong": b"PONG\r\n",
        "ok": b"+OK\r\n",
        "info": b'INFO {"server_id":"x"}\r\n',
        "err": b"-ERR 'Permissions Violation'\r\n",
    }[kind]


async def _parse(parser: Parser, chunks: list[bytes]) -> Any:
    try:
        for chunk in chunks:
            await parser.parse(chunk)
    except Exception as exc:  # noqa: BLE001
        return type(exc), str(exc)
    return None


def _chunks(stream: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({c % (len(stream) + 1) for c in cuts})
    return [stream[i:j] for i, j in zip([0, *at], [*at, len(stream)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_op(), max_size=12).map(b"".join),
    st.lists(st.integers(min_value=0), max_size=10),
    st.sampled_from([b"", b"FOO bar\r\n", b"MSG a x 1\r\nz\r\n", b"MSG a 1"]),
)
def test_messages_parse_as_nats_py_parses_them(stream: bytes, cuts: list[int], tail: bytes) -> None:
    """The same calls, in the same order, however the stream is cut into reads; the same
    error for a bad line."""

    async def both() -> None:
        chunks = _chunks(stream + tail, cuts)
        ours, theirs = _Recorder({1, 12}), _Recorder({1, 12})
        assert isinstance(ours._ps, MessageParser)
        theirs._ps = Parser(theirs)
        assert await _parse(ours._ps, chunks) == await _parse(theirs._ps, chunks)
        assert ours.seen == theirs.seen
        if not tail:
            assert not ours._ps.buf
            assert not theirs._ps.buf

    asyncio.run(both())


async def test_messages_come_as_nats_py_takes_them_off_a_server(nats_url: str, nc: Client) -> None:
    """From a real server, cut into reads as they come: direct and queued subscriptions
    of Interlock's client see what nats-py's own sees (large messages span reads)."""
    fast = await connect(ConnectOptions.resolve(nats_url, name="natsinbound test"))
    plain = Client()
    await plain.connect(nats_url, max_reconnect_attempts=0)
    assert isinstance(fast, NatsClient)
    direct: list[Msg] = []
    queued: list[Msg] = []
    theirs: list[Msg] = []

    async def on_queued(msg: Msg) -> None:
        queued.append(msg)

    async def on_theirs(msg: Msg) -> None:
        theirs.append(msg)

    try:
        await fast.subscribe_direct("inbound.>", direct.append)
        await fast.subscribe("inbound.>", cb=on_queued)
        await plain.subscribe("inbound.>", cb=on_theirs)
        await round_trip(fast)
        await round_trip(plain)
        sent = 0
        for i in range(300):
            size = (0, 1, 100, 70_000)[i % 4]
            headers = None if i % 3 == 0 else {"ce-id": str(i), "Nats-Msg-Id": f" m {i} "}
            reply = f"inbound.reply.{i}" if i % 5 == 0 else ""
            await nc.publish(f"inbound.m.{i}", bytes([i % 256]) * size, reply, headers)
            sent += 1
        await round_trip(nc)
        for _ in range(200):
            await round_trip(fast)
            await round_trip(plain)
            if len(direct) >= sent and len(queued) >= sent and len(theirs) >= sent:
                break
        want = [(m.subject, m.reply, m.data, m.headers) for m in theirs]
        assert len(want) == sent
        assert [(m.subject, m.reply, m.data, m.headers) for m in direct] == want
        assert [(m.subject, m.reply, m.data, m.headers) for m in queued] == want
        # Counted once for each of its two subscriptions.
        assert fast.stats["in_msgs"] == 2 * plain.stats["in_msgs"]
        assert fast.stats["in_bytes"] == 2 * plain.stats["in_bytes"]
    finally:
        await fast.close()
        await plain.close()


async def test_a_bad_message_line_ends_the_read_as_on_nats_py() -> None:
    for parser_of in (MessageParser, Parser):
        client = _Recorder({1})
        parser = parser_of(client)
        with pytest.raises(errors.ProtocolError):
            await parser.parse(b"MSG a 1 1\r\nx\r\nMSG a x 1\r\ny\r\n")
        assert client.seen == [("msg", 1, b"a", b"", b"x", None)]
