"""The dead-letter calls of :class:`~interlock.client.Client`: list, show, redrive and
discard the messages that could not be handled."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from nats.js.errors import NotFoundError

from interlock.client import reading

if TYPE_CHECKING:
    from interlock.runtime.client import InterlockClient
    from interlock.views import DeadLetterView


class DeadLetterCalls:
    """What :class:`~interlock.client.Client` does with dead letters."""

    _ops: InterlockClient

    async def dead_letters(self, reason: str | None = None) -> list[DeadLetterView]:
        """The dead letters kept, oldest first (all, or of one ``reason``)."""
        return await reading.dead_letters(self._ops, reason)

    async def dead_letter(self, seq: int) -> DeadLetterView:
        """One dead letter. Raises :class:`UnknownDeadLetter`."""
        return reading.letter_view(await self._ops.dead_letter(seq), self._ops.subjects)

    async def redrive(self, seq: int) -> int:
        """Publish a dead letter again where it came from, then drop it; returns the new
        message's stream sequence. Raises :class:`UnknownDeadLetter`, or
        :class:`NotRedrivable` for a letter that kept only the start of its message."""
        _, stored = await self._ops.redrive(seq)
        return stored

    async def discard(self, seq: int) -> DeadLetterView:
        """Drop one dead letter without publishing it; returns what it was. Raises
        :class:`UnknownDeadLetter`."""
        letter = await self._ops.discard(seq)
        return reading.letter_view(letter, self._ops.subjects)

    async def discard_dead_letters(
        self, *, reason: str | None = None, before: datetime | None = None
    ) -> list[DeadLetterView]:
        """Drop the dead letters of ``reason`` and/or kept before ``before`` (at least one
        of the two); returns those dropped, oldest first. A letter dropped meanwhile by
        someone else is left out.

        Raises:
            ValueError: neither ``reason`` nor ``before`` is given.
        """
        if reason is None and before is None:
            raise ValueError("discard dead letters of a reason, or kept before a time (or both)")
        if before is not None and before.tzinfo is None:
            before = before.replace(tzinfo=UTC)
        dropped = []
        for letter in await self.dead_letters(reason):
            if before is not None and not _kept_before(letter.time, before):
                continue
            try:
                dropped.append(await self.discard(letter.seq))
            except (NotFoundError, LookupError):
                continue
        return dropped


def _kept_before(time: str, before: datetime) -> bool:
    try:
        at = datetime.fromisoformat(time.replace("Z", "+00:00"))
    except ValueError:
        return False
    return (at if at.tzinfo else at.replace(tzinfo=UTC)) < before
