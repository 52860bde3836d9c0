"""What limits a capability's requests (and a run's slots): the lines a request waits in
(``SlotClaim``, shared with runs' concurrency limits), its wait and admission, and what the
record that ends it frees."""

from __future__ import annotations

import msgspec

from .base import PREFIX, Record


class SlotClaim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A slot a run must hold before its first state: one of the ``size`` slots of the
    concurrency limit ``limit`` for ``key``."""

    limit: str
    """The limit's name: ``<namespace>/<scope>``, or ``<namespace>/<workflow>#<n>`` for a
    limit of one workflow (its n-th, from 1)."""
    key: str
    size: int
    on_limit: str = "queue"
    """What a run does when no slot is free: ``queue``, ``skip`` or ``cancel-oldest``."""
    priority: int = 0
    """The run's ``spec.priority``: in line, higher goes first (then the earlier queued)."""
    fair: str = ""
    """The run's value of the limit's ``fair`` expression: the values share the slots."""
    weight: int = 1
    """The run's value of the limit's ``weight`` expression: its fairness key's share of
    the slots against the others' (1 without one)."""
    per_s: float = 0.0
    """A capability's rate limit: ``size`` requests per this many seconds (0: a
    concurrency limit)."""
    burst: int = 0
    """A rate limit's burst: requests that may go at once after a quiet spell."""
    max_waiting: int = 0
    """A capability's limit: the most requests that may wait in its line for ``key``, as
    its ``max_waiting`` declares (0: as many as a line holds); one more is turned away,
    its attempt failed."""


class FreedSlots(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a record that ends an action's attempt frees: its place (held or waiting) in
    each of its capability's lines."""

    action_id: str
    attempt: int
    limits: list[SlotClaim]
    rate_held_until: str | None = None
    """On a failure whose agent gave a retry-after (an API's 429): no token of the rates
    in ``limits``, for their keys, is given to anyone before this instant (RFC 3339)."""
    stopping_until: str | None = None
    """On a record that cancels an attempt already dispatched: its slots of the
    concurrency limits in ``limits`` stay held while its worker stops, until the worker
    answers the attempt (its handler has ended) or this instant at the latest (RFC 3339).
    Its places in rates' and pauses' lines are left at once."""


class ActionQueuedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The request waits, undispatched: for a slot or a token of ``limit`` for ``key``
    (``place``: its place in that line then), or for its paused capability's resumption."""

    action_id: str
    attempt: int
    capability: str
    limit: str
    key: str = ""
    place: int = 0
    timeout_s: float | None = None
    """The attempt's timeout, which runs from its admission."""


class ActionAdmittedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The request holds a slot and a token of each of its capability's limits: it is
    dispatched now, its deadline counted from here."""

    action_id: str
    attempt: int
    deadline: str | None = None
    at_once: bool = False
    """Admitted with its request, in the same append: its slots and tokens were free and
    taken before the append (it never waited, and holds no token in a rate's line). Logs
    written since say so on the request itself (``action.requested``'s ``admitted_at``)
    and have no ``action.admitted`` for it; older ones keep folding as they did."""


class ActionQueued(Record, tag=PREFIX + "action.queued", frozen=True):
    data: ActionQueuedData


class ActionAdmitted(Record, tag=PREFIX + "action.admitted", frozen=True):
    data: ActionAdmittedData
