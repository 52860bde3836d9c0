"""A JetStream context whose publishes share one reply subscription.

nats-py's ``JetStream.publish`` is a request: every call draws a fresh inbox token from
the operating system's random source, and waits through ``asyncio.wait_for``. In the
orchestrator's hot path (an append, a dispatch, a run index write and a timer per run)
that was a tenth of its CPU. Here every acknowledgement comes back on one wildcard
subscription, each publish is told apart by a counter, and a timeout is one timer
handle. Everything else (consumers, key-value buckets, stream management) is nats-py's
own: a bucket opened through this context writes through the faster ``publish`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import weakref
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from interlock.transport.natsclient import NatsClient, direct_subscriber, js_api

_NO_RESPONDERS = "503"
_PUB_ACK_FIELDS = tuple(f.name for f in dataclasses.fields(api.PubAck))
_TICK = 0.1
"""Seconds: how finely acknowledgement timeouts are kept."""

_contexts: weakref.WeakKeyDictionary[Client, JetStream] = weakref.WeakKeyDictionary()


def jetstream(nc: Client, timeout: float = 5.0) -> JetStream:
    """The connection's shared :class:`JetStream` context (one reply subscription each)."""
    js = _contexts.get(nc)
    if js is None:
        js = _contexts[nc] = JetStream(nc, timeout=timeout, prefix=js_api(nc))
    return js


def connection(js: JetStreamContext) -> Client:
    """The core connection behind a JetStream context (nats-py has no public accessor;
    it is set in its constructor)."""
    return js._nc


def api_prefix(js: JetStreamContext) -> str:
    """The JetStream API prefix a context sends its requests to."""
    return str(getattr(js, "_prefix", api.DEFAULT_PREFIX))


def api_timeout(js: JetStreamContext) -> float:
    """The seconds a context waits for the answer to one of its API requests."""
    return float(js._timeout)


def delivered_elsewhere(
    nc: Client, subject: str, data: bytes, headers: dict[str, str] | None, ack: str
) -> Msg:
    """A JetStream delivery rebuilt on another connection: its stream, sequence and
    deliveries read from ``ack`` (the delivery's reply subject; none if it is not one),
    but no reply of its own, so whoever takes it cannot settle the delivery (nats-py
    has no public way to give a message metadata without its reply)."""
    msg = Msg(_client=nc, subject=subject, data=data, headers=headers)
    if ack:
        with contextlib.suppress(Exception):
            msg._metadata = Msg.Metadata._from_reply(ack)
    return msg


class JetStream(JetStreamContext):
    """``JetStreamContext`` with acknowledgements multiplexed on one subscription."""

    def __init__(
        self, nc: Client, *, timeout: float = 5.0, prefix: str = api.DEFAULT_PREFIX
    ) -> None:
        super().__init__(nc, timeout=timeout, prefix=prefix)
        self._replies: str | None = None
        self._starting: asyncio.Lock | None = None
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._count = 0
        # Deadlines rounded up to a tick share one timer handle: no handle to create and
        # cancel per publish. A publish may so wait up to one tick longer than asked.
        self._expiring: dict[int, list[str]] = {}

    async def request_ack(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: dict[str, str] | None = None,
        ack_wait: float | None = None,
    ) -> Msg:
        """Publish and wait for the server's answer (the raw reply message).

        Raises:
            NoRespondersError: no stream stores ``subject``, or its stream has no
                leader right now (an election).
            nats.errors.TimeoutError: no answer within ``ack_wait`` (default: the
                context's timeout).
        """
        replies = self._replies or await self._start()
        self._count += 1
        token = str(self._count)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        self._expire_at(loop, token, self._timeout if ack_wait is None else ack_wait)
        try:
            nc = self._nc
            reply = replies + token
            # One plain call where it need not wait (publish's coroutines do the same).
            if not (
                isinstance(nc, NatsClient)
                and nc.publish_nowait(subject, payload, reply=reply, headers=headers, now=True)
            ):
                await nc.publish(subject, payload, reply=reply, headers=headers)
            msg = await future
        finally:
            self._waiting.pop(token, None)
        if msg.headers and msg.headers.get(api.Header.STATUS) == _NO_RESPONDERS and not msg.data:
            raise NoRespondersError
        return msg

    def request_ack_soon(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: dict[str, str] | None = None,
        ack_wait: float | None = None,
    ) -> asyncio.Future[Msg] | None:
        """Publish now, in one plain call, and return the future of the server's answer
        (what :meth:`request_ack` awaits); :meth:`acknowledged` reads it. None, with
        nothing sent, where the publish would have to wait (the reply subscription not
        made yet, a client without ``publish_nowait``, not connected, a full buffer):
        the caller awaits :meth:`publish` instead."""
        replies = self._replies
        nc = self._nc
        if replies is None or not isinstance(nc, NatsClient):
            return None
        token = str(self._count + 1)
        if not nc.publish_nowait(
            subject, payload, reply=replies + token, headers=headers, now=True
        ):
            return None
        self._count += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        self._expire_at(loop, token, self._timeout if ack_wait is None else ack_wait)
        return future

    @staticmethod
    def acknowledged(msg: Msg) -> api.PubAck:
        """The acknowledgement in the server's answer to a publish, or the error
        ``publish`` raises for it."""
        if msg.headers and msg.headers.get(api.Header.STATUS) == _NO_RESPONDERS and not msg.data:
            raise NoStreamResponseError
        resp = json.loads(msg.data)
        if "error" in resp:
            raise APIError.from_error(resp["error"])
        # What PubAck.from_response does, without listing the dataclass's fields each time.
        return api.PubAck(**{k: resp[k] for k in _PUB_ACK_FIELDS if k in resp})

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - nats-py's signature
        stream: str | None = None,
        headers: dict[str, Any] | None = None,
        msg_ttl: float | None = None,
    ) -> api.PubAck:
        """What ``JetStreamContext.publish`` does, with the same errors."""
        hdr = headers
        if stream is not None:
            hdr = dict(hdr or {})
            hdr[api.Header.EXPECTED_STREAM] = stream
        if msg_ttl is not None:
            hdr = dict(hdr or {})
            hdr[api.Header.MSG_TTL] = str(int(msg_ttl))
        try:
            msg = await self.request_ack(subject, payload, headers=hdr, ack_wait=timeout)
        except NoRespondersError:
            raise NoStreamResponseError from None
        return self.acknowledged(msg)

    async def _start(self) -> str:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._replies is None:
                prefix = self._nc.new_inbox() + "."
                direct = direct_subscriber(self._nc)
                if direct is not None:
                    await direct(prefix + "*", self._on_reply_now)
                else:
                    await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                self._replies = prefix
        return self._replies

    def _expire_at(self, loop: asyncio.AbstractEventLoop, token: str, wait: float) -> None:
        # Tokens, not futures: an answered publish leaves nothing behind but a short string.
        tick = math.ceil((loop.time() + wait) / _TICK)
        due = self._expiring.get(tick)
        if due is None:
            due = self._expiring[tick] = []
            loop.call_at(tick * _TICK, self._expire, tick)
        due.append(token)

    def _expire(self, tick: int) -> None:
        for token in self._expiring.pop(tick, ()):
            future = self._waiting.pop(token, None)
            if future is not None and not future.done():
                future.set_exception(NatsTimeoutError())

    async def _on_reply(self, msg: Msg) -> None:
        self._on_reply_now(msg)

    def _on_reply_now(self, msg: Msg) -> None:
        assert self._replies is not None
        future = self._waiting.pop(msg.subject[len(self._replies) :], None)
        if future is not None and not future.done():
            future.set_result(msg)
