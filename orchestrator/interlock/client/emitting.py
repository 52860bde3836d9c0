"""Emitting an event as an external system would, and working out which runs it starts."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

from interlock.client.catalog import catalog
from interlock.core.ids import check_event_type, check_run_id
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent, encode_binary, from_dict
from interlock.transport.refusals import PermissionRefused, refusable
from interlock.views import EmitResult, StartedRun

if TYPE_CHECKING:
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


async def publish(ops: InterlockClient, event: CloudEvent) -> tuple[int, bool]:
    """Store ``event`` on its subject, deduplicated by source and id as on NATS: (stream
    sequence, whether the stream had it already)."""
    headers, payload = encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    # An event for one run goes on that run's subject (publishers may not publish there).
    subject = ops.subjects.inbound(event.type, event.extensions.get("runid"))
    ack = await ops.js.publish(subject, payload, headers=headers)
    return int(ack.seq), bool(ack.duplicate)


async def would_start(ops: InterlockClient, event: CloudEvent) -> list[StartedRun]:
    """The runs the orchestrator's ingress starts for ``event`` (its own rules, over the
    workflows applied now; only those with a trigger on its type are compiled)."""
    # Deciding what an event starts compiles workflows: the engine is loaded here only.
    from interlock.core.definition import resolve_inputs
    from interlock.core.engine import derive_run_id, matching_trigger, trigger_inputs
    from interlock.core.expr import ExpressionError
    from interlock.runtime.flow import to_incoming

    registry = ops.registry
    with contextlib.suppress(BucketNotFoundError, NotFoundError):
        await registry.load_agents()
    incoming = to_incoming(event)
    out = []
    for (ns, name), (version, _, manifest) in sorted((await catalog(ops)).items()):
        if not _triggers_on(manifest, event.type):
            continue
        try:
            definition = await registry.definition(ns, name, version)
        except Exception:  # noqa: BLE001, S112 - the orchestrator cannot load it either
            continue
        trigger = matching_trigger(definition, incoming)
        if trigger is None:
            continue
        try:
            inputs = trigger_inputs(trigger, incoming)
        except ExpressionError:
            continue  # dead-lettered as bad-trigger-input: no run
        if resolve_inputs(registry.link(definition), inputs)[1]:
            continue  # dead-lettered as invalid-inputs: no run
        run_id = derive_run_id(definition, event.source, event.id)
        out.append(
            StartedRun(
                run_id=run_id,
                workflow=definition.name,
                namespace=definition.namespace,
                version=version,
                existed=await ops.log.last_seq(run_id) > 0,
            )
        )
    return out


def _triggers_on(manifest: Mapping[str, Any], event_type: str) -> bool:
    spec = manifest.get("spec")
    triggers = spec.get("triggers") if isinstance(spec, Mapping) else None
    if not isinstance(triggers, list):
        return False
    return any(isinstance(t, Mapping) and t.get("event") == event_type for t in triggers)


async def emit(ops: InterlockClient, ce: CloudEvent, wait: float) -> EmitResult:
    """Publish ``ce`` and say which runs it starts, waiting up to ``wait`` seconds for
    the orchestrator to start them (see ``Client.emit``)."""
    check_event_type(ce.type)  # before anything is published or looked up
    run_id = ce.extensions.get("runid")
    started: list[StartedRun] = []
    unknown: str | None = None
    if run_id:
        check_run_id(run_id)
    else:
        try:
            started = await refusable(ops.nc, would_start(ops, ce))
        except PermissionRefused as exc:
            # A publisher may publish its events and read nothing: the event still goes.
            unknown = (
                f"this credential may not read the workflows ({exc.operation} to {exc.subject})"
            )
        except (NoRespondersError, NatsTimeout, APIError) as exc:
            unknown = f"the workflows could not be read ({exc.__class__.__name__}: {exc})"
    ack_seq, duplicate = await publish(ops, ce)
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
        seq=ack_seq,
        duplicate=duplicate,
        started=started,
        run_id=run_id,
        unknown=unknown,
    )
