"""The runs a trigger event starts: their first records decided (while the ingress waits
for its registry check), then appended, or the event put into its trigger's window
(``debounce``, ``batch``: :mod:`windows`); refusals dead-lettered with their reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.core.bounds import max_event_bytes
from interlock.core.definition import TriggerDef
from interlock.core.engine import Incoming, derive_run_id
from interlock.core.windowing import TOO_LARGE
from interlock.runtime.errors import InvalidInputs
from interlock.runtime.pausing import Pauses
from interlock.runtime.rates import Rates, dropped
from interlock.runtime.registry import Registry
from interlock.runtime.routing import Start
from interlock.runtime.runs import Opening, Runs
from interlock.runtime.timers import Timers
from interlock.runtime.windows import Windows
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from interlock.transport.tracing import trace_context

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
        observe: Callable[[str, str], None] = lambda what, detail: None,
    ) -> None:
        self._nc = nc
        self._runs = runs
        self._pauses = pauses
        self._counters = counters
        self._dead_letter = dead_letter
        self.rates = Rates(nc, subjects, clock=clock, observe=observe)
        self.windows = Windows(
            nc,
            subjects,
            runs=runs,
            registry=registry,
            timers=timers,
            pauses=pauses,
            clock=clock,
            counters=counters,
            observe=observe,
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
            if start.error is None and window is not None and window.kind == "batch":
                out.append(batch_item_refused(start, incoming))
                continue
            if start.error is not None:
                out.append(None)
                continue
            try:
                out.append(await self._opening(start, incoming))
            except InvalidInputs as exc:
                out.append(exc)
        return out

    async def _opening(
        self, start: Start, incoming: Incoming, rate: ev.RateHold | None = None
    ) -> Opening:
        definition = start.definition
        return await self._runs.opening(
            definition,
            start.version,
            derive_run_id(definition, incoming.source, incoming.id),
            start.inputs,
            trigger=incoming,
            traceparent=trace_context(incoming.extensions.get("traceparent")),
            paused=self._pauses.holds(definition.namespace, definition.name),
            rate=rate,
        )

    async def start(
        self,
        msg: Msg,
        incoming: Incoming,
        found: list[Start],
        openings: list[Opening | InvalidInputs | None],
    ) -> int:
        """Start (or window, or hold to its rate) what ``found`` says; how many of them
        took the event."""
        started = 0
        for start, opening in zip(found, openings, strict=True):
            if start.error is not None:
                await self._dead_letter(msg, start.reason, start.error)
                continue
            if isinstance(opening, InvalidInputs):
                await self._dead_letter(msg, "invalid-inputs", str(opening))
                continue
            trigger = start.trigger
            if trigger is not None and trigger.window is not None:
                how = await self.windows.take(
                    start.definition,
                    start.version,
                    trigger,
                    start.key,
                    incoming,
                    start.inputs,
                    room=max_event_bytes(self._nc.max_payload),
                )
                if how == TOO_LARGE:
                    await self._dead_letter(msg, TOO_LARGE, too_large(trigger, self._nc))
                    continue
                started += 1
                continue
            if trigger is not None and trigger.rate is not None:
                opening = await self._rated(msg, start, incoming, opening)
                if opening is None:
                    continue
            assert opening is not None
            started += 1
            created, _ = await self._runs.open(opening)
            self._counters["runs_started" if created else "triggers_duplicate"] += 1
        return started

    async def _rated(
        self, msg: Msg, start: Start, incoming: Incoming, opening: Opening | None
    ) -> Opening | None:
        """The opening of a run of a trigger with a ``rate``: as decided when it may start
        now, one that waits its turn when later, None (dead-lettered) when dropped."""
        trigger = start.trigger
        assert trigger is not None
        rate = trigger.rate
        assert rate is not None
        given = await self.rates.give(trigger, start.key)
        if given.dropped:
            await self._dead_letter(msg, "rate-limited", dropped(trigger, start.key))
            return None
        if given.at is None:
            return opening
        hold = ev.RateHold(
            trigger=trigger.name, key=start.key, until=given.at, limit=rate.limit, per_s=rate.per_s
        )
        return await self._opening(start, incoming, hold)


def batch_item_refused(start: Start, incoming: Incoming) -> InvalidInputs | None:
    """Why the event, as the one item of a batch, breaks its workflow's inputs (a batch's
    run takes ``{"events": [...]}``): refused now, not when its window closes."""
    from interlock.core.definition import resolve_inputs

    trigger = start.trigger
    assert trigger is not None
    item = start.inputs if trigger.input is not None else incoming.to_dict()
    definition = start.definition
    _, problems = resolve_inputs(definition, {"events": [item]})
    if not problems:
        return None
    return InvalidInputs(f"{definition.namespace}/{definition.name}", problems)


def too_large(trigger: TriggerDef, nc: Client) -> str:
    """Why an event is refused by its trigger's window (:data:`TOO_LARGE`)."""
    return (
        f"the event (its copy, its id and what {trigger.name} renders from it) takes more "
        f"than a window of its key may hold: half of the server's payload limit "
        f"({nc.max_payload:,} bytes) less the window's references"
    )
