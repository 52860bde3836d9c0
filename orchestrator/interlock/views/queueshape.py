"""The shape of one line of ``interlock queues`` and ``GET /queues`` (re-exported by
:mod:`interlock.views.shapes`)."""

from __future__ import annotations

import msgspec


class QueueView(msgspec.Struct, frozen=True, kw_only=True):
    """One concurrency limit and key now (``interlock queues``, ``GET /queues``): runs
    holding a slot of the ``size``, runs waiting, and since when the first has waited."""

    limit: str
    key: str
    running: int
    size: int
    queued: int
    oldest_queued_at: str | None = None
    """When the run first in line was queued (None: nobody waits)."""
    oldest_wait_s: float | None = None
    """How long it has waited, in seconds."""
    kind: str = "concurrency"
    """What the line is: ``concurrency`` (slots), ``rate`` (a capability's tokens, or a
    trigger's rate), ``paused`` (what a paused workflow or capability holds),
    ``debounce`` or ``batch`` (a trigger's open window)."""
    capability: str | None = None
    """The capability whose requests wait here (its limits and its pause's line)."""
    paused: bool = False
    """Whether the capability (or, for a workflow's ``@paused`` line, the workflow) is
    paused now: nothing of it goes on until it is resumed."""
    paused_since: str | None = None
    """When it was paused (None: not paused)."""
    paused_reason: str | None = None
    """Why, as the operator who paused it said (None: not paused)."""
    rate_limit: int | None = None
    """A capability's rate: ``rate_limit`` requests per ``per_s`` seconds (``running`` of
    ``size`` is then the tokens not yet back of its ``burst``)."""
    per_s: float | None = None
    next_token_at: str | None = None
    """When the rate's next token is there (None: one is there now)."""
