"""Emitting an event as an external system would, and working out which runs it starts."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import APIError

from interlock.client.msgids import dedupe_key, message_id
from interlock.core.bounds import MAX_DEPTH, max_event_bytes, too_deep
from interlock.core.ids import check_event_type, check_run_id
from interlock.core.objects import is_marker
from interlock.runtime.errors import EventTooLarge
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent, encode_binary, from_dict
from interlock.transport.cloudevents_model import check_event_id
from interlock.transport.logmac import LogKey
from interlock.transport.refusals import PermissionRefused, refusable
from interlock.views import EmitResult, EventRefusal, StartedRun

if TYPE_CHECKING:
    from interlock.core.definition import Definition, TriggerDef
    from interlock.core.windowing import RateEntry
    from interlock.runtime.applied import Catalog
    from interlock.runtime.client import InterlockClient


def build_event(
    event: CloudEvent | Mapping[str, Any] | None,
    type_: str | None,
    source: str | None,
    data: Any,
    id_: str | None,
    subject: str | None,
    extensions: Mapping[str, str] | None,
) -> CloudEvent:
    """The event ``emit`` was given: a :class:`CloudEvent`, a structured-mode object, or
    its attributes (``id`` a new one by default, ``time`` now)."""
    if isinstance(event, CloudEvent):
        return event
    if event is not None:
        return from_dict(dict(event))
    if type_ is None or not source:
        raise ValueError("emit needs an event, or type= and source=")
    return CloudEvent(
        id=id_ or secrets.token_hex(8),
        source=source,
        type=type_,
        subject=subject,
        time=utc_now(),
        datacontenttype="application/json" if data is not None else None,
        data=data,
        extensions=dict(extensions or {}),
    )


def check_size(payload: bytes, max_payload: int, max_bytes: int | None = None) -> None:
    """Raise :class:`EventTooLarge` for a payload the orchestrator's ingress would refuse
    (the same bound: ``max_event_bytes``), or, with ``max_bytes`` (its data goes by
    reference when over that bound), one over the bound of an object."""
    limit = max_event_bytes(max_payload) if max_bytes is None else max_bytes
    if len(payload) > limit:
        raise EventTooLarge(len(payload), limit, by_reference=max_bytes is not None)


def by_reference_from(ops: InterlockClient) -> int:
    """The size from which an event's data is sent by reference: the threshold, and never
    more than the ingress takes inline."""
    return min(ops.payloads.threshold, max_event_bytes(ops.nc.max_payload))


async def by_reference(ops: InterlockClient, event: CloudEvent) -> CloudEvent:
    """``event`` with its data stored in an object bucket (this credential's own, else the
    orchestrator account's uploads) and a reference in its place, when its data is over
    :func:`by_reference_from`; else ``event`` itself."""
    if event.data is None or is_marker(event.data):
        return event
    data = msgspec.json.encode(event.data)
    if len(data) <= by_reference_from(ops):
        return event
    check_size(data, ops.nc.max_payload, ops.payloads.objects.max_bytes)
    bucket = getattr(ops.nc, "objects_bucket", None) or ops.subjects.uploads_bucket
    ref = await ops.payloads.objects.put(bucket, data)
    return msgspec.structs.replace(event, data=ref.to_json(), datacontenttype="application/json")


async def publish(ops: InterlockClient, event: CloudEvent) -> tuple[int, bool]:
    """Store ``event`` on its subject, deduplicated by source and id as on NATS: (stream
    sequence, whether the stream had it already). Data over the threshold goes by
    reference (:func:`by_reference`)."""
    key = await dedupe_key(ops)
    subject, payload, headers = _message(ops, await by_reference(ops, event), key)
    ack = await ops.js.publish(subject, payload, headers=headers)
    return int(ack.seq), bool(ack.duplicate)


def _message(
    ops: InterlockClient, event: CloudEvent, key: LogKey | None = None
) -> tuple[str, bytes, dict[str, str]]:
    """The subject, payload and headers ``event`` is stored with (its data already by
    reference where it goes so), deduplicated under ``key`` (:func:`message_id`)."""
    headers, payload = encode_binary(event)
    check_size(payload, ops.nc.max_payload)
    # An event for one run goes on that run's subject (publishers may not publish there).
    subject = ops.subjects.inbound(event.type, event.extensions.get("runid"))
    headers["Nats-Msg-Id"] = message_id(event, subject, key)
    return subject, payload, headers


async def publish_in_order(
    ops: InterlockClient, events: list[CloudEvent]
) -> list[tuple[int, bool]]:
    """Store ``events`` in their order, as :func:`publish` would one after another, without
    waiting for one's acknowledgement before sending the next: JetStream stores one
    connection's publishes in the order sent, so a batch costs one round trip. Every
    event's data goes by reference (where it does) and is checked before the first is
    sent. Raises as :func:`publish` does (those sent before may be stored: deduplicated,
    sending them again is safe)."""
    key = await dedupe_key(ops)
    messages = [_message(ops, await by_reference(ops, e), key) for e in events]
    sent: list[asyncio.Future[Any] | api.PubAck] = []
    for subject, payload, headers in messages:
        early = ops.js.request_ack_soon(subject, payload, headers=headers)
        # Not sent at once (the reply subscription not made yet, a full buffer): sent and
        # acknowledged before the next goes, so the order holds.
        sent.append(early or await ops.js.publish(subject, payload, headers=headers))
    try:
        acks = [ops.js.acknowledged(await s) if isinstance(s, asyncio.Future) else s for s in sent]
    finally:
        for s in sent:  # nothing left waiting when one failed
            if isinstance(s, asyncio.Future) and not s.done():
                s.cancel()
    return [(int(a.seq), bool(a.duplicate)) for a in acks]


@dataclass
class Foreseen:
    """What the orchestrator's ingress does with an event (see :func:`foresee`)."""

    started: list[StartedRun] = field(default_factory=list)
    refused: list[EventRefusal] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    gathered: list[str] = field(default_factory=list)


async def foresee(
    ops: InterlockClient,
    event: CloudEvent,
    known: Catalog | None = None,
    book: RateBook | None = None,
) -> Foreseen:
    """What the orchestrator's ingress does with ``event``, by its own rules over the
    workflows applied now (only those whose manifest names its type are compiled): the
    runs its triggers start, the workflows that dead-letter it (their trigger's input or
    the inputs it makes do not work, or its correlation key cannot be computed), the runs
    its correlation keys reach, and the workflows it is kept for (no run of its key yet).
    ``known``: the workflows as :func:`read_catalog` reads them for a batch of
    events, where each event alone reads them again; ``book``: the starts the batch's
    events before it take under rates."""
    # Deciding what an event starts compiles workflows: the engine is loaded here only.
    from interlock.core.engine import matching_trigger
    from interlock.core.expr import OverBudget
    from interlock.core.incoming import event_correlation_key
    from interlock.runtime.correlation import CorrelationIndex
    from interlock.runtime.flow import to_incoming

    registry = ops.registry
    if known is None:
        known = await read_catalog(ops)
    incoming = to_incoming(event)
    out = Foreseen()
    for (ns, name), (version, _, manifest) in sorted(known.items()):
        triggers, correlates = _names_type(manifest, event.type)
        if not (triggers or correlates):
            continue
        try:
            definition = await registry.definition(ns, name, version)
        except Exception:  # noqa: BLE001, S112 - the orchestrator cannot load it either
            continue
        trigger = matching_trigger(definition, incoming) if triggers else None
        if trigger is not None:
            await _foresee_start(ops, out, definition, version, trigger, event, book)
        if not correlates:
            continue
        try:
            key = event_correlation_key(definition, incoming)
        except OverBudget as exc:
            out.refused.append(_refusal(definition, "bad-correlation-key", f"{name}: {exc}"))
            continue
        if key is None:
            continue
        runs = await CorrelationIndex(ops.nc, ops.subjects).runs(ns, name, key)
        out.reached += [r for r in runs if r not in out.reached]
        if not runs:
            out.parked.append(f"{ns}/{name}")
    return out


async def read_catalog(ops: InterlockClient) -> Catalog:
    """The workflows applied now, as :func:`foresee` reads them: what was stored since
    this client last looked, read on top of what it read then (``ops.applied``). The
    AgentDefs are not read: what an event starts does not depend on them."""
    return await ops.applied.current()


async def _foresee_start(
    ops: InterlockClient,
    out: Foreseen,
    definition: Definition,
    version: int,
    trigger: TriggerDef,
    event: CloudEvent,
    book: RateBook | None,
) -> None:
    """What the workflow's ``trigger`` does with ``event``: starts a run, takes it into a
    window, or dead-letters it (the orchestrator's checks, in its order)."""
    from interlock.core.definition import resolve_inputs
    from interlock.core.engine import derive_run_id, trigger_inputs
    from interlock.core.expr import ExpressionError
    from interlock.runtime.flow import to_incoming
    from interlock.runtime.routing import flow_key

    incoming = to_incoming(event)
    name = definition.name
    try:
        inputs: dict[str, Any] | None = trigger_inputs(trigger, incoming)
    except ExpressionError as exc:
        out.refused.append(_refusal(definition, "bad-trigger-input", f"{name}: {exc}"))
        return
    window_key, problem = flow_key(trigger, incoming)
    if problem is not None:
        out.refused.append(_refusal(definition, "bad-trigger-key", f"{name}: {problem}"))
        return
    # A batch's run takes its events as its inputs: the event is checked as one item.
    given = inputs
    if trigger.window is not None and trigger.window.kind == "batch":
        given = {"events": [inputs if trigger.input is not None else incoming.to_dict()]}
    problems = resolve_inputs(definition, given or {})[1]
    if problems:
        detail = "; ".join(str(p) for p in problems)
        out.refused.append(_refusal(definition, "invalid-inputs", detail))
    elif trigger.window is not None:
        out.gathered.append(f"{trigger.name}@{trigger.window.kind} {window_key}")
    elif await _over_rate(ops, definition, trigger, window_key, book):
        from interlock.runtime.rates import dropped

        out.refused.append(_refusal(definition, "rate-limited", dropped(trigger, window_key)))
    else:
        run_id = derive_run_id(definition, event.source, event.id)
        out.started.append(
            StartedRun(
                run_id=run_id,
                workflow=definition.name,
                namespace=definition.namespace,
                version=version,
                existed=await ops.log.last_seq(run_id) > 0,
            )
        )


class RateBook:
    """The starts a batch's events take under their triggers' rates (``on_limit: drop``),
    as the orchestrator will give them in the batch's order: each event is over the rate
    as it stands plus the starts of the events before it. ``record``: whether the event
    worked out now reaches the orchestrator (not a repeat of one earlier in the batch,
    which the stream drops)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str, str], RateEntry] = {}
        self.record = True


async def _over_rate(
    ops: InterlockClient,
    definition: Definition,
    trigger: TriggerDef,
    key: str,
    book: RateBook | None,
) -> bool:
    """Whether the trigger's rate drops the event now (``on_limit: drop``, its key's last
    starts filling the window, and with ``book`` the batch's events before it); False when
    it cannot tell (no right to read the rates)."""
    from interlock.runtime.rates import Rates

    if trigger.rate is None or trigger.rate.on_limit != "drop":
        return False
    rates = Rates(ops.nc, ops.subjects, clock=utc_now)
    try:
        if book is None:
            return await rates.over(trigger, key)
        ident = (definition.namespace, definition.name, trigger.name, key)
        entry = book.entries.get(ident)
        if entry is None:
            entry = book.entries[ident] = await rates.entry(trigger, key)
    except Exception:  # noqa: BLE001 - a guess it cannot make: the run is listed
        return False
    return not rates.takes(entry, record=book.record)


def _refusal(definition: Definition, reason: str, detail: str) -> EventRefusal:
    return EventRefusal(
        workflow=definition.name, namespace=definition.namespace, reason=reason, detail=detail
    )


def _names_type(manifest: Mapping[str, Any], event_type: str) -> tuple[bool, bool]:
    """Whether the manifest has a trigger on ``event_type``, and whether it correlates
    events of that type."""
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return False, False
    correlate = spec.get("correlate")
    events = correlate.get("events") if isinstance(correlate, Mapping) else None
    return _triggers_on(manifest, event_type), isinstance(events, Mapping) and (
        event_type in events
    )


def _triggers_on(manifest: Mapping[str, Any], event_type: str) -> bool:
    spec = manifest.get("spec")
    triggers = spec.get("triggers") if isinstance(spec, Mapping) else None
    if not isinstance(triggers, list):
        return False
    return any(isinstance(t, Mapping) and t.get("event") == event_type for t in triggers)


NOT_READ = (
    "what it starts is not shown: a publisher reads no workflows and no runs, so it is "
    "told only that its event is stored (expected; an operator or a reader sees the runs)"
)
"""``EmitResult.unknown`` for a publisher, which may publish the event and read nothing of
what takes it: on NATS (its credential reads no workflow) and over HTTP (its token) alike,
so neither path tells it of runs, keys or workflows of others."""


def _check(ce: CloudEvent) -> None:
    """What :func:`emit` refuses before anything is published or looked up."""
    check_event_type(ce.type)
    check_event_id(ce.id)
    if too_deep(ce.data):
        raise InvalidCloudEvent(
            "too-deep", f"the event's data nests deeper than {MAX_DEPTH} levels"
        )
    run_id = ce.extensions.get("runid")
    if run_id:
        check_run_id(run_id)


def _not_known(exc: Exception) -> str:
    """``EmitResult.unknown`` when the workflows could not be read (``exc``)."""
    if isinstance(exc, NatsTimeout):
        return f"which runs it starts is not known: the workflows could not be read in time ({exc})"
    # A publisher may publish its events and read nothing (a credential of an account of
    # its own has no JetStream at all): the event still goes, and which runs it starts is
    # for the orchestrator to say, not this credential.
    return NOT_READ


_UNREADABLE = (PermissionRefused, NoRespondersError, APIError, NatsTimeout)


async def _foreseen(
    ops: InterlockClient, ce: CloudEvent, known: Catalog | None, book: RateBook | None = None
) -> tuple[Foreseen, str | None]:
    """What ``ce`` does, and why that is not known where it is not."""
    if ce.extensions.get("runid"):
        return Foreseen(), None
    try:
        return await refusable(ops.nc, foresee(ops, ce, known, book)), None
    except _UNREADABLE as exc:
        return Foreseen(), _not_known(exc)


async def _answer(
    ops: InterlockClient,
    ce: CloudEvent,
    seen: tuple[Foreseen, str | None],
    stored: tuple[int, bool],
    wait: float,
) -> EmitResult:
    foreseen, unknown = seen
    started = foreseen.started
    for s in started:  # asked for before it starts, such a run is not started yet
        if not s.existed:
            ops.watcher.told.add(s.run_id)
    if wait > 0 and started:
        found = await asyncio.gather(
            *(ops.watcher.exists(s.run_id, wait) for s in started if not s.existed)
        )
        fresh = iter(found)
        started = [
            s if s.existed or next(fresh) else msgspec.structs.replace(s, pending=True)
            for s in started
        ]
    return EmitResult(
        id=ce.id,
        type=ce.type,
        source=ce.source,
        seq=stored[0],
        duplicate=stored[1],
        started=started,
        run_id=ce.extensions.get("runid"),
        reached=foreseen.reached,
        parked=foreseen.parked,
        refused=foreseen.refused,
        gathered=foreseen.gathered,
        unknown=unknown,
    )


async def emit(ops: InterlockClient, ce: CloudEvent, wait: float) -> EmitResult:
    """Publish ``ce`` and say which runs it starts, waiting up to ``wait`` seconds for
    the orchestrator to start them (see ``Client.emit``)."""
    _check(ce)
    seen = await _foreseen(ops, ce, None)
    return await _answer(ops, ce, seen, await publish(ops, ce), wait)


async def emit_batch(
    ops: InterlockClient, events: list[CloudEvent], wait: float, *, publisher: bool = False
) -> list[EmitResult]:
    """:func:`emit` for each of ``events``, stored in their order, each answered as
    :func:`emit` answers it, in about the time of one: the workflows are read once for
    all, what each event does is worked out side by side, the events are published
    without waiting for each other's acknowledgement (:func:`publish_in_order`), and the
    runs are waited for (up to ``wait`` seconds) together. Nothing is published when one
    of them is refused before publishing (an invalid event, data over the bounds).
    ``publisher``: the events are a publisher's, told what a publisher's own credential
    is told (:data:`NOT_READ`), though ``ops`` may read more."""
    for ce in events:
        _check(ce)
    unknown: str | None = NOT_READ if publisher else None
    known: Catalog | None = None
    drops = False
    if unknown is None and any(not ce.extensions.get("runid") for ce in events):
        try:
            known = await refusable(ops.nc, read_catalog(ops))
            drops = await _compile(ops, known, {ce.type for ce in events})
        except _UNREADABLE as exc:
            unknown = _not_known(exc)
    if unknown is not None:
        seen = [(Foreseen(), None if ce.extensions.get("runid") else unknown) for ce in events]
    elif drops:
        # Over a rate or not depends on the events before: worked out one after another.
        book, sent, seen = RateBook(), set(), []
        for ce in events:
            book.record = (ce.source, ce.id) not in sent
            sent.add((ce.source, ce.id))
            seen.append(await _foreseen(ops, ce, known, book))
    else:
        seen = list(await asyncio.gather(*(_foreseen(ops, ce, known) for ce in events)))
    stored = await publish_in_order(ops, events)
    return list(
        await asyncio.gather(
            *(_answer(ops, ce, s, a, wait) for ce, s, a in zip(events, seen, stored, strict=True))
        )
    )


async def _compile(ops: InterlockClient, known: Catalog, types: set[str]) -> bool:
    """Compile once the workflows that take any of ``types``, before the events are
    worked out side by side (each would compile them); whether one of their triggers on
    those types has a rate that drops events."""
    drops = False
    for (ns, name), (version, _, manifest) in sorted(known.items()):
        if any(any(_names_type(manifest, t)) for t in types):
            try:
                definition = await ops.registry.definition(ns, name, version)
            except Exception:  # noqa: BLE001, S112 - foresee says why it cannot
                continue
            drops = drops or any(
                t.event in types and t.rate is not None and t.rate.on_limit == "drop"
                for t in definition.triggers
            )
    return drops
