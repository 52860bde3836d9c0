"""The ingress consumer's events: CloudEvents on ``<prefix>.events.>``.

An event starts the runs its type triggers, reaches the run its ``runid`` extension names,
or the runs waiting for it by correlation; one too large, invalid or refused by its subject
goes to the dead-letter stream. Each batch fetched first sends a check that the registry
knows every workflow applied before its events were published (:meth:`Ingress.check_registry`),
and a start waits for its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core.bounds import max_event_bytes
from interlock.core.definition import Definition
from interlock.core.incoming import Incoming
from interlock.core.objects import ObjectError
from interlock.runtime.addressing import Refused, admit
from interlock.runtime.fairness import PUBLISHER_BUDGET, publisher_lane
from interlock.runtime.flow import ControlFlow, Deliver, to_incoming
from interlock.runtime.handling import MessageHandling
from interlock.runtime.observe import Observers
from interlock.runtime.payloads import Payloads
from interlock.runtime.registry import Registry
from interlock.runtime.routing import starts
from interlock.runtime.runs import Runs
from interlock.runtime.triggering import TriggerStarts
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent, decode_message
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")


class Ingress:
    """The handler of the ingress consumer's events, with the registry checks still out."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        runs: Runs,
        registry: Registry,
        handling: MessageHandling,
        payloads: Payloads,
        flow: ControlFlow,
        starting: TriggerStarts,
        deliver: Deliver,
        counters: Counter[str],
        observers: Observers,
    ) -> None:
        self._nc, self._subjects, self._runs, self._registry = nc, subjects, runs, registry
        self._handling, self._payloads, self._flow = handling, payloads, flow
        self._starting, self._deliver = starting, deliver
        self._counters, self._observers = counters, observers
        self._registry_check: asyncio.Future[None] | None = None
        """The registry check of the batch last fetched (see check_registry)."""
        self.checks: set[asyncio.Future[None]] = set()
        """Every registry check still out (batches overlap): all are cancelled on stop."""

    async def stop(self) -> None:
        """Cancel every registry check still out (the consumer, stopped, starts no more)."""
        await cancel_and_wait(*self.checks)

    def check_registry(self) -> None:
        """Start making sure the registry knows every workflow applied before the events
        just fetched were published: its request goes out before their handlers run, and
        they are decoded and routed meanwhile; a start waits for its answer
        (:meth:`_registry_checked`)."""
        # A check still out for the batch before may have been answered before these
        # events were published: this batch gets its own (the one before's handlers that
        # have not looked yet wait for this one, which covers theirs too).
        check = self._registry.sync_soon()
        self.checks.add(check)
        check.add_done_callback(self._registry_check_ended)
        self._registry_check = check

    def _registry_check_ended(self, check: asyncio.Future[None]) -> None:
        self.checks.discard(check)
        if not check.cancelled() and (error := check.exception()) is not None:
            # Said once per check, however many events waited for it.
            log.warning("ingress: registry sync failed: %s", error)

    async def _registry_checked(self) -> None:
        """Wait for the registry check of the batch being handled (or a later one)."""
        check = self._registry_check
        if check is not None and not check.done():
            # Route with what is known rather than not at all (the failure is logged
            # where the check ends).
            with contextlib.suppress(Exception):
                await asyncio.shield(check)

    async def handle(self, msg: Msg) -> None:
        """Handle one event of the ingress consumer: start the runs it triggers, reach the
        run its ``runid`` names or the runs it correlates with, or dead-letter it."""
        lane = publisher_lane(self._subjects, msg.subject)
        if self._runs.lanes.pending(lane) >= PUBLISHER_BUDGET:
            # This publisher's costly evaluations fill its share of the thread: its event
            # waits in JetStream, not in hand, so the consumer goes on to others' events.
            raise self._runs.lanes.defer(lane)
        # An external event is copied into the logs of the runs it reaches: one larger
        # than a quarter of the server's payload limit could not be recorded.
        limit = max_event_bytes(self._nc.max_payload)
        if len(msg.data) > limit:
            await self._handling.dead_letter(
                msg,
                "too-large",
                f"the event takes {len(msg.data):,} bytes; events take at most {limit:,}",
            )
            return
        try:
            event = decode_message(msg.headers, msg.data)
        except InvalidCloudEvent as exc:
            await self._handling.dead_letter(msg, exc.reason, str(exc))
            return
        try:
            # What the event may reach is what its subject (whose publishers NATS checks)
            # allows: see interlock.runtime.addressing.
            event, run_id = admit(self._subjects, msg.subject, event)
        except Refused as exc:
            await self._handling.dead_letter(msg, exc.reason, exc.detail)
            return
        # Its data, if by reference, loaded only where it reaches something: a publisher's
        # event of a type nothing reads made the orchestrator read and hash the object it
        # named (up to 64 MiB) all the same (tests/security/test_object_event_flood.py).
        triggered = list(self._registry.triggered_by(event.type))
        incoming = to_incoming(event)
        if run_id or triggered or self._correlated(event.type):
            loaded = await self._loaded(msg, event)
            if loaded is None:
                return
            incoming = loaded
        self._counters["events_received"] += 1
        if run_id:
            delivered = await self._deliver(run_id, incoming)
            if not delivered:
                self._counters["events_unrouted"] += 1
                self._observers.unrouted(event.type)
            return
        # Routed, and the runs' first records decided, with what is known while the
        # registry check of this batch is out; done again in the rare case that it
        # brought in a workflow (or version) of this type.
        found = await starts(triggered, incoming, self._runs, lane)
        openings = await self._starting.openings(found, event, incoming)
        await self._registry_checked()
        now_triggered = list(self._registry.triggered_by(event.type))
        if incoming.data is event.data and (now_triggered or self._correlated(event.type)):
            loaded = await self._loaded(msg, event)  # a workflow of its type came in
            if loaded is None:
                return
            incoming = loaded
        if not _same(triggered, now_triggered):
            found = await starts(now_triggered, incoming, self._runs, lane)
            openings = await self._starting.openings(found, event, incoming)
        started = await self._starting.start(msg, incoming, found, openings)
        correlated, refused = await self._flow.route_correlated(event, incoming, lane)
        for reason in refused:
            await self._handling.dead_letter(msg, "bad-correlation-key", reason)
        if correlated:
            return
        if not started:
            self._counters["events_unrouted"] += 1
            self._observers.unrouted(event.type)

    def _correlated(self, event_type: str) -> bool:
        return any(True for _ in self._registry.correlating(event_type))

    async def _loaded(self, msg: Msg, event: CloudEvent) -> Incoming | None:
        """The event as the engine reads it, its data loaded when it is a reference;
        None, and the event dead-lettered, when that reference is refused."""
        try:
            return await self._payloads.incoming(to_incoming(event))
        except ObjectError as exc:
            await self._handling.dead_letter(msg, exc.reason, exc.detail)
            return None


def _same(a: list[tuple[Definition, int]], b: list[tuple[Definition, int]]) -> bool:
    """The same workflow versions (the very same definitions, not equal ones)."""
    return len(a) == len(b) and all(x is y and m == n for (x, m), (y, n) in zip(a, b, strict=True))
