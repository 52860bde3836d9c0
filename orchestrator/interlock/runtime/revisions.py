"""How far the registry's watchers have followed each KV bucket, and the check that
nothing was stored after that (``sync``): what the ingress asks for each fetched batch of
trigger events, so that an event published after ``interlock apply`` returned is routed
to the workflow applied.

The check is one ``STREAM.MSG.GET`` of the first message stored after the watchers'
revision, answered by the stream's leader (a direct get may be answered by a replica or
a mirror that has not stored the newest write yet). Its usual answer is a short "no
message found"; only when something is newer does it wait for the watchers. A message
removed after it was stored (a purge, an expiry) is not found, and the watchers would
never see it either: a KV delete or purge writes a marker, which is found.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from interlock.transport.jetstream import JetStream, api_prefix, api_timeout, connection

log = logging.getLogger("interlock.registry")

_NO_MESSAGE = 10037
"""The JetStream API's error code for "no message found" (a 404, as is "stream not found")."""


class _Stored(msgspec.Struct):
    seq: int = 0


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0


class _MsgGetAnswer(msgspec.Struct):
    """The part of a ``STREAM.MSG.GET`` answer the check reads (the message's data,
    base64, is skipped unread)."""

    message: _Stored | None = None
    error: _ApiError | None = None


_decode_msg_get = msgspec.json.Decoder(_MsgGetAnswer).decode


def nothing_stored(answer: Msg) -> bool:
    """Whether the answer to a ``STREAM.MSG.GET`` request says that no message is stored
    at or after the sequence asked for. False for anything else: a message, another
    error (no such stream, say), no stream answering (a status without a body)."""
    if not answer.data:
        return False
    try:
        decoded = _decode_msg_get(answer.data)
    except msgspec.DecodeError:
        return False
    error = decoded.error
    return decoded.message is None and error is not None and error.err_code == _NO_MESSAGE


class Revisions:
    """The highest revision (stream sequence) of each bucket that the watchers have taken
    into account, and the check that nothing newer is stored."""

    def __init__(self, js: JetStreamContext, load: Callable[[], Awaitable[None]]) -> None:
        """``load``: reads every bucket (when the watchers do not catch up in time)."""
        self._js = js
        self._load = load
        self._revisions: dict[str, int] = {}
        self._changed = asyncio.Condition()

    async def seen(self, bucket: str, revision: int) -> None:
        """The watcher of ``bucket`` has taken everything up to ``revision`` into account."""
        async with self._changed:
            if revision > self._revisions.get(bucket, 0):
                self._revisions[bucket] = revision
                self._changed.notify_all()

    async def sync(self, bucket: str, timeout: float) -> None:  # noqa: ASYNC109
        """Make sure everything stored in ``bucket`` before this call has been taken into
        account: one request asks for a message stored after the watcher's revision; when
        there is one, this waits until the watcher has seen the bucket's last revision,
        and if it does not get there in ``timeout``, the buckets are read."""
        subject, body = self._newer(bucket)
        if isinstance(self._js, JetStream):
            answer = await self._js.request_ack(subject, body)
        else:
            answer = await connection(self._js).request(
                subject, body, timeout=api_timeout(self._js)
            )
        if not nothing_stored(answer):
            await self._catch_up(bucket, timeout)

    def sync_soon(self, bucket: str, timeout: float) -> asyncio.Future[None]:
        """:meth:`sync`, its request sent in this call (one publish through the shared
        reply subscription) and its answer read in a callback, with no task. The future
        is done once everything stored before this call has been taken into account, or
        fails as ``sync`` would; cancelling it ends the wait for the watcher too."""
        answer = None
        if isinstance(self._js, JetStream):
            answer = self._js.request_ack_soon(*self._newer(bucket))
        if answer is None:  # not connected, or no shared reply subscription yet
            return asyncio.ensure_future(self.sync(bucket, timeout))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(partial(self._answered, bucket, timeout, done))
        return done

    def _answered(
        self, bucket: str, timeout: float, done: asyncio.Future[None], answer: asyncio.Future[Msg]
    ) -> None:
        """The answer to :meth:`sync_soon`'s request: done, or the watcher waited for."""
        if done.done():  # cancelled meanwhile
            return
        if answer.cancelled():
            done.cancel()
            return
        error = answer.exception()
        if error is not None:
            done.set_exception(error)
            return
        if nothing_stored(answer.result()):
            done.set_result(None)
            return
        catching_up = asyncio.ensure_future(self._catch_up(bucket, timeout))
        catching_up.add_done_callback(partial(_settle, done))
        done.add_done_callback(partial(_cancel_unless_done, catching_up))

    def _newer(self, bucket: str) -> tuple[str, bytes]:
        """The request for the first message of ``bucket`` stored after the revision its
        watcher has taken into account."""
        prefix = api_prefix(self._js)
        after = self._revisions.get(bucket, 0)
        body = b'{"seq":%d,"next_by_subj":"$KV.%s.>"}' % (after + 1, bucket.encode())
        return f"{prefix}.STREAM.MSG.GET.KV_{bucket}", body

    async def _catch_up(self, bucket: str, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until the watcher of ``bucket`` has seen its last revision (one stream-info
        request); read the buckets if it does not get there in ``timeout``."""
        info = await self._js.stream_info(f"KV_{bucket}")
        target = info.state.last_seq
        if self._revisions.get(bucket, 0) >= target:
            return
        try:
            async with self._changed:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._revisions.get(bucket, 0) >= target),
                    timeout,
                )
        except TimeoutError:
            log.warning("registry watcher behind on %s; reading the bucket", bucket)
            await self._load()
            await self.seen(bucket, target)


def _settle(done: asyncio.Future[None], task: asyncio.Future[None]) -> None:
    """Hand what ``task`` ended with to ``done`` (unless ``done`` is settled already)."""
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(None)


def _cancel_unless_done(task: asyncio.Future[None], _: asyncio.Future[None]) -> None:
    if not task.done():
        task.cancel()
