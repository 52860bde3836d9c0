"""nats-py's client with less work per message on Interlock's hot paths.

Every process connects through :func:`interlock.transport.connection.connect`, which makes
this client. It behaves as nats-py's ``Client`` does, with two differences in cost, not in
result, and one in order:

- **Messages in are parsed with less work** (:mod:`interlock.transport.natsinbound`):
  each message in one pass, a header block parsed when its headers are first read, and
  in two calls when it is plain ``Name: value`` lines (nats-py checks each name for
  whitespace with a generator per character).
- **Direct subscriptions** (:meth:`NatsClient.subscribe_direct`): the handler is a plain
  function called from the read loop with the message, instead of the message going
  through the subscription's queue to a task of its own that awaits a coroutine (nor
  is there a coroutine per message between the parser and the handler). For
  replies that only complete a future (JetStream acknowledgements, pull-consumer
  deliveries handed over to a consumer's own queue) the queue and the task switch were
  most of the work. A handler must be quick and must not block; what it raises is
  reported to the connection's error callback and does not stop the read loop.
- **Publishing without awaiting** (:meth:`NatsClient.publish_nowait`): the command is
  buffered and the flusher woken in one plain call, where ``publish`` is a chain of
  coroutines that never suspends on the hot path anyway. Acks, replies and the
  orchestrator's dispatches go this way; where ``publish`` would wait (not connected,
  the buffer over its limit) it says so and the caller awaits ``publish``.
- **A request goes out at once** (``publish_nowait(..., now=True)``: JetStream publishes
  that await their acknowledgement, answer requests, the registry check). nats-py's
  flusher is a task: a command buffered now reaches the socket in the next turn of the
  event loop, after every callback already due in this one (a batch of another consumer,
  a decision). A request is written straight to the socket instead, with whatever is
  buffered before it (order is kept), when the socket's own buffer is empty (it takes
  the bytes at once) and no request has been written so in this turn of the loop: under
  load the rest of the turn's commands still go out together, one write per turn.
- **``flush()`` comes after every command sent before it.** nats-py writes its PING
  straight to the socket, ahead of what its flusher task has not written yet, so a
  ``flush()`` right after ``subscribe()`` could return before the server had the SUB, or
  had refused it. Here the buffer goes out first (:func:`round_trip` gives the same
  barrier on nats-py's own client).
- **A permission violation ends what caused it** where the caller guards it
  (:mod:`interlock.transport.refusals`), instead of leaving its request to time out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from nats import errors
from nats.aio.client import _HEADER_KEY_RE, _HEADER_VALUE_NEWLINES, Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol.command import hpub_cmd, pub_cmd

from interlock.transport.natsinbound import EAGER, LazyHeadersMsg, MessageParser, parse_header_lines
from interlock.transport.refusals import Refusals

log = logging.getLogger("interlock.nats")

_NAME_CACHE = 256
"""Header names kept encoded (Interlock sends a few dozen distinct ones)."""

DirectHandler = Callable[[Msg], None]


def _spaced(subject: str) -> bool:
    """Whether ``subject`` holds what nats-py's ``_validate_subject`` refuses on the
    publish path (a space, tab, CR or LF: the CRLF would end the command), in four
    substring tests instead of its function call and regular expression search (a
    run's publishes check about 18 subjects in the orchestrator)."""
    return " " in subject or "\t" in subject or "\r" in subject or "\n" in subject


JS_API = "$JS.API"


def js_api(nc: Client) -> str:
    """The JetStream API prefix to use on ``nc``."""
    return nc.js_api if isinstance(nc, NatsClient) else JS_API


class NatsClient(Client):
    """``nats.aio.client.Client`` with a cheaper header parser and direct subscriptions."""

    js_api = JS_API
    """The JetStream API prefix of this connection's account (``<prefix>.js.API`` for an
    agent's own account, where its API subjects are imported; interlock.auth.accounts)."""
    objects_bucket: str | None = None
    """The object bucket of this connection's party (its creds' ``objects:`` tag): where
    it stores the payloads it sends by reference (None: the orchestrator account's)."""

    def __init__(self) -> None:
        self._wrote_through = False
        """A request was written straight to the socket in this turn of the event loop."""
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}
        self._names: dict[str, str] = {}
        self._ps = MessageParser(self)
        self.refusals = Refusals()
        """The server's permission violations (see :mod:`interlock.transport.refusals`)."""
        self.sent: list[tuple[str, bytes]] | None = None
        """When a list, each message this connection publishes (requests too) is added to
        it as (subject, payload): what an operation asks of the server, counted where it
        is sent (tests and benchmarks set it; None, the default, costs one test a
        publish)."""

    async def _process_err(self, err_msg: str) -> None:
        self.refusals.seen(err_msg)
        await super()._process_err(err_msg)

    _parse_header_lines = staticmethod(parse_header_lines)
    """What ``Client._parse_header_lines`` returns, cheaper (nats-py's
    ``_process_headers`` calls it)."""

    def _header_block(self, headers: dict[str, str]) -> bytes:
        """The header block ``Client._send_publish`` builds (same bytes, same
        ``BadHeaderError``), with each name checked once per process and the block
        encoded once (UTF-8 of the whole is the UTF-8 of each piece, joined)."""
        names = self._names
        parts = ["NATS/1.0\r\n"]
        for k, v in headers.items():
            name = names.get(k)
            if name is None:
                key = k.strip()
                if key and not _HEADER_KEY_RE.fullmatch(key):
                    raise errors.BadHeaderError(key)
                name = key + ": " if key else ""
                if len(names) < _NAME_CACHE:
                    names[k] = name
            if name:
                value = v.strip()
                if "\r" in value or "\n" in value:
                    value = value.translate(_HEADER_VALUE_NEWLINES)
                parts += (name, value, "\r\n")
        parts.append("\r\n")
        return "".join(parts).encode()

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """``Client.publish``: the same checks and errors, the connection's status read
        once instead of through three properties."""
        if not self._skip_subject_validation and (
            not subject or _spaced(subject) or (reply and _spaced(reply))
        ):
            raise errors.BadSubjectError
        status = self._status
        if status == Client.CLOSED:
            raise errors.ConnectionClosedError
        if status == Client.DRAINING_PUBS:
            raise errors.ConnectionDrainingError
        payload_size = len(payload)
        if status != Client.CONNECTED and status != Client.DRAINING_SUBS:  # not connected
            limit = self._max_pending_size
            if limit <= 0 or payload_size + self._pending_data_size > limit:
                # Cannot publish during a reconnection when the buffering is disabled,
                # or if pending buffer is already full.
                raise errors.OutboundBufferLimitError
        if payload_size > self._max_payload:
            raise errors.MaxPayloadError
        if self.sent is not None:
            self.sent.append((subject, payload))
        await self._send_publish(subject, reply, payload, payload_size, headers)

    def publish_nowait(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
        *,
        now: bool = False,
    ) -> bool:
        """``publish`` as one plain call: the command is buffered and the flusher woken,
        as ``publish`` does when it need not wait. False, with nothing sent, where it
        would have to wait (not connected, the buffer over its limit, no flusher): the
        caller awaits ``publish`` then. Raises what ``publish`` raises for a bad subject,
        payload or header.

        ``now``: someone waits for the answer to this command; write it, and what is
        buffered before it, to the socket at once where that costs no wait (see
        :meth:`_write_through`)."""
        if self._status != Client.CONNECTED:
            return False
        queue = self._flush_queue
        flusher = self._flusher_task
        if queue is None or flusher is None or flusher.done():
            return False
        if not self._skip_subject_validation and (
            not subject or _spaced(subject) or (reply and _spaced(reply))
        ):
            raise errors.BadSubjectError
        payload_size = len(payload)
        if payload_size > self._max_payload:
            raise errors.MaxPayloadError
        if not subject:
            raise errors.BadSubjectError
        if headers is None:
            command = pub_cmd(subject, reply, payload)
        else:
            command = hpub_cmd(subject, reply, self._header_block(headers), payload)
        size = self._pending_data_size + len(command)
        if self._max_pending_size > 0 and size > self._max_pending_size:
            return False  # publish flushes first, and waits for it
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        if self.sent is not None:
            self.sent.append((subject, payload))
        self._pending.append(command)
        self._pending_data_size = size
        if now and not self._wrote_through and self._write_through():
            return True
        if queue.empty():
            queue.put_nowait(asyncio.get_running_loop().create_future())
        return True

    def _write_through(self) -> bool:
        """Write the buffered commands to the socket now, if its own buffer is empty
        (the kernel takes them at once: nothing to wait for, so the flusher's ``drain``
        has nothing to hold back), at most once per turn of the event loop. False where
        it did not (the flusher writes them)."""
        writer = getattr(self._transport, "_io_writer", None)  # TCP and TLS transports
        if writer is None or writer.transport.get_write_buffer_size():
            return False
        writer.writelines(self._pending)
        self._pending = []
        self._pending_data_size = 0
        self._wrote_through = True
        asyncio.get_running_loop().call_soon(self._next_turn)
        return True

    def _next_turn(self) -> None:
        self._wrote_through = False

    async def _send_publish(
        self,
        subject: str,
        reply: str,
        payload: bytes,
        payload_size: int,
        headers: dict[str, Any] | None,
    ) -> None:
        if headers is None or subject == "":
            await super()._send_publish(subject, reply, payload, payload_size, headers)
            return
        command = hpub_cmd(subject, reply, self._header_block(headers), payload)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += payload_size
        await self._send_command(command)
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        """A PING (``flush``, ``rtt``, the keep-alive) after what is still buffered.

        nats-py writes the PING to the socket at once, ahead of commands its flusher task
        has not written yet: a ``flush()`` right after ``subscribe()`` could then be
        answered before the server had the SUB (and before it refused it). Writing out
        the buffer first makes ``flush()`` a barrier for every command sent before it.
        """
        if self.is_connected and self._pending_data_size > 0 and self._transport is not None:
            self._transport.writelines(self._pending)
            self._pending = []
            self._pending_data_size = 0
        await super()._send_ping(future)

    async def subscribe_direct(
        self, subject: str, handler: DirectHandler, *, queue: str = ""
    ) -> Subscription:
        """Subscribe to ``subject`` (in the queue group ``queue``, if given) with
        ``handler`` called in the read loop for each message (no queue, no task).
        Unsubscribing the returned subscription stops it.

        The handler is in place before the SUB is sent: ``subscribe`` may wait for its
        buffer to be written out (a full outbound buffer), and a message the server sends
        meanwhile would otherwise go to the subscription's own queue, never to the handler.
        """
        sid = self._sid + 1  # the one subscribe() takes (it numbers before any await)
        self._direct[sid] = handler
        try:
            sub = await self.subscribe(subject, queue=queue)
        except BaseException:
            self._direct.pop(sid, None)
            raise
        return sub

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._direct.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
            return
        if EAGER or self.msg_class is not Msg:
            self.stats["in_msgs"] += 1
            self.stats["in_bytes"] += len(data)
            hdr = await self._process_headers(headers) if headers else None
            msg = self._build_message(sid, subject, reply, data, hdr)
            failed = self._handle(handler, msg)
        else:
            failed = self._deliver(handler, sid, subject, reply, data, headers)
        if failed is not None:
            await self._error_cb(failed)

    def _deliver(
        self,
        handler: DirectHandler,
        sid: int,
        subject: bytes,
        reply: bytes,
        data: bytes,
        headers: bytes | None,
    ) -> Exception | None:
        """A message of a direct subscription to its handler, in one plain call: its
        header block is parsed when first read (:class:`LazyHeadersMsg`). Returns what the
        handler raised, for the caller to report."""
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        if headers:
            msg: Msg = object.__new__(LazyHeadersMsg)
            msg.__dict__ = {
                "_client": self,
                "subject": subject.decode(),
                "reply": reply.decode(),
                "data": data,
                "_raw": headers,
                "_sid": sid,
            }
        else:
            msg = Msg(self, subject.decode(), reply.decode(), data, None, None, False, sid)
        return self._handle(handler, msg)

    @staticmethod
    def _handle(handler: DirectHandler, msg: Msg) -> Exception | None:
        try:
            handler(msg)
        except Exception as exc:
            log.exception("handling a message on %s failed", msg.subject)
            return exc
        return None


async def round_trip(nc: Client) -> None:
    """Until the server has had every command sent on ``nc`` so far, and has said what it
    refused of them (a subscription not allowed, say: its error arrives before this
    returns). On Interlock's client one ``flush`` is that; on nats-py's own, whose PING
    may overtake what its buffer still holds, the first flush writes the buffer out and a
    second one follows it."""
    if not isinstance(nc, NatsClient):
        await nc.flush()
    await nc.flush()


def ack_nowait(msg: Msg) -> bool:
    """``msg.ack()`` as one plain call where the connection offers it (Interlock's client,
    connected): False, with nothing sent, where the caller must await ``msg.ack()``."""
    client = msg._client
    if not msg.reply or msg._ackd or not isinstance(client, NatsClient):
        return False
    if not client.publish_nowait(msg.reply):
        return False
    msg._ackd = True
    return True


def direct_subscriber(nc: Any) -> Callable[..., Any] | None:
    """``nc.subscribe_direct`` where ``nc`` offers it (a client made by Interlock's
    ``connect``), else None: the caller subscribes with a callback as usual."""
    method = getattr(nc, "subscribe_direct", None)
    return method if callable(method) else None
