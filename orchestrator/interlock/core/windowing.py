"""Debounced and batched triggers' windows, as the triggers bucket keeps them, and when
one is due. Pure (the runtime's :mod:`interlock.runtime.windows` keeps and closes them)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import msgspec

from interlock.core.definition import TriggerDef
from interlock.core.incoming import Incoming
from interlock.core.rfc3339 import format_time, parse_time

WINDOW_TIMER = ":window:"
"""Part of the id of a window's timer: ``<run id>:window:<entry>:<fire time, ms>``."""
MAX_LISTED = 100
"""Event ids a debounce's run records (its last ones); a batch records all of its."""
MAX_REFS = 1_000
"""References of a window's events kept to refuse one delivered twice (a debounce's last)."""


class Window(msgspec.Struct, kw_only=True):
    """One window of events of a trigger and key."""

    run_id: str
    """The run it starts (derived from the trigger, the key and its first event)."""
    version: int
    """The workflow version its run starts with (the first event's)."""
    opened_at: str
    last_at: str
    count: int = 0
    ids: list[str] = []
    """CloudEvent ids, in order (a debounce's last ``MAX_LISTED``)."""
    refs: list[str] = []
    """References (source and id) of its events, to refuse one taken twice."""
    items: list[Any] = []
    """A batch's run input items, in order (a debounce keeps none)."""
    size: int = 0
    """Bytes of ``items``."""
    last: Incoming | None = None
    """Its last event: the run's trigger event."""
    last_inputs: dict[str, Any] = {}
    """The inputs a debounce's trigger renders from its last event."""
    closed_by: str = ""


class WindowEntry(msgspec.Struct, kw_only=True):
    """A trigger's windows for one key, as the triggers bucket keeps them."""

    trigger: str
    key: str
    kind: str
    open: Window | None = None
    sealed: Window | None = None
    taken: list[str] = []
    """References of the events of windows whose runs have started (the last ones)."""

    def has(self, ref: str) -> bool:
        return any(ref in w.refs for w in (self.open, self.sealed) if w is not None) or (
            ref in self.taken
        )


encode = msgspec.json.Encoder().encode
decode_entry = msgspec.json.Decoder(WindowEntry).decode


def entry_token(trigger: str, key: str) -> str:
    """The bucket key of a trigger's key (hashed: keys are any text)."""
    first = hashlib.sha256(trigger.encode()).hexdigest()[:16]
    second = hashlib.sha256(f"{trigger}\0{key}".encode()).hexdigest()[:32]
    return f"w.{first}.{second}"


def event_ref(event: Incoming) -> str:
    return hashlib.sha256(f"{event.source}\0{event.id}".encode()).hexdigest()[:20]


def window_run_id(trigger: str, key: str, first_ref: str) -> str:
    """The run a window starts: its trigger, key and first event name it."""
    text = f"{trigger}\0{key}\0{first_ref}"
    return "w" + hashlib.sha256(text.encode()).hexdigest()[:24]


def is_window_timer(timer_id: str) -> bool:
    return WINDOW_TIMER in timer_id


def _plus(time: str, seconds: float) -> str:
    return format_time(parse_time(time) + timedelta(seconds=seconds))


def before(a: str, b: str) -> bool:
    """Whether time ``a`` is before time ``b`` (RFC 3339)."""
    return parse_time(a) < parse_time(b)


def due_at(entry_kind: str, window: Window, trigger: TriggerDef) -> tuple[str, str]:
    """When ``window`` closes if no event comes before, and what closes it then."""
    spec = trigger.window
    assert spec is not None
    if entry_kind == "batch":
        assert spec.max_wait_s is not None
        return _plus(window.opened_at, spec.max_wait_s), "max_wait"
    due = _plus(window.last_at, spec.period_s)
    if spec.max_wait_s is not None:
        latest = _plus(window.opened_at, spec.max_wait_s)
        if not before(due, latest):
            return latest, "max_wait"
    return due, "period"
