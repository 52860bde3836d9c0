"""Why a kxm webhook run refuses a checkpoint, as its log records it (``set.refused`` of
the transition back to the stage): a refusal costs no attempt, and its reason says what was
short."""

from __future__ import annotations

import json

from interlock.dialects.kxm_check import Policy

NO_STATUS = "replies-without-status"
"""The edge budget of the coordinator's replies refused for having no status."""
NO_STATUS_LIMIT = 1000
"""How many such replies a run takes before it fails (half the run's actions)."""


def no_status(stage_id: str) -> str:
    """A reply that is neither a checkpoint with a ``status`` nor a wait."""
    return (
        f"stage {stage_id}: the coordinator's reply has no status (passed, warning or "
        "failed) and is not a wait: refused, the stage asked again"
    )


def short_of_peers(stage_id: str, policy: Policy) -> str:
    """A peer quorum out of reach: the requirement's key and the replies it needs, then (in
    the quorum's failure, ``result.error.message``) how many distinct producers answered."""
    head = (
        f"stage {stage_id}: too few peer replies for {policy.key!r} "
        f"(minProducers {policy.min_producers}): "
    )
    return "{{ " + json.dumps(head) + " + result.error.message }}"
