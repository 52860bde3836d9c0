"""Payloads by reference around a decision: the references in a run's state and in what
arrives are loaded before the pure core decides (it sees values, as if they were inline),
and the values of its records too large for the log are stored and replaced by references
before the records are appended.

The core never sees a reference it must follow, and a log never holds a payload over the
threshold. Loading is bounded (each object by ``max_bytes``; the values kept at hand by
``cache_bytes`` of stored bytes), checked (size and SHA-256 against the reference: an
object changed after it was referenced fails the read, and no decision is made on it) and
cached by digest, so a run's later decisions find the value at hand. A value the core
copied from a loaded one (an answer's data into ``action.completed``, a state's output
into an output) keeps the reference it came with: nothing is stored twice, except a task
input, which is stored in its capability's own bucket (the one its agents may read).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.client import Client

from interlock.core import events as ev
from interlock.core.objects import (
    ObjectError,
    ObjectRef,
    StoredObjectDamaged,
    is_marker,
    parse_ref,
)
from interlock.transport.objects import DEFAULT_THRESHOLD, ObjectLimits, Objects
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.core.incoming import Incoming
    from interlock.core.state import RunState

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
ACCEPTED_KEPT = 65_536


class Payloads:
    """Loads and stores the payloads of runs' decisions (see the module)."""

    def __init__(
        self,
        objects: Objects,
        subjects: Subjects,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.objects = objects
        self.subjects = subjects
        self.threshold = threshold
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[ObjectRef, Any] = OrderedDict()
        self._cached_bytes = 0
        self._by_id: dict[int, ObjectRef] = {}
        self._accepted: OrderedDict[ObjectRef, None] = OrderedDict()
        self._made: set[str] = set()
        self.reads = 0
        """Objects read from the server (not found at hand)."""
        self.stored = 0
        """Values stored as objects by this process."""

    # --- loading -------------------------------------------------------------------------

    async def load(self, ref: ObjectRef) -> Any:
        """The value ``ref`` names: at hand, or read and checked (:class:`ObjectError`)."""
        if ref in self._cache:
            self._cache.move_to_end(ref)
            return self._cache[ref]
        value = await self.objects.get_value(ref)
        self.reads += 1
        self._keep(ref, value)
        return value

    def forget(self) -> None:
        """Drop the values at hand: the next decision that needs one reads it again (as
        an orchestrator that restarted, or whose cache no longer holds it, does)."""
        self._cache.clear()
        self._by_id.clear()
        self._cached_bytes = 0

    def _keep(self, ref: ObjectRef, value: Any) -> None:
        self._accept(ref)
        if ref.size > self.cache_bytes:
            return
        self._cache[ref] = value
        self._cached_bytes += ref.size
        if type(value) is dict or type(value) is list or type(value) is str:
            self._by_id[id(value)] = ref
        while self._cached_bytes > self.cache_bytes:
            old, gone = self._cache.popitem(last=False)
            self._cached_bytes -= old.size
            if self._by_id.get(id(gone)) == old:
                del self._by_id[id(gone)]

    def _accept(self, ref: ObjectRef) -> None:
        self._accepted[ref] = None
        self._accepted.move_to_end(ref)
        if len(self._accepted) > ACCEPTED_KEPT:
            self._accepted.popitem(last=False)

    def _known(self, value: Any) -> ObjectRef | None:
        ref = self._by_id.get(id(value))
        if ref is not None and self._cache.get(ref) is value:
            return ref
        return None

    async def incoming(self, incoming: Incoming) -> Incoming:
        """``incoming`` with its data loaded when it is a reference (which may name only
        the orchestrator account's bucket or a party's)."""
        if not is_marker(incoming.data):
            return incoming
        ref = parse_ref(incoming.data, "the event's data")
        if not self.subjects.may_reference(ref.bucket):
            raise ObjectError(
                f"the event's data names bucket {ref.bucket!r}: an event or an answer may "
                f"name {self.subjects.objects_bucket!r} or its sender's own bucket"
            )
        value = await self.load(ref)
        return msgspec.structs.replace(incoming, data=value)

    async def value(self, value: Any, where: str) -> Any:
        """``value`` loaded when it is a reference (one the log holds: a child run's
        inputs, a parked event's data)."""
        return await self.load(parse_ref(value, where)) if is_marker(value) else value

    async def state(self, state: RunState) -> RunState:
        """``state`` with every reference in it loaded (the same object when it holds none):
        the inputs, each context value, each state's output, the last result, and the
        results a map or a DAG state collects (in these places, and one level into a list
        there, so finding them is a look at each, never a walk of the values)."""
        if not _holds_refs(state):
            return state
        inputs = await self._place(state.inputs, "inputs")
        context = await self._places(state.context, "context")
        states = state.states
        for name, entry in state.states.items():
            output = entry.get("output") if type(entry) is dict else None
            loaded = await self._place(output, f"states.{name}.output")
            if loaded is not output:
                states = {**states, name: {**entry, "output": loaded}}
        result = await self._place(state.result, "result")
        map_, dag = state.map, state.dag
        if map_ is not None and map_.results:
            results = await self._places(map_.results, "map")
            map_ = (
                map_ if results is map_.results else msgspec.structs.replace(map_, results=results)
            )
        if dag is not None and dag.results:
            results = await self._places(dag.results, "steps")
            dag = dag if results is dag.results else msgspec.structs.replace(dag, results=results)
        same = (inputs, context, states, result, map_, dag)
        before = (state.inputs, state.context, state.states, state.result, state.map, state.dag)
        if all(a is b for a, b in zip(same, before, strict=True)):
            return state
        return msgspec.structs.replace(
            state, inputs=inputs, context=context, states=states, result=result, map=map_, dag=dag
        )

    async def _place(self, value: Any, where: str) -> Any:
        """``value`` loaded when it is a reference, or a list with references (loaded);
        else ``value`` itself."""
        if is_marker(value):
            return await self.load(parse_ref(value, where))
        if type(value) is list and any(is_marker(v) for v in value):
            return [await self._place(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    async def _places(self, values: dict[Any, Any], where: str) -> dict[Any, Any]:
        out = {k: await self._place(v, f"{where}.{k}") for k, v in values.items()}
        return values if all(out[k] is values[k] for k in values) else out

    # --- storing -------------------------------------------------------------------------

    async def records(self, records: list[ev.AnyRecord]) -> list[ev.AnyRecord] | None:
        """``records`` with each payload over the threshold, or loaded from a party's
        upload, stored as an object of the run (in the orchestrator account's bucket, or a
        task input in its capability's) and replaced by its reference (None: nothing to
        replace). A reference's shape that does not name an object of the run, put where a
        reference stands (from a value from outside), is refused with
        :class:`ObjectError`."""
        encoded = msgspec.json.encode(records)
        if len(encoded) <= self.threshold and b'"$object"' not in encoded:
            return None
        out: list[ev.AnyRecord] = []
        changed = False
        for record in records:
            run_id = record.subject or ""

            async def slot(value: Any, bucket: str, where: str, run_id: str = run_id) -> Any:
                return await self._slot(value, bucket, where, run_id)

            new = await on_slots(self.subjects, record, slot)
            changed = changed or new is not record
            out.append(new)
        return out if changed else None

    async def loaded(self, records: list[ev.AnyRecord]) -> list[ev.AnyRecord]:
        """``records`` with the reference in each payload's place loaded (what a reader
        shows, an export keeps and a replay decides on)."""
        out = []
        for record in records:

            async def slot(value: Any, bucket: str, where: str, record: Any = record) -> Any:
                try:
                    return await self._load_slot(value, bucket, where)
                except ObjectError as exc:
                    tag = type(record).__struct_config__.tag
                    raise StoredObjectDamaged(
                        f"run {record.subject}: the {where} of record {record.id} ({tag}), "
                        f"kept by reference, is damaged in its object bucket: {exc}"
                    ) from exc

            out.append(await on_slots(self.subjects, record, slot))
        return out

    async def loaded_values(self, values: dict[str, Any] | None, where: str) -> Any:
        """``values`` (outputs, inputs, context) with each reference among them loaded."""
        if values is None:
            return None
        try:
            if is_marker(values):  # inputs stored whole
                return await self.load(parse_ref(values, where))
            return {k: await self._load_slot(v, "", f"{where}.{k}") for k, v in values.items()}
        except StoredObjectDamaged:
            raise
        except ObjectError as exc:
            raise StoredObjectDamaged(
                f"the run's {where}: a value kept by reference is damaged in its object "
                f"bucket: {exc}"
            ) from exc

    async def _load_slot(self, value: Any, bucket: str, where: str) -> Any:
        return await self.load(parse_ref(value, where)) if is_marker(value) else value

    def _of_run(self, ref: ObjectRef, run_id: str) -> bool:
        """Whether ``ref`` is an object of the run ``run_id``: stored by the orchestrator
        under the run's name, in its account's bucket or a task-input bucket."""
        return ref.name.startswith(f"{run_id}.") and self.subjects.orchestrator_bucket(ref.bucket)

    async def _slot(self, value: Any, bucket: str, where: str, run_id: str) -> Any:
        """The value to record in one payload's place of a record of ``run_id``."""
        if is_marker(value):
            ref = parse_ref(value, where)
            if not self._of_run(ref, run_id):
                raise ObjectError(
                    f"{where}: holds an object reference that is not one of run {run_id}'s "
                    "(a reference stands only for a whole event's or answer's data)"
                )
            return value
        known = self._known(value)
        if known is not None and known.bucket == bucket and self._of_run(known, run_id):
            return known.to_json()
        if value is None or type(value) in (bool, int, float):
            return value
        encoded = msgspec.json.encode(value)
        if len(encoded) <= self.threshold and known is None:
            return value
        if bucket not in self._made:
            await self.objects.ensure_bucket(bucket)
            self._made.add(bucket)
        ref = await self.objects.put(bucket, encoded, prefix=f"{run_id}.")
        self.stored += 1
        self._keep(ref, value)
        return ref.to_json()


async def run_objects(
    subjects: Subjects, records: list[ev.AnyRecord], run_id: str
) -> list[ObjectRef]:
    """The objects of the run ``run_id`` its log references (what is deleted with it)."""
    found: dict[ObjectRef, None] = {}

    async def collect(value: Any, bucket: str, where: str) -> Any:
        if is_marker(value):
            ref = parse_ref(value, where)
            if ref.name.startswith(f"{run_id}.") and subjects.orchestrator_bucket(ref.bucket):
                found[ref] = None
        return value

    for record in records:
        await on_slots(subjects, record, collect)
    return list(found)


def _holds_refs(state: RunState) -> bool:
    """Whether a reference stands in one of the places :meth:`Payloads.state` loads (a
    plain look, no coroutine: most decisions' states hold none)."""

    def ref(value: Any) -> bool:
        return is_marker(value) or (type(value) is list and any(map(is_marker, value)))

    if ref(state.inputs) or ref(state.result):
        return True
    if any(map(ref, state.context.values())):
        return True
    if any(type(e) is dict and ref(e.get("output")) for e in state.states.values()):
        return True
    m, d = state.map, state.dag
    return bool(
        (m and any(map(ref, m.results.values()))) or (d and any(map(ref, d.results.values())))
    )


def payloads_for(nc: Client, subjects: Subjects, limits: ObjectLimits) -> Payloads:
    """The payloads of runs decided over ``nc`` under ``limits``."""
    objects = Objects(nc, max_bytes=limits.max_bytes)
    return Payloads(objects, subjects, threshold=limits.threshold)


SlotFn = Callable[[Any, str, str], Awaitable[Any]]
"""What is done with the value in one payload's place: (value, bucket, where) -> value."""


async def on_slots(subjects: Subjects, record: ev.AnyRecord, fn: SlotFn) -> ev.AnyRecord:
    """``record`` with ``fn`` applied to the value in each of its payload's places (the
    same record when none changed): where a record holds what came from outside or what
    the run made (inputs, an action's input and result, an event's data, a context
    value, an output). A task input's bucket is its capability's, every other's the
    orchestrator account's."""
    walk = _SLOTS.get(type(record))
    if walk is None:
        return record
    data = record.data
    new = await walk(_Slots(subjects, fn), data)
    return record if new is data else msgspec.structs.replace(record, data=new)


class _Slots:
    __slots__ = ("bucket", "fn", "subjects")

    def __init__(self, subjects: Subjects, fn: SlotFn) -> None:
        self.subjects, self.fn, self.bucket = subjects, fn, subjects.objects_bucket

    async def one(self, value: Any, where: str, bucket: str | None = None) -> Any:
        return await self.fn(value, bucket or self.bucket, where)

    async def values(self, values: dict[str, Any], where: str) -> dict[str, Any]:
        out = {k: await self.fn(v, self.bucket, f"{where}.{k}") for k, v in values.items()}
        return values if all(out[k] is values[k] for k in values) else out


async def _run_started(s: _Slots, d: ev.RunStartedData) -> Any:
    inputs = await s.one(d.inputs, "inputs")
    context = await s.values(d.context, "context")
    trigger = d.trigger
    if trigger is not None and "data" in trigger:
        data = await s.one(trigger["data"], "trigger.data")
        if data is not trigger["data"]:
            trigger = {**trigger, "data": data}
    came = d.continued_from
    if came is not None:  # the outputs of the states of the run it continues
        states = await _state_outputs(s, came.states, "continued_from.states")
        came = came if states is came.states else msgspec.structs.replace(came, states=states)
    same, before = (
        (inputs, context, trigger, came),
        (d.inputs, d.context, d.trigger, d.continued_from),
    )
    if all(a is b for a, b in zip(same, before, strict=True)):
        return d
    return msgspec.structs.replace(
        d, inputs=inputs, context=context, trigger=trigger, continued_from=came
    )


async def _state_outputs(s: _Slots, states: dict[str, Any], where: str) -> dict[str, Any]:
    out = states
    for name, entry in states.items():
        if type(entry) is dict and entry.get("output") is not None:
            output = await s.one(entry["output"], f"{where}.{name}.output")
            if output is not entry["output"]:
                out = {**out, name: {**entry, "output": output}}
    return out


async def _run_continued(s: _Slots, d: ev.RunContinuedData) -> Any:
    inputs = await s.one(d.inputs, "inputs")
    return d if inputs is d.inputs else msgspec.structs.replace(d, inputs=inputs)


async def _action_requested(s: _Slots, d: ev.ActionRequestedData) -> Any:
    bucket = None if d.workflow else s.subjects.inputs_bucket(d.capability)
    value = await s.one(d.input, "input", bucket)
    return d if value is d.input else msgspec.structs.replace(d, input=value)


async def _action_completed(s: _Slots, d: ev.ActionCompletedData) -> Any:
    result = await s.one(d.result, "result")
    writes = await s.values(d.context_writes, "context")
    if result is d.result and writes is d.context_writes:
        return d
    return msgspec.structs.replace(d, result=result, context_writes=writes)


async def _result(s: _Slots, d: Any) -> Any:
    result = await s.one(d.result, "result")
    return d if result is d.result else msgspec.structs.replace(d, result=result)


async def _event_received(s: _Slots, d: ev.EventReceivedData) -> Any:
    if "data" not in d.event:
        return d
    data = await s.one(d.event["data"], "event.data")
    if data is d.event["data"]:
        return d
    return msgspec.structs.replace(d, event={**d.event, "data": data})


async def _transition_fired(s: _Slots, d: ev.TransitionFiredData) -> Any:
    writes = await s.values(d.set, "set")
    return d if writes is d.set else msgspec.structs.replace(d, set=writes)


async def _outputs(s: _Slots, d: Any) -> Any:
    outputs = await s.values(d.outputs, "outputs")
    return d if outputs is d.outputs else msgspec.structs.replace(d, outputs=outputs)


_SLOTS: dict[type, Callable[[_Slots, Any], Awaitable[Any]]] = {
    ev.RunStarted: _run_started,
    ev.RunContinued: _run_continued,
    ev.ActionRequested: _action_requested,
    ev.ActionCompleted: _action_completed,
    ev.MapCompleted: _result,
    ev.DagCompleted: _result,
    ev.EventReceived: _event_received,
    ev.TransitionFired: _transition_fired,
    ev.RunCompleted: _outputs,
    ev.RunFailed: _outputs,
}
