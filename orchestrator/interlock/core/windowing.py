"""Debounced and batched triggers' windows and triggers' rates, as the triggers bucket
keeps them: when a window is due, and what start a rate gives. Pure (the runtime's
:mod:`interlock.runtime.windows` and :mod:`interlock.runtime.rates` keep them)."""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.core.rfc3339 import format_time, parse_time

if TYPE_CHECKING:  # the listings read windows without the compiler's modules
    from interlock.core.definition import TriggerDef
    from interlock.core.incoming import Incoming


class EventCopy(msgspec.Struct, kw_only=True, frozen=True):
    """A window's copy of an event (the fields of an ``Incoming``)."""

    type: str
    source: str
    id: str
    data: Any = None
    time: str | None = None
    subject: str | None = None
    extensions: dict[str, str] = {}


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
    last_size: int = 0
    """Bytes of ``last`` and ``last_inputs``."""
    last: EventCopy | None = None
    """Its last event: the run's trigger event."""
    last_inputs: dict[str, Any] = {}
    """The inputs a debounce's trigger's ``input`` renders from its last event (none
    without one: its inputs are then the last event's data, kept once, in ``last``)."""
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


# --- rates ------------------------------------------------------------------------


MAX_WAITS = 64
"""Waiting runs' start and arrival kept per trigger and key (:attr:`RateEntry.waits`)."""


class RateEntry(msgspec.Struct, kw_only=True):
    """A trigger's key's recent and coming starts, as the triggers bucket keeps them."""

    trigger: str
    key: str
    limit: int
    per_s: float
    starts: list[int] = []
    """Start times given (ms since the epoch), ascending; the last ``limit``."""
    waits: list[list[int]] = []
    """``[start, given at]`` (ms since the epoch) of the runs given a start to come and
    still waiting at the last write, ascending: at most :data:`MAX_WAITS`, thinned past it
    by dropping the one whose going leaves the shortest gap between arrivals (the first
    and the last kept), so the first waiting run's wait is known exactly up to that many
    and from below, within one gap, past it."""

    def waited_since(self, now_ms: int) -> int | None:
        """When the run first in line now was given its start (ms since the epoch): None
        when none waits (or the entry predates ``waits``)."""
        return next((given for start, given in self.waits if start > now_ms), None)

    def line(self, now_ms: int) -> tuple[int, int | None]:
        """The runs waiting their turn now (:meth:`queued`) and when the first of them was
        given its start (:meth:`waited_since`; None when none waits): what a listing of
        queues and the metrics show of the rate."""
        queued = self.queued(now_ms)
        return queued, self.waited_since(now_ms) if queued else None

    def waiting(self, start_ms: int, now_ms: int) -> None:
        """Note a start given now: the waits kept are those still to come, and this one if
        it is to come (see :attr:`waits`)."""
        waits = [w for w in self.waits if w[0] > now_ms]
        if start_ms > now_ms:
            waits.append([start_ms, now_ms])
        while len(waits) > MAX_WAITS:  # the one whose going leaves the shortest gap
            i = min(range(1, len(waits) - 1), key=lambda i: waits[i + 1][1] - waits[i - 1][1])
            del waits[i]
        self.waits = waits

    def running(self, now_ms: int) -> int:
        """Starts given in the ``per`` up to now.

        Of the ``limit`` kept, each one still to come stands for one of the same place
        ``per`` earlier (a run that waited was given the start ``limit`` places before it,
        plus ``per``), so it counts too."""
        since = now_ms - self.per_s * 1000
        return sum(1 for at in self.starts if at > since)

    def queued(self, now_ms: int) -> int:
        """Starts given that are still to come: each kept one to come, and those it stands
        for every ``per`` before it that are still to come (see :meth:`running`)."""
        per = self.per_s * 1000
        return sum(math.ceil((at - now_ms) / per) for at in self.starts if at > now_ms)


decode_rate = msgspec.json.Decoder(RateEntry).decode


def rate_token(trigger: str, key: str) -> str:
    first = hashlib.sha256(trigger.encode()).hexdigest()[:16]
    second = hashlib.sha256(f"{trigger}\0{key}".encode()).hexdigest()[:32]
    return f"r.{first}.{second}"


def next_start(entry: RateEntry, now_ms: int) -> int:
    """The start time the next event is given (see the module)."""
    at = max(now_ms, entry.starts[-1]) if entry.starts else now_ms
    if len(entry.starts) >= entry.limit:
        at = max(at, entry.starts[-entry.limit] + math.ceil(entry.per_s * 1000))
    return at


# --- an event into its window --------------------------------------------------------

DUPLICATE = "duplicate"
"""The event is in the window already (or in one whose run has started)."""
CUT = "cut"
"""The open batch was closed (``size``) before the event: it goes into the next one."""
OPENED = "opened"
"""The event opened a window."""
JOINED = "joined"
"""The event joined the open window."""
TOO_LARGE = "too-large-for-window"
"""The event alone takes more than a window may (:func:`window_budget`): refused."""


class Arrival(msgspec.Struct, kw_only=True, frozen=True):
    """An event for a trigger's key's window, with what its trigger made of it."""

    version: int
    """The workflow version its trigger is of (a window's run starts with the first's)."""
    event: EventCopy
    ref: str
    """Its reference (:func:`event_ref`)."""
    inputs: dict[str, Any]
    """What its trigger renders from it."""
    item: Any
    """What it adds to a batch's inputs."""
    item_size: int
    last_size: int = 0
    """Bytes of the event's copy, and of its inputs for a debounce (what ``last`` and
    ``last_inputs`` take while it is the window's last)."""


REF_BYTES = 23
"""Bytes a reference takes in an entry (20 hex digits, its quotes and a comma)."""
ENTRY_OVERHEAD = 2048
"""Bytes of an entry beyond its windows' contents, its key and its references: field
names, counts, times, the run id, and the write's headers."""


def id_bytes(event_id: str) -> int:
    """Most bytes an id takes in an entry (a quote or backslash is escaped: 2 bytes)."""
    return 2 * len(event_id.encode()) + 3


def window_bytes(window: Window) -> int:
    """The most a window takes in its entry (its fixed fields in ``ENTRY_OVERHEAD``)."""
    ids = sum(id_bytes(i) for i in window.ids)
    return ids + REF_BYTES * len(window.refs) + window.size + window.last_size


def window_budget(entry: WindowEntry, max_payload: int) -> int:
    """The bytes each of an entry's two windows (open and sealed) may take, so that the
    entry, with its references kept, is never more than the server takes in a message."""
    fixed = ENTRY_OVERHEAD + len(encode(entry.trigger)) + len(encode(entry.key))
    return (max_payload - fixed - REF_BYTES * MAX_REFS) // 2


def take_into(
    entry: WindowEntry,
    arrival: Arrival,
    *,
    kind: str,
    max_events: int,
    room: int,
    now: str,
    budget: int | None = None,
) -> str:
    """Put ``arrival`` into ``entry``'s open window (changed in place), and say how
    (:data:`DUPLICATE`, :data:`CUT`, :data:`OPENED`, :data:`JOINED`, :data:`TOO_LARGE`).
    A batch that the event fills is moved to ``sealed`` with it. ``room``: the bytes a
    batch's items may take; ``budget``: the bytes a window may take
    (:func:`window_budget`; None: the entry's own for the default 1 MiB payload limit)."""
    if entry.has(arrival.ref):
        return DUPLICATE
    limit = window_budget(entry, 1024 * 1024) if budget is None else budget
    adds = id_bytes(arrival.event.id) + REF_BYTES + arrival.item_size + arrival.last_size
    if adds > limit or (kind == "batch" and arrival.item_size > room):
        return TOO_LARGE  # it could not be taken even into a window of its own
    window = entry.open
    if window is not None and (
        (kind == "batch" and window.size + arrival.item_size > room)
        or window_bytes(window) - window.last_size + adds > limit
    ):
        # Its run's inputs, or the entry, could not take this one too: cut here.
        window.closed_by = "size"
        entry.sealed, entry.open = window, None
        return CUT
    opened = window is None
    if window is None:
        run_id = window_run_id(entry.trigger, entry.key, arrival.ref)
        window = Window(run_id=run_id, version=arrival.version, opened_at=now, last_at=now)
        entry.open = window
    window.last_at = now
    window.count += 1
    window.ids.append(arrival.event.id)
    window.refs.append(arrival.ref)
    del window.refs[:-MAX_REFS]
    if kind == "batch":
        window.items.append(arrival.item)
        window.size += arrival.item_size
    else:
        del window.ids[:-MAX_LISTED]
        window.last_inputs = arrival.inputs
    window.last = arrival.event
    window.last_size = arrival.last_size
    if kind == "batch" and window.count >= max_events:
        window.closed_by = "max_events"
        entry.sealed, entry.open = window, None
    return OPENED if opened else JOINED
