"""Whether a slots entry has room for one more holder: a free slot of its limit, and room
in the entry for the holder's bytes.

Every holder of a limit and key is kept in its entry (:mod:`slotlines`), and the entry is
written whole at every change, in one message: a holder takes its run id, its fairness key
and its time (72 bytes for a triggered run's id and no fairness key, 329 with a fairness key
of 256 characters). A limit may declare up to 100,000 slots and a fairness key is what a
publisher wrote, so the holders alone outgrew the server's payload limit (1 MiB) at some
14,500 holders, or 3,200 with long fairness keys; past it no change of the entry could be
written, admissions, ends and lines alike. So holders take at most :data:`HOLDERS_BYTES`:
a run that would take more waits in line, as at a full limit, until a holder leaves. What
else the entry keeps is bounded apart (the waiters kept inline, recent use, and the
lines' outlines: :func:`crowded`), all of it within the payload limit.
"""

from __future__ import annotations

from interlock.core import events as ev
from interlock.core.limitdef import CAPABILITY_LIMIT
from interlock.core.pauses import is_pause
from interlock.runtime.slotlines import Lines, SlotEntry, Waiter, encode

HOLDERS_BYTES = 256 * 1024
"""The most the holders of one limit and key take in its entry (encoded)."""
_LARGEST = 2 * 1024
"""More than any one holder takes (a run id of 128 characters, a fairness key of 256
escaped six times over, its time and numbers): below ``HOLDERS_BYTES / _LARGEST`` holders,
no count of bytes is needed."""


def room(entry: SlotEntry, waiter: Waiter) -> bool:
    """Whether ``waiter`` may hold a slot of ``entry`` now: fewer holders than its limit,
    and its bytes fit beside theirs."""
    if len(entry.holders) >= waiter.size:
        return False
    if (len(entry.holders) + 1) * _LARGEST <= HOLDERS_BYTES:
        return True
    return len(encode(entry.holders)) + len(encode(waiter)) + 1 <= HOLDERS_BYTES


MAX_SEGMENTS = 2500
"""The most segments the lines of one limit and key outline (some 105 bytes each in the
entry, 200 waiters each at most): some 250,000 to 500,000 runs waiting, as full as the
segments are. Unbounded, the outline alone outgrew the server's payload limit past some
750,000 runs waiting, and the limit stopped."""


MAX_WAITING = 250_000
"""The most requests that wait in a capability limit's line for one key when the limit
declares no ``max_waiting`` (the most it may declare)."""


def crowded(entry: SlotEntry, claim: ev.SlotClaim) -> bool:
    """Whether a run or a request may not join the lines of ``entry``: they outline
    :data:`MAX_SEGMENTS` already, or (a capability's limit) hold as many requests as the
    limit's ``max_waiting``, :data:`MAX_WAITING` without one. A run turned away ends as
    ``on_limit: skip`` makes it, a request's attempt fails (``capacity_line_full``).
    A pause's line is never full: it holds what an operator paused."""
    if is_pause(claim):
        return False
    if claim.limit.startswith(CAPABILITY_LIMIT) and entry.queued >= (
        claim.max_waiting or MAX_WAITING
    ):
        return True
    return sum(len(line.segments) for line in entry.lines) >= MAX_SEGMENTS


def free_now(entry: SlotEntry, waiter: Waiter) -> bool:
    """Whether ``waiter`` may take a slot of ``entry`` before any log asks for it: nobody
    waits in its lines and it has :func:`room`."""
    return not entry.lines and not entry.waiting and room(entry, waiter)


async def wait_in_line(lines: Lines, waiter: Waiter, claim: ev.SlotClaim) -> int | None:
    """``waiter`` put in its line of ``lines`` before any log asks for it: its place; None
    when the lines are :func:`crowded` or hold it already (nothing written)."""
    if crowded(lines.entry, claim) or await lines.find(waiter) is not None:
        return None
    lines.entry.size = claim.size
    return await lines.insert(waiter)
