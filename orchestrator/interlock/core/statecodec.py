"""The canonical bytes of a run's state (what the replay guarantee compares)."""

from __future__ import annotations

import msgspec

__all__ = ["encode_state"]

_state_encoder = msgspec.json.Encoder()

_LATER_FIELDS = (
    "dag",
    "evidence",
    "cost",
    "spent",
    "spawn",
    "slots",
    "paused",
    "history",
    "chain",
    "enters",
    "waits",
)
"""Fields added to RunState after states were first pinned (tests/golden): left out of
the canonical bytes while unset, so a run that does not use them encodes as before."""
_UNPINNED = ("size",)
"""Fields measured again by every fold and never pinned: ``size`` (the records' bytes as
this version encodes them, which a new optional field would change for the same run)."""


def encode_state(state: msgspec.Struct) -> bytes:
    """Canonical bytes of a state (a ``RunState``: the replay guarantee compares these)."""
    unset = [name for name in _LATER_FIELDS if getattr(state, name) is None]
    fields = msgspec.structs.asdict(state)
    for name in [*unset, *_UNPINNED]:
        del fields[name]
    return _state_encoder.encode(fields)
