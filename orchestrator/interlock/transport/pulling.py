"""Pulling from a durable consumer with a pull request kept open, never more messages
than there are free slots.

nats-py's ``fetch`` hands messages over only when a whole batch call returns, drops what
it had collected when cancelled (those messages then wait out ``ack_wait``), and costs a
task, a timer and a uuid per message. :class:`PullConsumer` keeps one pull request open
per consumer, sized to the slots it reserved from a pool, and hands every message over the
moment it arrives. Agent workers take messages one by one into handler slots; the
orchestrator's loops read them in batches through :class:`BatchReader`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.transport.natsclient import direct_subscriber
from interlock.transport.natsinbound import status_of
from interlock.transport.slots import SlotPool

log = logging.getLogger("interlock.pulling")

DRAIN_TIMEOUT = 2.0
"""Seconds a pull subscription gets to hand back what is on its way when it stops."""

_STATUS = "Status"
_DESCRIPTION = "Description"
_HEARTBEAT = "100"
_REQUEST_TIMEOUT = "408"
# Answers meaning the consumer is not there (anymore): make sure it exists again.
_LOST = frozenset({"404", "503"})


class PullConsumer:
    """One durable pull consumer: keeps a pull request open for the slots it reserved.

    Each message delivered holds one slot of the pool; ``deliver`` takes it over and must
    release the slot when the message is settled.
    """

    def __init__(
        self,
        nc: Client,
        *,
        api_prefix: str,
        stream: str,
        consumer: str,
        filter_subject: str,
        pool: SlotPool,
        deliver: Callable[[Msg], None],
        ensure: Callable[[], Awaitable[None]],
        expires: float = 5.0,
    ) -> None:
        self._nc = nc
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._consumer = consumer
        self._filter_subject = filter_subject
        self._ours = subject_matcher(filter_subject)
        # The server says "still waiting" this often; silence means the request is gone
        # (consumer deleted under it, server restarted, reconnect).
        self._heartbeat = max(expires / 4, 0.05)
        self._last_heard = 0.0
        self._pool = pool
        self._deliver = deliver
        self._ensure = ensure
        self._expires = expires
        self._inbox = nc.new_inbox()
        self._sub: Any = None
        self._naks: set[asyncio.Future[None]] = set()
        self._seq = 0
        self._current = 0  # id of the open pull request, 0 when none
        self._remaining = 0  # slots reserved for it and not yet filled
        self._loose = 0  # slots it asked for whose reservation was given back
        self._delivered = 0
        self._closed = asyncio.Event()
        self._status: str | None = None
        self._busy = False
        self._lost = False
        self._draining = False

    async def start(self) -> None:
        subject = f"{self._inbox}.*"
        direct = direct_subscriber(self._nc)
        if direct is not None:
            # Handed over from the connection's read loop: no subscription queue and no
            # task switch between a delivery and its handler.
            self._sub = await direct(subject, self._on_msg)
        else:
            self._sub = await self._nc.subscribe(subject, cb=self._on_msg_async)
        self._pool.add_reclaimer(self._reclaim_idle)

    def _reclaim_idle(self, also_busy: bool) -> bool:
        """Give back the slots of an open pull request nothing has come for, when another
        consumer of the pool has work (if this one had work before it, only when
        ``also_busy``). The request stays open, unreserved, until it expires: a message it
        still brings takes a slot if it can get one, else goes back (nak) to be pulled
        again once this consumer has a slot. One request at a time either way, so giving
        back never piles requests up on the server."""
        if not self._current or not self._remaining or self._delivered or self._draining:
            return False
        if self._busy and not also_busy:
            return False
        self._pool.release(self._remaining)
        self._loose, self._remaining = self._remaining, 0
        return True

    async def run(self) -> None:
        """Pull until cancelled."""
        backoff = 0.1
        while True:
            if self._lost:
                await self._ensure()
                self._lost = False
            if self._busy:
                # It has had work and may have more: wait for slots, reclaiming idle ones.
                got, loose = await self._pool.acquire(self._pool.size, urgent=True), 0
            else:
                # An idle consumer reserves one slot, so the others of the worker keep the
                # rest. With none free (more capabilities than slots) it pulls for one
                # message unreserved: one that comes takes a slot then (a free one, or
                # one reclaimed from an idle request), so no capability waits for another
                # consumer's request to expire before it is asked for.
                got = self._pool.take(1)
                loose = 0 if got else 1
            self._seq += 1
            self._current, self._remaining, self._delivered = self._seq, got, 0
            self._loose = loose
            self._status = None
            self._closed.clear()
            request = {
                "batch": got + loose,
                "expires": int(self._expires * 1e9),
                "idle_heartbeat": int(self._heartbeat * 1e9),
            }
            try:
                await self._nc.publish(
                    self._next_subject,
                    json.dumps(request).encode(),
                    reply=f"{self._inbox}.{self._seq}",
                )
                await self._wait_closed()
            except asyncio.CancelledError:
                self._close(None)
                raise
            # Publish failed: connection closed or reconnecting.
            except Exception as exc:  # noqa: BLE001
                log.warning("pull request on %s failed: %s", self._consumer, exc)
                self._close(None)
                self._status = "error"
            if self._status in (None, _REQUEST_TIMEOUT):
                backoff = 0.1
            else:
                # Throttle answers that will repeat (consumer gone, too many waiting pulls).
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _wait_closed(self) -> None:
        """Wait for the open request to end; give it up after two missed heartbeats."""
        loop = asyncio.get_running_loop()
        self._last_heard = loop.time()
        # asyncio.wait, not wait_for: on Python 3.11, wait_for can swallow a cancellation
        # that comes as the awaited event is set, and the pull loop would never stop.
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            while not self._closed.is_set():
                silence = loop.time() - self._last_heard
                if silence > 2 * self._heartbeat + 0.5:
                    log.info("pull on %s went unanswered; checking the consumer", self._consumer)
                    self._close(None)
                    self._lost = True  # make sure the consumer is still ours before pulling again
                    return
                await asyncio.wait([closed], timeout=2 * self._heartbeat + 0.5 - silence)
        finally:
            closed.cancel()

    async def drain(self) -> None:
        """Stop pulling: remove interest so the server drops our pull request, and hand
        back (nak) whatever was already on its way, so another worker gets it at once."""
        self._draining = True
        self._close(None)
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                # Bounded: the subscription's own task may be gone already (the loop
                # shutting down), and then draining would wait for it forever.
                await asyncio.wait_for(sub.drain(), DRAIN_TIMEOUT)
            except Exception:  # connection already closed: unacked messages are redelivered
                log.debug("draining the pull subscription failed", exc_info=True)
                # Closing: a connection already gone leaves nothing to undo.
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        if self._naks:  # the hand-backs of what came while draining
            await asyncio.wait(set(self._naks), timeout=DRAIN_TIMEOUT)

    def _close(self, status: str | None) -> None:
        if self._current:
            self._pool.release(self._remaining)
            if status == _REQUEST_TIMEOUT and self._delivered == 0:
                self._busy = False
            self._current, self._remaining, self._loose = 0, 0, 0
        self._status = status
        self._closed.set()

    async def _on_msg_async(self, msg: Msg) -> None:
        self._on_msg(msg)

    def _hand_back(self, msg: Msg) -> None:
        """Nak ``msg`` (in a task of its own: deliveries are handled in the read loop)."""
        task = asyncio.ensure_future(_nak(msg))
        self._naks.add(task)
        task.add_done_callback(self._naks.discard)

    def _on_msg(self, msg: Msg) -> None:
        self._last_heard = asyncio.get_running_loop().time()
        # A delivery's header block is left unparsed (a status has its own line).
        status = status_of(msg)
        if status:
            self._on_status(msg, status)
            return
        if not self._ours(msg.subject):
            # Not one of ours: the consumer was replaced by one with another filter.
            log.error("pull on %s delivered a message on %s", self._consumer, msg.subject)
            self._lost = True
            self._close(None)
            self._hand_back(msg)
            return
        if self._current and self._remaining > 0:
            self._remaining -= 1
            self._delivered += 1
            self._busy = True
            if self._remaining == 0 and not self._loose:  # filled: the server says nothing
                self._close(None)
            holds_slot = True
        elif self._current and self._loose > 0:
            # For a request with no slot reserved (given back, or none was free): take a
            # free one or one an idle request holds; else hand the message back.
            self._loose -= 1
            self._delivered += 1
            self._busy = True
            if self._loose == 0 and self._remaining == 0:
                self._close(None)
            holds_slot = self._pool.acquire_now()
        else:
            # A late delivery for a request given up locally: take a slot only if one is free.
            holds_slot = self._pool.try_acquire()
        if self._draining or not holds_slot:
            if holds_slot:
                self._pool.release()
            self._hand_back(msg)
            return
        self._deliver(msg)

    def _on_status(self, msg: Msg, status: str) -> None:
        if status == _HEARTBEAT:
            return
        request_id = msg.subject.rsplit(".", 1)[-1]
        if request_id != str(self._current):
            return  # about a request already closed
        if status != _REQUEST_TIMEOUT:
            description = msg.headers.get(_DESCRIPTION, "") if msg.headers else ""
            log.info("pull on %s answered %s %s", self._consumer, status, description)
            if status in _LOST or "deleted" in description.lower():
                self._lost = True
        self._close(status)


async def _nak(msg: Msg) -> None:
    try:
        await msg.nak()
    except Exception:
        log.debug("nak failed; the message is redelivered after ack_wait", exc_info=True)


def stream_sequence(msg: Msg) -> int:
    """The stream sequence of a JetStream message, from its reply subject (0: unknown)."""
    reply = msg.reply
    if not reply or not reply.startswith("$JS.ACK."):
        return 0
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[5])
    if len(tokens) >= 11:  # with <domain>.<account hash> after ACK, and a trailing token
        return int(tokens[7])
    return 0


def deliveries(msg: Msg) -> int:
    """How many times JetStream has delivered ``msg`` (1 the first time).

    Read from the reply subject's delivery count, without nats-py's full metadata parse
    (which builds a datetime per message): this is asked of every message handled.
    """
    reply = msg.reply
    if not reply or not reply.startswith("$JS.ACK."):
        return 1
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[4])
    if len(tokens) >= 11:  # with <domain>.<account hash> after ACK, and a trailing token
        return int(tokens[6])
    return 1


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS subject filter ``pattern`` (``*`` and ``>``)."""
    if pattern == subject:
        return True
    want, got = pattern.split("."), subject.split(".")
    for i, part in enumerate(want):
        if part == ">":
            return len(got) > i
        if i >= len(got) or part not in ("*", got[i]):
            return False
    return len(want) == len(got)


def subject_matcher(pattern: str) -> Callable[[str], bool]:
    """``subject_matches`` with ``pattern`` looked at once: a literal subject or a
    ``<literal prefix>.>`` (what the orchestrator's consumers filter on) is a string
    comparison."""
    head, dot, last = pattern.rpartition(".")
    if "*" not in pattern and ">" not in pattern:
        return pattern.__eq__
    if dot and last == ">" and "*" not in head and ">" not in head:
        prefix = head + "."
        return lambda subject: subject.startswith(prefix)
    return lambda subject: subject_matches(pattern, subject)


class BatchReader:
    """A durable pull consumer read in batches, with a pull request always open.

    Messages land in a buffer as they arrive; each batch is what arrived since the last
    one (at most ``size``). A batch holds its slots until the loop body that got it is
    done, so at most ``size`` messages are ever buffered or being handled, and the open
    request asks for exactly the slots that are free.
    """

    def __init__(
        self,
        nc: Client,
        *,
        stream: str,
        consumer: str,
        filter_subject: str,
        size: int,
        ensure: Callable[[], Awaitable[None]],
        api_prefix: str = "$JS.API",
        expires: float = 5.0,
    ) -> None:
        self._pool = SlotPool(size)
        self._buffer: collections.deque[Msg] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        """What the batches loop waits on while the buffer is empty: a message, the
        stop, or the end of the pull loop resolves it."""
        self._cleanups: set[asyncio.Future[None]] = set()
        self._consumer = PullConsumer(
            nc,
            api_prefix=api_prefix,
            stream=stream,
            consumer=consumer,
            filter_subject=filter_subject,
            pool=self._pool,
            deliver=self._take,
            ensure=ensure,
            expires=expires,
        )

    def _take(self, msg: Msg) -> None:
        self._buffer.append(msg)
        self._wake()

    def _wake(self, _: object = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def batches(self, stopping: asyncio.Event) -> AsyncGenerator[list[Msg], None]:
        """Batches until ``stopping`` is set; then the pull is drained (what was on its way
        is handed back at once)."""
        await self._consumer.start()
        pulling = asyncio.create_task(self._consumer.run())
        pulling.add_done_callback(self._wake)
        stop = asyncio.create_task(stopping.wait())
        stop.add_done_callback(self._wake)
        loop = asyncio.get_running_loop()
        try:
            while not stopping.is_set():
                if not self._buffer:
                    # One future per wait, resolved by whichever comes first: no task and
                    # no asyncio.wait over three awaitables for each batch.
                    self._waiter = waiter = loop.create_future()
                    try:
                        await waiter
                    finally:
                        self._waiter = None
                    if pulling.done():
                        pulling.result()  # raises what ended it
                        raise RuntimeError("the pull loop ended")
                    continue
                msgs = list(self._buffer)
                self._buffer.clear()
                try:
                    yield msgs
                finally:
                    self._pool.release(len(msgs))
        finally:
            stop.cancel()
            pulling.cancel()
            # The hand-back runs as its own task: a second cancellation of this one (a
            # loop shutting down cancels every task) ends it at once, and the hand-back,
            # bounded by DRAIN_TIMEOUT, still finishes.
            cleanup = asyncio.ensure_future(self._stop_pulling(pulling))
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            await asyncio.shield(cleanup)

    async def _stop_pulling(self, pulling: asyncio.Task[None]) -> None:
        """Hand back (nak) what arrived after the last batch, then drain the pull."""
        held, self._buffer = list(self._buffer), collections.deque()
        for msg in held:
            await _nak(msg)
        await asyncio.wait([pulling], timeout=DRAIN_TIMEOUT)
        await self._consumer.drain()
        for msg in self._buffer:  # arrived meanwhile
            await _nak(msg)
        self._buffer.clear()
