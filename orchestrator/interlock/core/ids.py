"""Run ids: what one may be, checked wherever an id enters (the CLI, the client, events'
``runid`` extension, timer messages) before it becomes part of a NATS subject.

A run id is one subject token: letters, digits, ``_`` and ``-``, at most 128 characters.
That keeps ``bad.id.>``, ``*`` and ``>`` (which would address many runs at once, or a
wildcard subject) from ever naming a run.
"""

from __future__ import annotations

import re
from typing import Final

from interlock.core.vocabulary import InterlockError

RUN_ID_MAX: Final = 128
RUN_ID_RULE: Final = f"letters, digits, '_' and '-', 1 to {RUN_ID_MAX} characters"
_RUN_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{RUN_ID_MAX}}}")


class InvalidRunId(ValueError, InterlockError):
    """A run id that breaks :data:`RUN_ID_RULE`."""

    def __init__(self, value: object) -> None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:80])
        super().__init__(f"invalid run id {shown}: a run id is {RUN_ID_RULE}")


def is_run_id(value: object) -> bool:
    return isinstance(value, str) and _RUN_ID.fullmatch(value) is not None


def check_run_id(value: object) -> str:
    """``value`` when it is a valid run id; raises :class:`InvalidRunId` otherwise."""
    if not is_run_id(value):
        raise InvalidRunId(value)
    assert isinstance(value, str)
    return value


EVENT_TYPE_MAX: Final = 255
EVENT_TYPE_RULE: Final = (
    f"dot-separated words of letters, digits, '_' and '-', at most {EVENT_TYPE_MAX} characters"
)
_EVENT_TYPE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")


class InvalidEventType(ValueError, InterlockError):
    """An event type that cannot be a subject's tail (``il.events.<type>``)."""

    def __init__(self, value: object) -> None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:80])
        super().__init__(f"invalid event type {shown}: an event type is {EVENT_TYPE_RULE}")


def check_event_type(value: object) -> str:
    """``value`` when it can be published as ``<prefix>.events.<value>``."""
    if (
        not isinstance(value, str)
        or len(value) > EVENT_TYPE_MAX
        or _EVENT_TYPE.fullmatch(value) is None
    ):
        raise InvalidEventType(value)
    return value


_TOKEN_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def capability_token(capability: str) -> str:
    """``capability`` as one subject token (dots and other unsafe characters as ``_``): its
    task consumer's name, its heartbeat keys and the permissions on them are made of it.
    Not one-to-one (``a.b`` and ``a_b`` share a token), so the compiler refuses two
    capabilities that share one."""
    return _TOKEN_UNSAFE.sub("_", capability)


def token_taken(owners: dict[str, str], capability: str) -> str | None:
    """Claim ``capability``'s token in ``owners`` (token: the first capability that
    claimed it); the other capability that holds it already, if any."""
    owner = owners.setdefault(capability_token(capability), capability)
    return None if owner == capability else owner
