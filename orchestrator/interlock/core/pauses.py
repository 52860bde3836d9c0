"""The slot a run of a paused workflow waits for (see :mod:`interlock.runtime.pausing`)."""

from __future__ import annotations

from interlock.core import events as ev

PAUSED = "@paused"
MAX_REASON = 1024
"""The longest reason a pause takes (it is kept with the pause, recorded in each run it
holds, and shown by every listing of pauses)."""
"""The end of the name of the slot a run started while its workflow is paused waits for:
``<namespace>/<workflow>@paused``, of size 0 (nobody holds it; resuming empties its line)."""


def check_reason(reason: str) -> str:
    """A pause's reason as given; raises TypeError for one that is not text, ValueError
    for one past :data:`MAX_REASON` characters (what the CLI and the HTTP API refuse)."""
    if not isinstance(reason, str):
        raise TypeError(f"a reason is text, not {type(reason).__name__}")
    if len(reason) > MAX_REASON:
        raise ValueError(
            f"a reason is at most {MAX_REASON:,} characters; this one is {len(reason):,}"
        )
    return reason


def pause_claim(namespace: str, workflow: str) -> ev.SlotClaim:
    """The slot a run of a paused workflow waits for until the workflow is resumed."""
    return ev.SlotClaim(limit=f"{namespace}/{workflow}{PAUSED}", key="paused", size=0)


def is_pause(claim: ev.SlotClaim) -> bool:
    return claim.limit.endswith(PAUSED)


def capability_pause_claim(capability: str) -> ev.SlotClaim:
    """The line a request of a paused capability waits in until it is resumed."""
    return ev.SlotClaim(limit=f"cap:{capability}{PAUSED}", key="paused", size=0)


def waiting_for(limit: str, key: str) -> str:
    """What a held request waits for, as a person reads it (from its ``action.queued``)."""
    if limit.endswith(PAUSED):
        return f"waits until capability {limit[4:].removesuffix(PAUSED)} is resumed"
    what = "a token" if limit.endswith(":rate") else "a slot"
    return f"waits for {what} of {limit}" + (f" for key {key!r}" if key else "")


def slot_text(claim: ev.SlotClaim) -> str:
    """What a queued run waits for (from its ``run.queued``): ``for a slot of default/api
    for key 'acme'``, or ``until default/hello is resumed``."""
    if claim.limit.endswith(PAUSED):
        return f"until {claim.limit.removesuffix(PAUSED)} is resumed"
    return f"for a slot of {claim.limit} for key {claim.key!r}"


def admitted_text(limits: list[str]) -> str:
    """What a ``run.admitted`` took, as a person reads it: ``holds a slot of
    default/api``, or for a workflow's pause (no slot: nobody holds one) ``default/hello
    resumed``."""
    resumed = [
        f"{limit.removesuffix(PAUSED)} resumed" for limit in limits if limit.endswith(PAUSED)
    ]
    slots = [limit for limit in limits if not limit.endswith(PAUSED)]
    return "; ".join(resumed + ([f"holds a slot of {', '.join(slots)}"] if slots else []))


def stopping_text(freed: list[ev.FreedSlots]) -> str:
    """What a record that cancelled attempts once dispatched says of the slots they keep
    while their workers stop (``freed.stopping_until``): ``; the slot of cap:llm for key
    'acme' stays held until its worker stops, 2026-05-01T09:12:33Z at the latest``; ``""``
    when it keeps none."""
    said: list[str] = []
    for slots in freed:
        if slots.stopping_until is None:
            continue
        held = [c for c in slots.limits if not c.per_s and not is_pause(c)]
        which = ", ".join(f"{c.limit} for key {c.key!r}" for c in held) or "its limits"
        said.append(
            f"the slot of {which} ({slots.action_id}, attempt {slots.attempt}) stays held "
            f"until its worker stops, {slots.stopping_until} at the latest"
        )
    return "".join(f"; {text}" for text in said)
