"""The inbound half of :class:`~interlock.transport.natsclient.NatsClient`: messages
read off the connection and their header blocks.

- **Messages are parsed in one pass each** (:class:`MessageParser`): nats-py's parser
  matches each MSG line against two expressions, copies each message out of a buffer it
  shrinks from the front, and awaits a coroutine per message. Here a message's line and
  payload are taken in one step from the bytes the read returned, and a message of a
  direct subscription goes to its handler in a plain call. Anything else (PING, INFO,
  an error, a line not complete yet) is nats-py's parser's.
- **Header blocks are parsed when read** (:class:`LazyHeadersMsg`): the orchestrator's
  relay takes back run-log messages for their reply subject and data only; a pull
  consumer spots a server status from the block's first line (:func:`status_of`).
- **A header name seen before is not checked again** (:func:`parse_header_lines`): the
  names of a block are looked up as they stand (a few dozen distinct ones in all), where
  each was stripped and searched for whitespace, line by line.

``tests/transport/test_natsinbound.py`` compares each with nats-py's own on random input.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Protocol

import nats.aio.client
from nats import errors
from nats.aio.msg import Msg
from nats.js.api import Header
from nats.protocol.parser import AWAITING_CONTROL_LINE, HMSG_RE, MSG_RE, Parser

from interlock.transport.refusals import Refusals

_SPACE = re.compile(r"\s")
_ASCII_SPACE = " \t\n\r\x0b\x0c"
"""What ``bytes.strip()`` strips."""
_NAMES: dict[str, str] = {}
"""Header names found valid, as they stand before the colon (padding and all), and as
they are read: a name seen before is not stripped and checked again."""
_NAMES_KEPT = 256
_CRLF = b"\r\n"
_MSG = re.compile(MSG_RE.pattern.removeprefix(b"\\A"))
_ERR = re.compile(rb"-ERR\s+'(.+)'\r\n")
_HMSG = re.compile(HMSG_RE.pattern.removeprefix(b"\\A"))
"""nats-py's MSG and HMSG lines, matched where a message begins in a buffer (``\\A``
matches only at its start)."""
_NATS_HDR_LINE_SIZE = len(b"NATS/1.0")
_CRLF_LEN = len(_CRLF)
_STATUS_LEN = 3
EAGER = getattr(nats.aio.client, "parse_email", None) is not None
"""nats-py parses header blocks with fast_mail_parser where installed: direct
subscriptions then take nats-py's own path to their headers."""


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """What ``Client._parse_header_lines`` returns (``Name: Value`` per line; a name
    that is not ASCII or holds whitespace is skipped; values decoded leniently)."""
    out: dict[str, str] = {}
    if raw.isascii():
        names = _NAMES
        # One decode for the block; the same strips as bytes.strip() (ASCII only).
        for text in raw.decode("ascii").split("\r\n"):
            head, colon, tail = text.partition(":")
            if not colon:
                continue
            key = names.get(head)
            if key is None:
                key = head.strip(_ASCII_SPACE)
                if _SPACE.search(key) is not None:
                    continue
                if len(names) < _NAMES_KEPT:
                    names[head] = key
            out[key] = tail.strip(_ASCII_SPACE)
        return out
    for line in raw.split(_CRLF):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _SPACE.search(key) is not None:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


def parse_headers(headers: bytes) -> dict[str, str] | None:
    """What ``Client._process_headers`` makes of a message's header block (with
    nats-py's own line parser swapped for :func:`parse_header_lines`), in
    a plain call: an inline status (``NATS/1.0 404 No Messages``) becomes the
    ``Status`` and ``Description`` headers."""
    if not headers:
        return None
    hdr: dict[str, str] | None = None
    raw_headers = headers[_NATS_HDR_LINE_SIZE:]
    if raw_headers[0] == 0x20:  # " ": an inline status
        line = headers[_NATS_HDR_LINE_SIZE + 1 :]
        status = line[:_STATUS_LEN]
        desc = line[_STATUS_LEN + 1 : len(line) - 2 * _CRLF_LEN]
        stripped_status = status.strip().decode()
        hdr = {}
        if stripped_status.isdigit():
            hdr[Header.STATUS.value] = stripped_status
        i = raw_headers.find(_CRLF)
        raw_headers = raw_headers[i + _CRLF_LEN :]
        if len(desc) > 0:
            i = desc.find(_CRLF)
            if i > 0:
                hdr[Header.DESCRIPTION] = desc[:i].decode()
                hdr.update(parse_header_lines(desc[i + _CRLF_LEN :]))
            else:
                hdr[Header.DESCRIPTION] = desc.decode()
    if not len(raw_headers) > _CRLF_LEN:
        return hdr
    parsed = parse_header_lines(headers[_NATS_HDR_LINE_SIZE + _CRLF_LEN :])
    if hdr:
        hdr.update(parsed)
    else:
        hdr = parsed
    return hdr or None


class _LazyHeaders:
    """``LazyHeadersMsg.headers``: parsed at the first read, then an attribute of the
    message like any other (a non-data descriptor: the instance's own value wins)."""

    def __get__(self, msg: Msg | None, owner: type | None = None) -> dict[str, str] | None:
        if msg is None:
            return None  # the dataclass field's default
        headers = msg.__dict__["headers"] = parse_headers(msg.__dict__["_raw"])
        return headers


class LazyHeadersMsg(Msg):
    """nats-py's ``Msg`` whose header block is parsed when ``headers`` is first read:
    a relay reading back what its own process appended needs only the reply subject
    and the data. Every field reads as on the ``Msg`` nats-py would have built."""

    headers = _LazyHeaders()


def status_of(msg: Msg) -> str | None:
    """The server's status of a pull request (100 heartbeat, 404, 408, 409, ...): the
    ``Status`` nats-py reads off the header block's first line, None for a message
    JetStream delivered (its reply is an ack subject), whose ``Status`` header is its
    publisher's own. A header block with neither an inline status nor a ``Status`` line
    is not parsed."""
    if msg.reply.startswith("$JS.ACK."):
        return None
    if type(msg) is LazyHeadersMsg and "headers" not in msg.__dict__:
        raw: bytes = msg.__dict__["_raw"]
        if raw[_NATS_HDR_LINE_SIZE : _NATS_HDR_LINE_SIZE + 1] != b" " and b"Status" not in raw:
            return None
    headers = msg.headers
    return headers.get(Header.STATUS) if headers else None


class Receiver(Protocol):
    """What :class:`MessageParser` hands messages to (``NatsClient``)."""

    _direct: dict[int, Callable[[Msg], None]]
    msg_class: type[Msg]
    refusals: Refusals
    _error_cb: Callable[[Exception], Awaitable[None]]

    def _deliver(
        self,
        handler: Callable[[Msg], None],
        sid: int,
        subject: bytes,
        reply: bytes,
        data: bytes,
        headers: bytes | None,
    ) -> Exception | None: ...

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None: ...


class MessageParser(Parser):
    """nats-py's protocol parser, with messages (MSG, HMSG) taken in fewer steps: each
    in one pass over a buffer the read gave as is (no copy of what follows it), and
    those of a direct subscription handed to it without a coroutine. Anything else (a
    PING, an INFO, an error, a line not complete yet) goes to nats-py's parser, as does
    a read while that one waits for the rest of a message."""

    nc: Receiver

    def reset(self) -> None:
        super().reset()
        self.wanted = 0
        """The bytes a message whose start is buffered takes in all (0: unknown)."""
        self.resets = getattr(self, "resets", 0) + 1

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        if self.state != AWAITING_CONTROL_LINE:
            await super().parse(data)
            return
        if buf:
            buf.extend(data)
            if len(buf) < self.wanted:
                return
            data = bytes(buf)
            buf.clear()
        self.wanted = 0
        nc = self.nc
        direct = nc._direct
        lazy = not EAGER and nc.msg_class is Msg
        resets = self.resets
        size = len(data)
        pos = 0
        while pos < size:
            m = _MSG.match(data, pos)
            if m is not None:
                subject, sid, _, reply, needed = m.groups()
                header_size = 0
            else:
                m = _HMSG.match(data, pos)
                if m is None:
                    buf.extend(data[pos:] if pos else data)
                    if b"-ERR" in buf:
                        # nats-py lower-cases the error it reports: subjects keep
                        # their case here.
                        for err in _ERR.finditer(buf):
                            nc.refusals.as_sent(err[1].decode("utf-8", "replace"))
                    await super().parse()
                    return
                subject, sid, _, reply, header_bytes, needed = m.groups()
                header_size = int(header_bytes)
            try:
                sid = int(sid)
            except ValueError:
                raise errors.ProtocolError("nats: malformed MSG") from None
            start = m.end()
            end = start + int(needed)
            if end + _CRLF_LEN > size:
                buf.extend(data[pos:] if pos else data)
                self.wanted = end + _CRLF_LEN - pos
                return
            if header_size > 0:
                headers: bytes | None = data[start : start + header_size]
                payload = data[start + header_size : end]
            else:
                headers = None
                payload = data[start:end]
            pos = end + _CRLF_LEN
            if reply is None:
                reply = b""
            handler = direct.get(sid)
            if handler is not None and lazy:
                failed = nc._deliver(handler, sid, subject, reply, payload, headers)
                if failed is not None:
                    await nc._error_cb(failed)
            else:
                await nc._process_msg(sid, subject, reply, payload, headers)
            if self.resets != resets:
                return  # the connection was reset meanwhile: what is left is gone
