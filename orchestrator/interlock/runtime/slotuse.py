"""Recent use of a limit's slots by each fairness key: what fair share ranks keys by.

Fair share over recent use, as batch schedulers share a cluster (Slurm's decayed usage)
and as a scheduler places a task that wakes after sleeping: a fairness key that was given
few slots lately goes before one that was given many. Each entry counts its admissions
(``SlotEntry.admitted``: every slot taken, whether free at once, handed on from a line, or
given as a run ended) and keeps per fairness key a decayed count of them
(``SlotEntry.used``, :class:`Use`): each admission of the entry multiplies every key's
count by ``d`` and adds one to the key admitted. Decayed per admission, not per second:
no clock is read, and replicas deciding from the same entry decide the same. Stored
lazily: a key's count is written with the admission count it was written at, and read as
``value * d ** (n - at)``.

``d = 1 - 1 / W``, W = :data:`WINDOW` times the limit's size (:func:`window`): a key
admitted at every admission approaches W (the sum of ``d ** k``), a key that stopped loses
half of its count in about ``0.69 W`` admissions. So against a key that kept the slots
busy, a key with no recent use is given every slot that frees until its count and slots
held reach the first key's: the first key waits at most ``W ln 2 + 1`` admissions (about
``W / 2`` at a window of four limits, as its slots go too). Keys that both keep a backlog
converge to shares in proportion to their weights.

Bounded: only keys counting at least :data:`FLOOR` are kept, at most :data:`MAX_KEYS`
(the largest); a key not kept counts 0. Fairness keys are any text a run's start names,
so the entry, written at every change, must not grow with them.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

WINDOW = 4
"""The window of recent use, in admissions per slot of the limit (W = this times its size).
Longer: a key that floods is remembered longer (a few runs of another key go first
longer, and the flood waits longer behind a second one); shorter: the first key is
forgotten sooner. See docs/performance.md for the measurements this was chosen by."""
FLOOR = 0.5
"""A key counting less is forgotten (counts 0)."""
MAX_KEYS = 32
"""The most keys whose use an entry keeps (the largest)."""


class Use(msgspec.Struct, array_like=True):
    """One fairness key's decayed count of admissions, as of admission ``at``."""

    fair: str
    value: float
    at: int


def window(size: int, weights: Iterable[int]) -> float:
    """W: :data:`WINDOW` times the limit's size, times the heaviest of the ``weights``
    waiting over the lightest (a key's count must be able to stand for a share as small
    as the lightest key's: a window shorter than the weights' ratio gives the heavier key
    too little)."""
    found = [max(weight, 1) for weight in weights] or [1]
    return WINDOW * max(size, 1) * max(found) / min(found)


def used(uses: list[Use], admitted: int, w: float) -> dict[str, float]:
    """Each kept key's count after ``admitted`` admissions (absent keys count 0)."""
    return {use.fair: _now(use, admitted, w) for use in uses}


def count(uses: list[Use], admitted: int, w: float, fair: str) -> list[Use]:
    """The counts once admission ``admitted`` (the last) is ``fair``'s: every other key's
    count decays by it, as read, and the keys below :data:`FLOOR` (and past
    :data:`MAX_KEYS`) are forgotten. Only the key admitted is written again: the others
    keep the count and admission they were written at."""
    kept: list[tuple[float, Use]] = []
    mine = Use(fair, 1.0, admitted)
    for use in uses:
        now = _now(use, admitted, w)
        if use.fair == fair:
            mine = Use(fair, round(now + 1.0, 3), admitted)
        elif now >= FLOOR:
            kept.append((now, use))
    kept.append((mine.value, mine))
    if len(kept) > MAX_KEYS:
        kept = sorted(kept, key=lambda found: found[0], reverse=True)[:MAX_KEYS]
    return [use for _, use in kept]


def _now(use: Use, admitted: int, w: float) -> float:
    """``use``'s count after ``admitted`` admissions: decayed by ``1 - 1/w`` for each since
    the one it was written at."""
    return use.value * (1.0 - 1.0 / w) ** (admitted - use.at)
