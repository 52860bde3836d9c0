"""The runs a trigger event starts: their first records decided (while the ingress waits
for its registry check), then appended, or the event put into its trigger's window
(``debounce``, ``batch``: :mod:`windows`); refusals dead-lettered with their reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core.bounds import max_event_bytes
from interlock.core.engine import Incoming, derive_run_id
from interlock.runtime.errors import InvalidInputs
from interlock.runtime.pausing import Pauses
from interlock.runtime.registry import Registry
from interlock.runtime.routing import Start
from interlock.runtime.runs import Opening, Runs
from interlock.runtime.timers import Timers
from interlock.runtime.windows import Windows
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects

DeadLetter = Callable[[Msg, str, str], Awaitable[None]]
"""Dead-letter a message with a reason and a detail (the consumer's handling)."""


class TriggerStarts:
    """Starts the runs of trigger events, for the ingress."""

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
        dead_letter: DeadLetter,
    ) -> None:
        self._nc = nc
        self._runs = runs
        self._pauses = pauses
        self._counters = counters
        self._dead_letter = dead_letter
        self.windows = Windows(
            nc,
            subjects,
            runs=runs,
            registry=registry,
            timers=timers,
            pauses=pauses,
            clock=clock,
            counters=counters,
        )

    async def openings(
        self, found: list[Start], event: CloudEvent, incoming: Incoming
    ) -> list[Opening | InvalidInputs | None]:
        """The first records of each run ``found`` starts (None where its trigger's input
        could not be rendered, or a batch's run, whose inputs are its events; the inputs'
        problems where they do not fit the workflow)."""
        out: list[Opening | InvalidInputs | None] = []
        for start in found:
            window = None if start.trigger is None else start.trigger.window
            if start.error is not None or (window is not None and window.kind == "batch"):
                out.append(None)
                continue
            definition = start.definition
            try:
                out.append(
                    await self._runs.opening(
                        definition,
                        start.version,
                        derive_run_id(definition, event.source, event.id),
                        start.inputs,
                        trigger=incoming,
                        traceparent=event.extensions.get("traceparent"),
                        paused=self._pauses.holds(definition.namespace, definition.name),
                    )
                )
            except InvalidInputs as exc:
                out.append(exc)
        return out

    async def start(
        self,
        msg: Msg,
        incoming: Incoming,
        found: list[Start],
        openings: list[Opening | InvalidInputs | None],
    ) -> int:
        """Start (or window) what ``found`` says; how many of them took the event."""
        started = 0
        for start, opening in zip(found, openings, strict=True):
            if start.error is not None:
                await self._dead_letter(msg, start.reason, start.error)
                continue
            if isinstance(opening, InvalidInputs):
                await self._dead_letter(msg, "invalid-inputs", str(opening))
                continue
            started += 1
            if start.trigger is not None and start.trigger.window is not None:
                await self.windows.take(
                    start.definition,
                    start.version,
                    start.trigger,
                    start.key,
                    incoming,
                    start.inputs,
                    room=max_event_bytes(self._nc.max_payload),
                )
                continue
            assert opening is not None
            created, _ = await self._runs.open(opening)
            self._counters["runs_started" if created else "triggers_duplicate"] += 1
        return started
