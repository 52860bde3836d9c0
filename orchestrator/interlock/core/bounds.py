"""The bounds on what comes from outside, one definition each, shared by every part that
takes it in: the gateway (HTTP), the client (``start``, ``emit``) and the orchestrator's
ingress check the same numbers, so what one accepts the others accept, and what one
refuses is refused before anything is published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

MAX_DEPTH: Final = 64
"""Deepest nesting of objects and arrays accepted in a value from outside: an event (its
data, or the whole structured-mode object), a run's inputs (the inputs object counts as
one level), a manifest. Deeper is refused before anything recursive (CEL, the log's
encoder, the readers of a log) sees it."""

EVENT_SHARE: Final = 4
"""An external event may take at most 1/``EVENT_SHARE`` of the server's payload limit: it
is copied into the logs of the runs it reaches, beside the records it causes."""


MAX_EVENT_ID_BYTES: Final = 256
"""Longest CloudEvent ``id`` taken, in UTF-8 bytes (the specification sets no bound): an
id is kept in the windows of debounced and batched triggers (up to 1,000 of them in a
batch's) and in the records of the runs they start, which the server's payload limit
bounds. Longer is refused as any invalid event is (reason ``id-too-long``)."""


def max_event_bytes(max_payload: int) -> int:
    """The largest event payload taken, for a server whose payload limit is ``max_payload``."""
    return max_payload // EVENT_SHARE


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (walked level by level, no recursion)."""
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            if type(node) is dict or type(node) is list:
                below += [c for c in children if type(c) is list or type(c) is dict]
        level = below
    return False


def too_deep_inputs(given: Mapping[str, Any]) -> list[str]:
    """A problem per input of a run that nests beyond ``MAX_DEPTH`` (the inputs object
    counted as one level)."""
    return [
        f"input {name!r} nests deeper than {MAX_DEPTH} levels (the inputs object is one)"
        for name, value in given.items()
        if too_deep(value, MAX_DEPTH - 1)
    ]
