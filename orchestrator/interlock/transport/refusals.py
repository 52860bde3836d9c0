"""Permission violations the server reports, turned into an error where they happen.

A NATS server refuses a publish or a subscription the credential does not allow with an
asynchronous ``-ERR``: the request that caused it is never answered, and its caller would
wait for its timeout and then fail with a bare timeout. On Interlock's client
(:class:`interlock.transport.natsclient.NatsClient`) each refusal is noted here, and
:func:`refusable` ends the work it guards with :class:`PermissionRefused`, naming what was
refused, as soon as the server says so. Guards nest: a refusal goes to the innermost one
still waiting (a command's guard around the whole command, and inside it a step that can
do without what it was refused, such as ``emit`` working out what the event starts).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import Any, TypeVar

from interlock.core.vocabulary import InterlockError
from interlock.transport.cancelling import cancel_and_wait

T = TypeVar("T")

_KEPT = 64
"""Server errors kept as sent until nats-py reports them (it does so at once)."""

_VIOLATION = re.compile(
    r"permissions violation for (?P<op>publish|subscription) to \"?(?P<subject>[^\"\s']+)",
    re.IGNORECASE,
)


class PermissionRefused(InterlockError):
    """The server refused a publish or a subscription this credential does not allow.

    Attributes:
        operation: ``publish`` or ``subscribe``.
        subject: the subject it was refused on.
    """

    def __init__(self, operation: str, subject: str) -> None:
        self.operation = operation
        self.subject = subject
        super().__init__(f"permission denied: this credential may not {operation} to {subject}")


def parse_refusal(message: str) -> PermissionRefused | None:
    """The refusal a server's error message reports, or None when it reports none."""
    found = _VIOLATION.search(message)
    if found is None:
        return None
    op = "publish" if found["op"].lower() == "publish" else "subscribe"
    return PermissionRefused(op, found["subject"])


class Refusals:
    """The refusals of one connection, handed to the guards waiting on it."""

    def __init__(self) -> None:
        self._guards: list[asyncio.Future[PermissionRefused]] = []
        self._sent: dict[str, str] = {}

    def as_sent(self, message: str) -> None:
        """A server error as the server sent it (nats-py reports it lower-cased, and
        subjects have a case): :meth:`seen` reports this one for it."""
        if len(self._sent) < _KEPT:
            self._sent[message.lower()] = message

    def seen(self, message: str) -> PermissionRefused | None:
        """Note a server error: a refusal goes to the innermost guard still waiting."""
        refusal = parse_refusal(self._sent.pop(message.strip("'"), message))
        if refusal is None:
            return None
        for guard in reversed(self._guards):
            if not guard.done():
                guard.set_result(refusal)
                break
        return refusal

    async def guard(self, work: Awaitable[T]) -> T:
        """``await work``, ended with :class:`PermissionRefused` at the first refusal
        of the connection meanwhile."""
        refused: asyncio.Future[PermissionRefused] = asyncio.get_running_loop().create_future()
        self._guards.append(refused)
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        try:
            either: set[asyncio.Future[Any]] = {task, refused}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            await cancel_and_wait(task)
            raise refused.result()
        finally:
            self._guards.remove(refused)
            if not task.done():
                await cancel_and_wait(task)


async def refusable(nc: Any, work: Awaitable[T]) -> T:
    """``await work`` on the connection ``nc``, ended with :class:`PermissionRefused` as
    soon as the server refuses one of its publishes or subscriptions (on a client that
    notes refusals; on another, ``work`` runs to its own end)."""
    refusals = getattr(nc, "refusals", None)
    if not isinstance(refusals, Refusals):
        return await work
    return await refusals.guard(work)
