"""What :class:`~interlock.client.Client` reads of the queues (:mod:`queues`)."""

from __future__ import annotations

from interlock.client import queues
from interlock.runtime.client import InterlockClient
from interlock.views.queueshape import QueueView


class QueueCalls:
    """The limits and keys held or waited for, whole or a page at a time."""

    _ops: InterlockClient

    async def queues(
        self, workflow: str | None = None, *, capability: str | None = None
    ) -> list[QueueView]:
        """Limits and keys held or waited for, what is paused (see :mod:`queues`)."""
        return await queues.list_queues(self._ops, workflow, capability)

    async def queue_page(
        self,
        workflow: str | None = None,
        *,
        capability: str | None = None,
        limit: int = 500,
        after: str | None = None,
    ) -> tuple[list[QueueView], str | None]:
        """:meth:`queues` a page at a time, in limit then key order: the first ``limit``
        lines after the page token ``after`` (None: from the first), and the token of the
        next page (None: this is the last). Raises ValueError for a token that is none, or
        a ``limit`` under 1."""
        cursor = None if after is None else queues.read_page_token(after)
        if after is not None and cursor is None:
            raise ValueError(f"{after[:64]!r} is not a page token (the next page's, as given)")
        if limit < 1:
            raise ValueError(f"limit must be 1 or more, got {limit}")
        page, more = await queues.queue_page(
            self._ops, workflow, capability, limit=limit, after=cursor
        )
        return page, None if more is None else queues.page_token(more)
