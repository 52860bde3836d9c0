"""The slot a run of a paused workflow waits for (see :mod:`interlock.runtime.pausing`)."""

from __future__ import annotations

from interlock.core import events as ev

PAUSED = "@paused"
"""The end of the name of the slot a run started while its workflow is paused waits for:
``<namespace>/<workflow>@paused``, of size 0 (nobody holds it; resuming empties its line)."""


def pause_claim(namespace: str, workflow: str) -> ev.SlotClaim:
    """The slot a run of a paused workflow waits for until the workflow is resumed."""
    return ev.SlotClaim(limit=f"{namespace}/{workflow}{PAUSED}", key="paused", size=0)


def is_pause(claim: ev.SlotClaim) -> bool:
    return claim.limit.endswith(PAUSED)
