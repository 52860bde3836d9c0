"""Progress acks: what keeps a long task's message from being redelivered while its
handler runs.

JetStream redelivers a message not acknowledged within the consumer's ``ack_wait``. A
worker sends each task message it is handling a progress ack (``+WPI``) every
``interval`` seconds (a third of ``ack_wait``) until it is settled. Most tasks are settled
long before their first one is due, so the messages of one consumer share one timer: a
task costs an entry in an ordered dict, not a timer handle of its own.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging

from nats.aio.msg import Msg

log = logging.getLogger("interlock.sdk")


class ProgressAcks:
    """Progress acks, every ``interval`` seconds, for the task messages of one consumer
    from :meth:`add` until :meth:`discard`."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        # By the id of the message (a Msg is not hashable), in the order they are due:
        # every entry waits the same interval, so one added or acked goes last.
        self._due: collections.OrderedDict[int, tuple[Msg, float]] = collections.OrderedDict()
        self._sending: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def add(self, msg: Msg) -> None:
        """Send ``msg`` a progress ack every interval from now on."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self._interval
        self._due[id(msg)] = (msg, due)
        if self._timer is None:
            self._timer = loop.call_at(due, self._tick)

    def discard(self, msg: Msg) -> None:
        """No more progress acks for ``msg`` (one being sent is given up)."""
        key = id(msg)
        if self._due.pop(key, None) is not None:
            sending = self._sending.pop(key, None)
            if sending is not None:
                sending.cancel()

    def close(self) -> None:
        """Stop: no more progress acks for any message."""
        for msg, _due in list(self._due.values()):
            self.discard(msg)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._timer = None
        due = self._due
        while due:
            key = next(iter(due))
            msg, at = due[key]
            if at > now:
                break
            due[key] = (msg, now + self._interval)
            due.move_to_end(key)
            if key not in self._sending:  # the last one is still on its way: skip this one
                sending = self._sending[key] = asyncio.ensure_future(_send(msg))
                sending.add_done_callback(functools.partial(self._sent, key))
        if due:
            self._timer = loop.call_at(due[next(iter(due))][1], self._tick)

    def _sent(self, key: int, task: asyncio.Task[None]) -> None:
        if self._sending.get(key) is task:
            del self._sending[key]


async def _send(msg: Msg) -> None:
    try:
        await msg.in_progress()
    except Exception:
        log.debug("progress ack failed", exc_info=True)
