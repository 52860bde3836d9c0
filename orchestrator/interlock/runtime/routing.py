"""What an inbound event starts, and the correlation keys it carries: the workflows'
trigger ``input`` templates and ``correlate.events`` expressions, evaluated over the event.

Such an evaluation costs little, except with a comprehension (up to its whole step budget)
or over an event of many values (turning them into CEL values costs in proportion): those
are evaluated on the thread kept for costly evaluations (``Runs.evaluate``), so one hostile
event does not hold up the runs the event loop serves meanwhile. Both are pure over the
event; where they run changes nothing they give.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from interlock.core.definition import Definition, TriggerDef, loops
from interlock.core.engine import Incoming, matching_trigger, trigger_inputs
from interlock.core.expr import Expression, ExpressionError, OverBudget
from interlock.core.incoming import event_correlation_key, heavy_value, not_a_json_object
from interlock.core.limits import MAX_KEY_LENGTH, key_text

T = TypeVar("T")


class Evaluator(Protocol):
    """Where costly evaluations run (``Runs.evaluate``)."""

    async def evaluate(self, work: Callable[[], T], lane: str = "") -> T: ...


@dataclass(frozen=True, slots=True)
class Start:
    """A run the event starts: its workflow, with the inputs its trigger gives, or the
    reason the trigger's ``input`` could not be rendered (no run starts)."""

    definition: Definition
    version: int
    inputs: dict[str, Any]
    error: str | None = None
    trigger: TriggerDef | None = None
    key: str = ""
    """The trigger's ``debounce``, ``batch`` or ``rate`` key for the event."""
    reason: str = "bad-trigger-input"
    """The dead letter's reason when ``error``."""


@dataclass(frozen=True, slots=True)
class Key:
    """The correlation key the event carries for a workflow (None: none), or why it was
    refused (its expression ran out of its step budget)."""

    definition: Definition
    key: str | None
    error: str | None = None


async def starts(
    triggered: Iterable[tuple[Definition, int]],
    incoming: Incoming,
    off_loop: Evaluator,
    lane: str = "",
) -> list[Start]:
    """The runs ``incoming`` starts among the workflows ``triggered`` by its type (costly
    renderings in the publisher's ``lane``)."""
    matched: list[tuple[Definition, int, TriggerDef]] = []
    for definition, version in triggered:
        trigger = matching_trigger(definition, incoming)
        if trigger is not None:
            matched.append((definition, version, trigger))

    def render() -> list[Start]:
        out = []
        for definition, version, trigger in matched:
            try:
                inputs = trigger_inputs(trigger, incoming)
            except ExpressionError as exc:
                out.append(Start(definition, version, {}, f"{definition.name}: {exc}"))
                continue
            key, problem = flow_key(trigger, incoming)
            if problem is not None:
                problem = f"{definition.name}: {problem}"
            out.append(Start(definition, version, inputs, problem, trigger, key, "bad-trigger-key"))
        return out

    templates: list[Any] = [t.input for _, _, t in matched if t.input is not None]
    templates += [k for _, _, t in matched if (k := _key_expression(t)) is not None]
    if templates and (heavy_value(incoming.data) or any(loops(t) for t in templates)):
        return await off_loop.evaluate(render, lane)
    return render()


async def correlation_keys(
    correlating: Iterable[tuple[Definition, int]],
    incoming: Incoming,
    off_loop: Evaluator,
    lane: str = "",
) -> list[Key]:
    """The key ``incoming`` carries for each workflow ``correlating`` events of its type
    (costly keys in the publisher's ``lane``)."""
    definitions = [definition for definition, _ in correlating]

    def evaluate() -> list[Key]:
        out = []
        for definition in definitions:
            try:
                out.append(Key(definition, event_correlation_key(definition, incoming)))
            except OverBudget as exc:
                out.append(Key(definition, None, f"{definition.name}: {exc}"))
        return out

    expressions = [
        d.correlation.events.get(incoming.type) for d in definitions if d.correlation is not None
    ]
    if expressions and (heavy_value(incoming.data) or any(loops(e) for e in expressions)):
        return await off_loop.evaluate(evaluate, lane)
    return evaluate()


def _key_expression(trigger: TriggerDef) -> Expression | None:
    if trigger.window is not None:
        return trigger.window.key
    return None if trigger.rate is None else trigger.rate.key


def flow_key(trigger: TriggerDef, incoming: Incoming) -> tuple[str, str | None]:
    """The key of the trigger's ``debounce``, ``batch`` or ``rate`` for ``incoming`` (""
    without one), or why it cannot be computed."""
    expression = _key_expression(trigger)
    if expression is None:
        return "", None
    try:
        key = key_text(expression.evaluate({"event": incoming.to_dict(), "data": incoming.data}))
    except ExpressionError as exc:
        if "data" in expression.names and isinstance(incoming.data, bytes | str | None):
            # JSON sent without saying so (curl -d): no `data.<field>` reads bytes or text.
            reads = not_a_json_object(incoming.data)
            return "", f"the key of trigger {trigger.name} reads {reads}"
        return "", f"the key of trigger {trigger.name} cannot be computed: {exc}"
    if len(key) > MAX_KEY_LENGTH:
        return "", (
            f"the key of trigger {trigger.name} is {len(key)} characters long "
            f"(at most {MAX_KEY_LENGTH})"
        )
    return key, None
