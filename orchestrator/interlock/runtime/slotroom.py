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
else the entry keeps is bounded apart (the lines' outlines, the waiters kept inline, recent
use), all of it within the payload limit.
"""

from __future__ import annotations

from interlock.runtime.slotlines import SlotEntry, Waiter, encode

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
