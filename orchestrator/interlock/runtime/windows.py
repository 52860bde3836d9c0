"""Debounced and batched triggers: the events of one key gathered into a window that
starts one run.

The triggers bucket keeps, per trigger and key, the window open now (its events: a
batch's every one, a debounce's last, with the ids of all) and, while its run is being
started, the window closed before it (``sealed``). Every change is a compare-and-set on
that one entry, so two orchestrator replicas never both take an event or both close a
window; a stale read costs a retry.

- An event is acknowledged only once it is in the entry (an orchestrator killed before
  gets it again, and an event already there, by source and id, is not taken twice).
- A window closes when its durable timer (the TIMERS stream's message scheduling, as for
  any timer) finds it due: a debounce ``period`` after its last event or ``max_wait``
  after its first; a batch ``max_wait`` after its first, or at once on its
  ``max_events``-th event. The timer is scheduled when the window opens; one that finds
  the window not yet due is scheduled again for when it will be.
- Closing moves the window to ``sealed`` (events that come meanwhile open the next one),
  starts its run, then clears it. The run's id is derived from the trigger, the key and
  the window's first event, so a close done again after a crash (the timer comes again,
  or the orchestrator that starts next finds the sealed window) is refused as a run that
  exists already: no window starts two runs, and none is lost.
- Once a window's run has started, the entry keeps the events' references for
  ``TAKEN_KEPT_S`` (the message's TTL) so that an event delivered again after its window
  closed (its orchestrator died between taking it and acknowledging it) is not taken
  into a second window.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import APIError, KeyNotFoundError

from interlock.core import events as ev
from interlock.core.definition import Definition, TriggerDef
from interlock.core.incoming import Incoming, trigger_inputs
from interlock.core.rfc3339 import parse_time
from interlock.core.windowing import (
    CUT,
    DUPLICATE,
    MAX_REFS,
    OPENED,
    TOO_LARGE,
    WINDOW_TIMER,
    Arrival,
    EventCopy,
    Window,
    WindowEntry,
    before,
    decode_entry,
    due_at,
    encode,
    entry_token,
    event_ref,
    take_into,
    window_budget,
)
from interlock.runtime.errors import InvalidInputs, UnknownWorkflow
from interlock.runtime.foreign import foreign_value
from interlock.runtime.keylocks import KeyLocks
from interlock.runtime.pausing import Pauses
from interlock.runtime.registry import Registry
from interlock.runtime.runs import Runs
from interlock.runtime.timers import Timers
from interlock.runtime.triggermetrics import WINDOW_CLOSED, WINDOW_EVENT, WINDOW_RUN
from interlock.runtime.triggerstate import scan_windows, window_entries
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.windows")

MAX_TRIES = 64
"""Compare-and-set attempts on one entry before giving up (the event comes again)."""
TAKEN_KEPT_S = 900
"""Seconds the references of a started window's events are kept (well over the time an
event taken but not acknowledged takes to come again)."""
_TOKEN = re.compile(r"w\.[0-9a-f]{16}\.[0-9a-f]{32}")
WRONG_LAST_SEQUENCE = 10071
"""The JetStream error code of a write whose expected last sequence is not the subject's."""


class Windows:
    """The orchestrator's side of debounced and batched triggers (see the module)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        runs: Runs,
        registry: Registry,
        timers: Timers,
        pauses: Pauses,
        clock: Callable[[], str],
        counters: Counter[str],
        observe: Callable[[str, str], None] = lambda what, detail: None,
    ) -> None:
        self._nc = nc
        self._js = jetstream(nc)
        self._subjects = subjects
        self._runs = runs
        self._registry = registry
        self._timers = timers
        self._pauses = pauses
        self._clock = clock
        self.counters = counters
        self._observe = observe
        self._kv: Any = None
        self._locks = KeyLocks()
        self._arrivals: dict[str, list[tuple[Arrival, asyncio.Future[str]]]] = {}
        """Per entry being written here, the events that came meanwhile (see :meth:`take`)."""
        self._sweep: asyncio.Task[None] | None = None

    # -- the bucket -------------------------------------------------------------------

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.triggers_bucket)
        return self._kv

    async def read(self, token: str) -> tuple[WindowEntry | None, int]:
        """The entry under ``token`` and its revision (0: none)."""
        kv = await self._bucket()
        try:
            found = await kv.get(token)
        except KeyNotFoundError:
            return None, 0
        if not found.value:
            return None, found.revision or 0
        try:
            return decode_entry(found.value), found.revision or 0
        except msgspec.DecodeError:
            foreign_value(self._subjects.triggers_bucket, token, "not a window", found.revision)
            return None, found.revision or 0

    async def _write(self, token: str, entry: WindowEntry, revision: int) -> bool:
        """Write ``entry`` if the key is still at ``revision`` (False: it is not). An entry
        with no window left keeps only its references, for ``TAKEN_KEPT_S``."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
        if entry.open is None and entry.sealed is None:
            headers["Nats-TTL"] = f"{TAKEN_KEPT_S}s"
        subject = f"$KV.{self._subjects.triggers_bucket}.{token}"
        try:
            await self._js.publish(subject, encode(entry), headers=headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise
        return True

    async def entries(self) -> list[WindowEntry]:
        """Every trigger key with a window open or closing (read without a consumer)."""
        return await window_entries(self._js, self._subjects)

    # -- events in --------------------------------------------------------------------

    async def take(
        self,
        definition: Definition,
        version: int,
        trigger: TriggerDef,
        key: str,
        event: Incoming,
        inputs: dict[str, Any],
        *,
        room: int,
    ) -> str:
        """Put ``event`` into the open window of its trigger's ``key`` (opening one), or
        know it there already (:data:`DUPLICATE`); a batch's window that it fills is
        closed and its run started. ``inputs``: what the trigger renders from the event;
        ``room``: the bytes a batch's items may take.

        The events of one key that this process takes while a write of its entry is out
        go in together in the next write (in the order they came): a flood of one key
        costs a write per batch of events, not one per event, so it does not hold up the
        ingress of every other key's events."""
        spec = trigger.window
        assert spec is not None
        item = inputs if trigger.input is not None else event.to_dict()
        copy = EventCopy(**msgspec.structs.asdict(event))
        # A debounce keeps what its trigger's input renders; its event's data, which are
        # the inputs without one, only once (in its copy: see _start).
        kept = inputs if spec.kind != "batch" and trigger.input is not None else {}
        arrival = Arrival(
            version=version,
            event=copy,
            ref=event_ref(event),
            inputs=kept,
            item=item,
            item_size=len(encode(item)) if spec.kind == "batch" else 0,
            last_size=len(encode(copy)) + len(encode(kept)),
        )
        token = entry_token(trigger.name, key)
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        waiting = self._arrivals.get(token)
        if waiting is not None:
            waiting.append((arrival, done))
            return await done
        self._arrivals[token] = [(arrival, done)]
        batch: list[tuple[Arrival, asyncio.Future[str]]] = []
        try:
            async with self._locks.locked(token):
                while batch := self._arrivals[token]:
                    self._arrivals[token] = []
                    try:
                        await self._take_all(token, trigger, key, batch, room)
                    # Each asker is told (its event comes again); the next batch goes on.
                    except Exception as exc:  # noqa: BLE001
                        _tell(batch, exc)
        finally:
            # Stopped half way: nobody is left waiting for good (the events come again).
            stopped = RuntimeError("the window's change was stopped")
            _tell([*batch, *self._arrivals.pop(token, [])], stopped)
        return await done

    async def _take_all(
        self,
        token: str,
        trigger: TriggerDef,
        key: str,
        batch: list[tuple[Arrival, asyncio.Future[str]]],
        room: int,
    ) -> None:
        """``batch`` into the entry, in as few writes as it takes (one, unless windows
        close on the way: a write each, their runs started between)."""
        spec = trigger.window
        assert spec is not None
        at, closed = 0, False
        for _ in range(MAX_TRIES + len(batch)):
            if at == len(batch) and not closed:
                return
            entry, revision = await self.read(token)
            entry = entry or WindowEntry(trigger=trigger.name, key=key, kind=spec.kind)
            if entry.sealed is not None:
                # The one before goes first (a batch just filled: its run starts now).
                await self._finish(token, entry, revision)
                continue
            closed = False
            if at == len(batch):
                return
            now = self._clock()
            taken: list[str] = []
            for arrival, _ in batch[at:]:
                how = take_into(
                    entry, arrival, kind=spec.kind, max_events=spec.max_events,
                    room=room, now=now, budget=window_budget(entry, self._nc.max_payload),
                )  # fmt: skip
                if how != CUT:
                    taken.append(how)
                if entry.sealed is not None:
                    break  # written now, its run started next, then on with the rest
            if not await self._write(token, entry, revision):
                continue
            await self._taken(token, entry, trigger, batch[at : at + len(taken)], taken)
            at += len(taken)
            closed = entry.sealed is not None
        raise RuntimeError(f"window of {trigger.name} ({key!r}): too many conflicting writes")

    async def _taken(
        self,
        token: str,
        entry: WindowEntry,
        trigger: TriggerDef,
        batch: list[tuple[Arrival, asyncio.Future[str]]],
        taken: list[str],
    ) -> None:
        """After a write: the first timer of a window opened (and not closed at once),
        what closed, the askers told."""
        kind = entry.kind
        window = entry.open
        for how in taken:
            if how not in (DUPLICATE, TOO_LARGE):
                self._observe(WINDOW_EVENT, kind)
            if how == OPENED:
                self.counters["windows_opened"] += 1
        if window is not None and (OPENED in taken or DUPLICATE in taken):
            await self._schedule_first(token, entry, window, trigger)
        if entry.sealed is not None:
            self._observe(WINDOW_CLOSED, f"{kind}:{entry.sealed.closed_by}")
        for (_, future), how in zip(batch, taken, strict=True):
            if not future.done():
                future.set_result(how)

    async def _schedule_first(
        self, token: str, entry: WindowEntry, window: Window, trigger: TriggerDef
    ) -> None:
        """The window's first timer: due when it would close if no event came after its
        first (the same timer each time asked: scheduling it again changes nothing)."""
        spec = trigger.window
        assert spec is not None
        first = Window(
            run_id=window.run_id,
            version=window.version,
            opened_at=window.opened_at,
            last_at=window.opened_at,
        )
        await self._schedule(token, window.run_id, due_at(entry.kind, first, trigger)[0])

    async def _schedule(self, token: str, run_id: str, at: str) -> None:
        millis = int(parse_time(at).timestamp() * 1000)
        await self._timers.schedule(run_id, f"{run_id}{WINDOW_TIMER}{token}:{millis}", at)

    # -- windows out ------------------------------------------------------------------

    async def due(self, run_id: str, timer_id: str) -> None:
        """A window's timer fired: close the window if it is due, else time it again for
        when it will be. A timer of a window closed already does nothing."""
        token = timer_id.split(WINDOW_TIMER, 1)[1].rsplit(":", 1)[0]
        if not _TOKEN.fullmatch(token):
            log.warning("a window timer names no window: %r", timer_id)
            return
        async with self._locks.locked(token):
            await self._due(token, run_id)

    async def _due(self, token: str, run_id: str) -> None:
        for _ in range(MAX_TRIES):
            entry, revision = await self.read(token)
            if entry is None:
                return
            if entry.sealed is not None:
                await self._finish(token, entry, revision)
                continue
            window = entry.open
            if window is None or window.run_id != run_id:
                return  # closed already; the next window has timers of its own
            trigger = await self._trigger(entry, window)
            if trigger is None:
                return
            at, reason = due_at(entry.kind, window, trigger)
            if before(self._clock(), at):
                await self._schedule(token, run_id, at)
                return
            window.closed_by = reason
            entry.sealed, entry.open = window, None
            if await self._write(token, entry, revision):
                self._observe(WINDOW_CLOSED, f"{entry.kind}:{reason}")
        raise RuntimeError(f"window {token}: too many conflicting writes")

    async def _trigger(self, entry: WindowEntry, window: Window) -> TriggerDef | None:
        found = await self._definition(entry, window)
        return None if found is None else found[1]

    async def _definition(
        self, entry: WindowEntry, window: Window
    ) -> tuple[Definition, TriggerDef] | None:
        """The workflow version the window's run starts with, and its trigger."""
        workflow, _, number = entry.trigger.partition("#trigger")
        namespace, _, name = workflow.partition("/")
        try:
            definition = await self._registry.definition(namespace, name, window.version)
        except UnknownWorkflow as exc:
            log.warning("window of %s: %s", entry.trigger, exc)
            return None
        index = int(number) - 1 if number.isdigit() else -1
        if not 0 <= index < len(definition.triggers):
            return None
        return definition, definition.triggers[index]

    async def _finish(self, token: str, entry: WindowEntry, revision: int) -> None:
        """Start the sealed window's run (refused, and fine, when it exists already),
        then clear the window, keeping its events' references a while."""
        sealed = entry.sealed
        assert sealed is not None
        found = await self._definition(entry, sealed)
        if found is not None:
            await self._start(entry, sealed, *found)
        entry.taken = [*entry.taken, *sealed.refs][-MAX_REFS:]
        entry.sealed = None
        await self._write(token, entry, revision)  # lost to a newer write: done again there

    async def _start(
        self, entry: WindowEntry, window: Window, definition: Definition, trigger: TriggerDef
    ) -> None:
        inputs = {"events": window.items} if entry.kind == "batch" else window.last_inputs
        if entry.kind != "batch" and trigger.input is None and window.last is not None:
            inputs = trigger_inputs(trigger, Incoming(**msgspec.structs.asdict(window.last)))
        record = ev.TriggerWindow(
            kind=entry.kind,
            trigger=entry.trigger,
            key=entry.key,
            count=window.count,
            events=window.ids,
            opened_at=window.opened_at,
            closed_by=window.closed_by,
        )
        try:
            opening = await self._runs.opening(
                definition,
                window.version,
                window.run_id,
                inputs,
                trigger=None
                if window.last is None
                else Incoming(**msgspec.structs.asdict(window.last)),
                paused=self._pauses.holds(definition.namespace, definition.name),
                window=record,
            )
        except InvalidInputs as exc:
            log.warning("window of %s (%r) starts no run: %s", entry.trigger, entry.key, exc)
            self.counters["windows_refused"] += 1
            return
        created, _ = await self._runs.open(opening)
        if created:
            self.counters["runs_started"] += 1
            self._observe(WINDOW_RUN, entry.kind)

    def start(self) -> None:
        """Sweep the windows left by orchestrators that stopped (in the background)."""
        self._sweep = asyncio.create_task(self._swept())

    async def stop(self) -> None:
        await cancel_and_wait(self._sweep)

    async def _swept(self) -> None:
        try:
            await self.sweep()
        # Done again at the next start; the timers close the windows meanwhile.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not sweep the triggers' windows: %s", exc)

    async def sweep(self) -> None:
        """Close what no timer will: windows sealed by an orchestrator that died before
        their runs started, and windows past due (their timer's message lost)."""
        # One window at a time, as read: a batch's keeps its every event (a key read twice,
        # written meanwhile, is looked at twice, each time afresh).
        async for _, entry in scan_windows(self._js, self._subjects):
            if entry is None:
                continue
            token = entry_token(entry.trigger, entry.key)
            if entry.sealed is not None:
                async with self._locks.locked(token):
                    fresh, revision = await self.read(token)
                    if fresh is not None and fresh.sealed is not None:
                        await self._finish(token, fresh, revision)
            elif entry.open is not None:
                await self.due(entry.open.run_id, f"{entry.open.run_id}{WINDOW_TIMER}{token}:0")


def _tell(batch: list[tuple[Arrival, asyncio.Future[str]]], error: Exception) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(error)
