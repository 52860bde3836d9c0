"""Starting runs and applying decisions to them: read the log, decide, append, retry.

Used by the orchestrator (with a cache of recent states) and by the CLI (``start``,
``cancel``) alike: any process may append to a run's log, because appends are optimistic.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from interlock.core import events as ev
from interlock.core.history import in_force, near
from interlock.core.state import RunState, fold
from interlock.core.vocabulary import ContinueMode, RunStatus
from interlock.runtime.errors import InvalidInputs, UnknownRun
from interlock.runtime.fairness import FairLanes
from interlock.runtime.foreign import Foreign
from interlock.runtime.logstore import LogStore
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.payloads import Payloads
from interlock.runtime.registry import Registry
from interlock.runtime.snapshots import EVERY, Snapshots, read_state
from interlock.transport.clock import utc_now
from interlock.transport.errors import AppendConflict

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.engine import Incoming
    from interlock.runtime.admitport import AdmitsAtOnce

log = logging.getLogger("interlock.runs")
T = TypeVar("T")

MAX_ATTEMPTS = 20
APPENDED_KEPT = 4_096
"""Appends whose records stay at hand until the relay reads them back (it then need not
decode them), with ``keep_appended``: a bound, for the ones another replica relays."""
OFF_LOOP_SWITCH_S = 0.0005
"""How long the thread of a costly decision may hold the interpreter while the event loop
waits for it (CPython's default, 5 ms, is paid at every I/O step of every other run: with
a costly decision going on, a short run took 38 times its quiet latency at 5 ms, 9 times at
1 ms, twice at 0.5 ms; ``python -m bench guard``). It only matters while two threads want
the interpreter, so it costs nothing the rest of the time."""
FINISHED_CACHE = 2_048
"""Finished runs whose state stays at hand: the relay's effects of a run's last records and
late answers or timers find them without reading the log again."""


class _RunLock:
    """The context of :meth:`Runs.locked` (a class: a generator-based context manager
    costs several calls more, and every decision takes one)."""

    __slots__ = ("_held", "_locks", "_run_id")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, list[int]]], run_id: str) -> None:
        self._locks = locks
        self._run_id = run_id
        self._held: tuple[asyncio.Lock, list[int]] | None = None

    async def __aenter__(self) -> None:
        found = self._locks.get(self._run_id)
        if found is None:
            found = self._locks[self._run_id] = (asyncio.Lock(), [0])
        found[1][0] += 1
        try:
            await found[0].acquire()
        except BaseException:
            self._leave(found)
            raise
        self._held = found

    async def __aexit__(self, *exc: object) -> None:
        found, self._held = self._held, None
        assert found is not None
        found[0].release()
        self._leave(found)

    def _leave(self, found: tuple[asyncio.Lock, list[int]]) -> None:
        users = found[1]
        users[0] -= 1
        if not users[0]:
            del self._locks[self._run_id]


@dataclass(slots=True)
class Entry:
    state: RunState
    last_seq: int
    definition: Definition
    messages: int = 0
    """Messages of the run's log up to ``last_seq`` (0: not counted)."""
    snapshot_at: int = 0
    """The log position the run's newest snapshot known here covers (0: none)."""
    foreign: tuple[Foreign, ...] = ()
    """The log's foreign messages found when it was read (a snapshot names them)."""


@dataclass(slots=True, frozen=True)
class Decided:
    """A decision's records with the run's state after them, as deciding computed it (what
    folding the records onto the state decided on gives): no need to fold them again."""

    records: list[ev.AnyRecord]
    state: RunState


@dataclass(slots=True, frozen=True)
class Opening:
    """A run's first records, decided on its (linked) definition, not yet appended."""

    run_id: str
    definition: Definition
    decided: Decided


Decision = Callable[["Definition", RunState], "Sequence[ev.AnyRecord] | Decided"]


class Runs:
    """Run logs plus the definitions they run, with a bounded cache of states."""

    def __init__(
        self,
        log_store: LogStore,
        registry: Registry,
        *,
        clock: Callable[[], str] = utc_now,
        cache_size: int = 10_000,
        observer: OrchestratorObserver | None = None,
        keep_appended: bool = False,
        snapshots: Snapshots | None = None,
        on_appended: Callable[[Sequence[ev.AnyRecord]], None] | None = None,
        on_appending: Callable[[Sequence[ev.AnyRecord]], None] | None = None,
        payloads: Payloads | None = None,
    ) -> None:
        """``snapshots``: read runs from their snapshots where they match the log (and,
        where it writes them, write one every :data:`snapshots.EVERY` records).
        ``payloads``: load the references in a run's state before deciding, and store the
        values of its records over the threshold (:mod:`interlock.runtime.payloads`)."""
        self.payloads = payloads
        self.observer = observer or OrchestratorObserver()
        self.log = log_store
        self.snapshots = snapshots
        self.registry = registry
        self.clock = clock
        self._cache: OrderedDict[str, Entry] = OrderedDict()
        self._cache_size = cache_size
        self._finished: OrderedDict[str, Entry] = OrderedDict()
        self._linked: dict[
            int, tuple[Definition, tuple[str, ...], tuple[Any, ...], Definition]
        ] = {}
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._appended: OrderedDict[tuple[str, int], tuple[list[ev.AnyRecord], float]] = (
            OrderedDict()
        )
        self._keep_appended = keep_appended
        self.on_appended = on_appended
        """Told each decision's records once their append is acknowledged (the
        orchestrator dispatches the actions they request at once)."""
        self.on_appending = on_appending
        """Told each decision's records once their append is sent (in the next turn of the
        event loop, so that it is on its way first): what is done with them once it is
        acknowledged can be made ready while the server stores them."""
        self.conflicts = 0
        self.at_once: AdmitsAtOnce | None = None  # admissions appended at once (atonce)
        self._loops: dict[int, tuple[Definition, bool]] = {}
        # One thread: a costly decision never holds up the loop, and several hold up at
        # most each other and the loop's share of the interpreter, never all of it.
        self._off_loop = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interlock-cel")
        self.lanes = FairLanes(self._off_loop)
        """The thread's queue, lane by lane (``interlock.runtime.fairness``)."""

    async def evaluate(self, work: Callable[[], T], lane: str = "") -> T:
        r"""``work()`` on the thread kept for costly evaluations, so the runs the event loop
        serves go on meanwhile (one thread: several costly evaluations hold up at most each
        other and the loop's share of the interpreter, never all of it), in its turn
        among the ``lane``\ s waiting (one item of each in turn: a lane's long queue holds up
        the others by one item at most)."""
        if sys.getswitchinterval() > OFF_LOOP_SWITCH_S:
            sys.setswitchinterval(OFF_LOOP_SWITCH_S)
        return await self.lanes.run(work, lane)

    async def _decide(
        self,
        decision: Callable[[Definition, Any], Sequence[ev.AnyRecord] | Decided],
        definition: Definition,
        state: Any,
        *,
        heavy: bool = False,
    ) -> Sequence[ev.AnyRecord] | Decided:
        """``decision(definition, state)``: here, or, for a workflow whose expressions may
        loop (:func:`may_loop`: a comprehension can take up to its whole step budget, a
        good half second) or on ``heavy`` values (an event of many values: converting
        them for CEL costs in proportion), on a thread of its own, so that the runs of
        every other workflow go on meanwhile. The decision is the same pure function
        either way: the same records, on replay too."""
        found = self._loops.get(id(definition))
        if found is None or found[0] is not definition:
            if len(self._loops) >= 1024:  # definitions linked again over time
                self._loops.clear()
            from interlock.core.definition import may_loop

            found = self._loops[id(definition)] = (definition, may_loop(definition))
        if not found[1] and not heavy:
            return decision(definition, state)
        lane = f"workflow:{definition.namespace}/{definition.name}"
        return await self.evaluate(lambda: decision(definition, state), lane)

    def _appended_now(self, run_id: str, seq: int, records: Sequence[ev.AnyRecord]) -> None:
        if self.on_appended is not None:
            self.on_appended(records)
        if not self._keep_appended:
            return
        self._appended[run_id, seq] = (list(records), time.monotonic())
        if len(self._appended) > APPENDED_KEPT:
            self._appended.popitem(last=False)

    def appended(self, run_id: str, seq: int) -> tuple[list[ev.AnyRecord], float] | None:
        """The records this process appended to ``run_id`` at stream sequence ``seq`` (of
        the run's partition) and when (``time.monotonic()``), once (None: not appended
        here, or asked for already)."""
        return self._appended.pop((run_id, seq), None)

    def locked(self, run_id: str) -> _RunLock:
        """Decisions on one run, one at a time in this process (others race optimistically):
        ``async with runs.locked(run_id): ...``.

        A run's lock lives while someone holds or awaits it, then goes: counting users
        (not ``Lock.locked()``, which is false while a woken waiter has yet to run) keeps
        two holders from ever getting two different locks.
        """
        return _RunLock(self._locks, run_id)

    async def load(self, run_id: str, *, fresh: bool = False) -> Entry | None:
        """The run's state, from the cache or by folding its log (None: no such run)."""
        entry = None if fresh else self._cache.get(run_id)
        if entry is not None:
            self._cache.move_to_end(run_id)
            return entry
        if not fresh:
            # Nothing is ever appended to a finished run, so its cached state stays true.
            entry = self._finished.get(run_id)
            if entry is not None:
                return entry
        read = await read_state(self.log, self.snapshots, run_id, consistent=fresh)
        if read is None:
            return None
        state = read.state
        definition = await self.registry.definition(state.namespace, state.workflow, state.version)
        link = self._link(definition)
        entry = Entry(state, read.last, link, read.messages, read.covered, tuple(read.foreign))
        self._remember(run_id, entry)
        return entry

    def _remember(self, run_id: str, entry: Entry) -> None:
        if entry.state.finished:
            self._cache.pop(run_id, None)
            self._finished[run_id] = entry
            if len(self._finished) > min(self._cache_size, FINISHED_CACHE):
                self._finished.popitem(last=False)
            return
        self._cache[run_id] = entry
        self._cache.move_to_end(run_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def cached(self, run_id: str) -> Entry | None:
        """The cached state of a run, if any (no I/O)."""
        return self._cache.get(run_id) or self._finished.get(run_id)

    def forget(self, run_id: str) -> None:
        self._cache.pop(run_id, None)
        self._finished.pop(run_id, None)

    def _link(self, definition: Definition) -> Definition:
        """``registry.link``, done again only when an AgentDef it read has changed (it
        rebuilds every state of the definition, and every run start needs it)."""
        memo = self._linked.get(id(definition))
        if memo is not None and memo[0] is definition:
            names, seen, linked = memo[1], memo[2], memo[3]
            if all(self.registry.capability(n) is c for n, c in zip(names, seen, strict=True)):
                return linked
        names = tuple(sorted(definition.capabilities()))
        seen = tuple(self.registry.capability(name) for name in names)
        linked = self.registry.link(definition)
        if len(self._linked) > 256:  # definitions replaced many times over
            self._linked.clear()
        self._linked[id(definition)] = (definition, names, seen, linked)
        return linked

    async def apply(
        self, run_id: str, decision: Decision, *, heavy: bool = False, loads: bool = True
    ) -> list[ev.AnyRecord]:
        """Decide on the run's current state and append; on a lost race, re-read and retry.
        ``heavy``: the decision meets many values (see :meth:`_decide`). ``loads``: the
        decision may read payloads kept by reference (a cancellation reads none, so an
        object that fails its check does not keep a run from being cancelled)."""
        for attempt in range(MAX_ATTEMPTS):
            from_cache = attempt == 0 and run_id in self._cache
            entry = await self.load(run_id, fresh=attempt > 0)
            if entry is None:
                raise UnknownRun(run_id)
            state = entry.state
            if self.payloads is not None and loads:
                state = await self.payloads.state(state)
            loaded = state is not entry.state
            out = await self._decide(decision, entry.definition, state, heavy=heavy or loaded)
            after = out.state if isinstance(out, Decided) and not loaded else None
            records = list(out.records if isinstance(out, Decided) else out)
            taken = None
            if self.at_once is not None and not loaded:  # (no value by reference in play)
                taken = await self.at_once.take(
                    run_id, entry.definition, records, (entry.state, after), self._decide
                )
                records, after = (records, after) if taken is None else taken.appending()
            if records and self.payloads is not None:
                stored = await self.payloads.records(records)
                if stored is not None:
                    records, after = stored, None
            if not records:
                # "Nothing to do" may only mean that the cached copy is behind the log (another
                # replica, or the CLI, appended since): an answer to an action requested there
                # would be dropped. Look once for newer records before taking it as final.
                if from_cache and await self.log.last_seq(run_id) > entry.last_seq:
                    self.forget(run_id)
                    continue
                return []
            if taken is not None and not taken.in_time():
                records, after = taken.asked, None  # the relay admits them
            if self.on_appending is not None:
                asyncio.get_running_loop().call_soon(self.on_appending, records)
            try:
                last = await self.log.append(run_id, records, entry.last_seq)
            except AppendConflict:
                if taken is not None:
                    taken.refused()
                self.conflicts += 1
                self.observer.conflict()
                self.forget(run_id)
                continue
            state = fold(records, entry.state) if after is None else after
            limit = near(state)
            if (
                limit is not None
                and state.status == RunStatus.RUNNING
                and near(entry.state) is None
            ):
                self._history_near(run_id, state, limit)
            messages = entry.messages + 1 if entry.messages else 0
            snapshot_at = entry.snapshot_at
            snapshots = self.snapshots
            if snapshots and snapshots.writing and messages and state.seq - snapshot_at >= EVERY:
                snapshots.keep(run_id, state, last, messages, entry.foreign)
                snapshot_at = state.seq
            kept = Entry(state, last, entry.definition, messages, snapshot_at, entry.foreign)
            self._remember(run_id, kept)
            self._appended_now(run_id, last, records)
            self.observer.appended(run_id, records)
            return records
        raise RuntimeError(f"run {run_id}: gave up after {MAX_ATTEMPTS} conflicting appends")

    def _history_near(self, run_id: str, state: RunState, limit: str) -> None:
        """A run's log just reached 80% of a history limit: said once, when it does."""
        h = in_force(state)
        if h.continue_as_new == ContinueMode.AUTO:
            then = "it continues as new at its next transition"
        else:
            then = "it fails with history_exceeded at the limit (continue_as_new: never)"
        log.warning(
            "run %s of workflow %s/%s: continue-as-new suggested: its log holds %d records, "
            "%d bytes, past 80%% of %s (records %s, bytes %s); %s",
            run_id,
            state.namespace,
            state.workflow,
            state.seq,
            state.size,
            limit,
            h.max_records,
            h.max_bytes,
            then,
        )
        self.observer.history_near(run_id, state.workflow, limit)

    async def start(
        self,
        definition: Definition,
        version: int,
        run_id: str,
        inputs: Mapping[str, Any],
        **how: Any,
    ) -> tuple[bool, list[ev.AnyRecord]]:
        """Start a run; (False, []) when a run with this id exists already: its first
        records decided (:meth:`opening`, which takes ``how``: ``trigger``,
        ``traceparent``, ``parent``, ``spawn``, ``deadline_s``) and appended (:meth:`open`).

        Every start goes through here (``interlock start``, a trigger, a child run), with
        the AgentDefs made current first: the first state's actions get their capability's
        defaults however the run was started."""
        return await self.open(await self.opening(definition, version, run_id, inputs, **how))

    async def opening(
        self,
        definition: Definition,
        version: int,
        run_id: str,
        inputs: Mapping[str, Any],
        *,
        trigger: Incoming | None = None,
        traceparent: str | None = None,
        parent: ev.ParentRef | None = None,
        spawn: ev.SpawnBudget | None = None,
        deadline_s: float | None = None,
        paused: bool = False,
        window: ev.TriggerWindow | None = None,
        rate: ev.RateHold | None = None,
    ) -> Opening:
        """The first records of a run, decided but not appended (:meth:`open` appends
        them): a caller that must wait for something before starting (the ingress, for
        its registry check) decides meanwhile. Raises :class:`InvalidInputs`."""
        # The engine is loaded by what starts runs, not by every reader of this module.
        from interlock.core.bounds import too_deep_inputs
        from interlock.core.definition import resolve_inputs
        from interlock.core.engine import started
        from interlock.core.history import limits
        from interlock.core.incoming import heavy_value

        await self.registry.current_agents()
        if self.payloads is not None:  # a child run's inputs, stored by its parent's log
            inputs = await self.payloads.value(inputs, "inputs")
        history = limits(definition, await self.registry.history.get())
        definition = self._link(definition)
        # Nesting first: nothing recursive (type checks, CEL, a log's readers) may see it.
        problems = too_deep_inputs(inputs)
        resolved, problems = (
            (dict(inputs), problems) if problems else resolve_inputs(definition, inputs)
        )
        if problems:
            raise InvalidInputs(f"{definition.namespace}/{definition.name}", problems)
        now = self.clock()
        out = await self._decide(
            lambda d, _: Decided(
                *started(
                    d,
                    run_id=run_id,
                    inputs=resolved,
                    now=now,
                    version=version,
                    trigger=trigger,
                    traceparent=traceparent,
                    parent=parent,
                    spawn=spawn,
                    deadline_s=deadline_s,
                    paused=paused,
                    window=window,
                    rate=rate,
                    history=history,
                )
            ),
            definition,
            None,
            heavy=heavy_value(inputs) or (trigger is not None and heavy_value(trigger.data)),
        )
        assert isinstance(out, Decided)
        if self.payloads is not None:
            stored = await self.payloads.records(out.records)
            if stored is not None:
                out = Decided(stored, fold(stored))
        return Opening(run_id, definition, out)

    async def open(self, opening: Opening) -> tuple[bool, list[ev.AnyRecord]]:
        """Append a run's first records (:meth:`opening`); (False, []) when a run with
        this id exists already."""
        run_id, records = opening.run_id, opening.decided.records
        state, taken = opening.decided.state, None
        if self.at_once is not None:
            taken = await self.at_once.opening(
                run_id, opening.definition, (records, state), self.payloads, self._decide
            )
            records, state = (records, state) if taken is None else taken.appending()
        if self.on_appending is not None:
            asyncio.get_running_loop().call_soon(self.on_appending, records)
        try:
            last = await self.log.append(run_id, records, 0)
        except AppendConflict:
            if taken is not None:
                taken.refused()
            return False, []
        self._remember(run_id, Entry(state, last, opening.definition, 1))
        self._appended_now(run_id, last, records)
        self.observer.appended(run_id, records)
        return True, records
