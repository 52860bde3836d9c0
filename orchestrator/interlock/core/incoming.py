"""What arrives at a run from outside, and what it starts: the incoming CloudEvent, the
triggers that start runs, the run id a trigger derives, and correlation keys. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from interlock.core.definition import Definition, TriggerDef
from interlock.core.expr import ExpressionError, OverBudget, expressions, render

TIMER_FIRED = "io.interlock.timer.fired"
"""The type of the incoming event that tells a run one of its timers is due (extension
``timerid``)."""
SPAWNS_EXTENSION = "spawns"
"""The extension of a child run's end (its parent's answer): the spawns it made under the
allowance it was handed."""


_ATTRIBUTES = frozenset({"specversion", "id", "source", "type", "subject", "time", "data"})


class Incoming(msgspec.Struct, frozen=True, kw_only=True):
    """A CloudEvent arriving at a run: an agent's answer or an external event.

    An agent's answer carries the ``actionid`` extension of the request it answers.
    """

    type: str
    source: str
    id: str
    data: Any = None
    time: str | None = None
    subject: str | None = None
    extensions: dict[str, str] = {}

    @classmethod
    def from_dict(cls, copy: Mapping[str, Any]) -> Incoming:
        """The event a structured-mode copy holds (an ``event.received`` record's, a run's
        trigger): what :meth:`to_dict` wrote, read back."""
        return cls(
            type=str(copy.get("type", "")),
            source=str(copy.get("source", "")),
            id=str(copy.get("id", "")),
            data=copy.get("data"),
            time=copy.get("time"),
            subject=copy.get("subject"),
            extensions={k: str(v) for k, v in copy.items() if k not in _ATTRIBUTES},
        )

    def to_dict(self) -> dict[str, Any]:
        """The structured-mode CloudEvent, as recorded in the log."""
        out: dict[str, Any] = {"specversion": "1.0", "id": self.id, "source": self.source}
        out["type"] = self.type
        if self.subject is not None:
            out["subject"] = self.subject
        if self.time is not None:
            out["time"] = self.time
        out.update(self.extensions)
        out["data"] = self.data
        return out


HEAVY_VALUES = 2_000
"""Values (items of lists and objects, counted through every level) from which an event or
an input is heavy: turning them into CEL values costs in proportion to their number (an
event of 256 KB, the most an external event may take, converts in about a second on a busy
machine), so an evaluation over a heavy value is done away from the orchestrator's event
loop (see ``Runs.evaluate``)."""


def heavy_value(value: Any, limit: int = HEAVY_VALUES) -> bool:
    """Whether ``value`` holds at least ``limit`` values; stops counting there, so asking
    costs at most ``limit`` steps."""
    left = limit
    pending = [value]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict | list):
            continue
        left -= len(node)
        if left <= 0:
            return True
        pending.extend(node.values() if isinstance(node, dict) else node)
    return False


def derive_run_id(definition: Definition, source: str, event_id: str) -> str:
    """The run a trigger event starts: the same event never starts a second run."""
    key = f"{definition.namespace}/{definition.name}\n{source}\n{event_id}"
    return "r" + hashlib.sha256(key.encode()).hexdigest()[:24]


# --- triggers -------------------------------------------------------------------------


def _lookup(event: Incoming, path: tuple[str, ...]) -> tuple[bool, Any]:
    if path[0].startswith("$"):
        # $source, $subject, $type, $id or an extension ($runid...): CloudEvent attributes.
        name = path[0][1:]
        attrs = event.to_dict()
        if name == "data" or name not in attrs:
            return False, None
        node: Any = attrs[name]
        rest = path[1:]
    else:
        node, rest = event.data, path
    for key in rest:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _filter_matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, list) and not isinstance(actual, list):
        return any(_filter_matches(e, actual) for e in expected)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    return bool(expected == actual)


def trigger_matches(trigger: TriggerDef, event: Incoming) -> bool:
    """The event's type is the trigger's and every filter entry matches."""
    if trigger.event != event.type:
        return False
    for path, expected in trigger.filter:
        found, actual = _lookup(event, path)
        if not found or not _filter_matches(expected, actual):
            return False
    return True


def matching_trigger(definition: Definition, event: Incoming) -> TriggerDef | None:
    """The first of the workflow's triggers the event fires, if any."""
    for trigger in definition.triggers:
        if trigger_matches(trigger, event):
            return trigger
    return None


def trigger_inputs(trigger: TriggerDef, event: Incoming) -> dict[str, Any]:
    """Run inputs from a trigger event: its ``input`` mapping, else the event's data."""
    if trigger.input is not None:
        try:
            rendered = render(trigger.input, {"event": event.to_dict(), "data": event.data})
        except ExpressionError as exc:
            reads_data = any("data" in e.names for e in expressions(trigger.input))
            if not reads_data or not isinstance(event.data, bytes | str | None):
                raise
            # Most often JSON sent without saying so (curl -d sends a form's content type):
            # the data is then bytes or text, which no `data.<field>` can read.
            raise ExpressionError(f"its input reads {not_a_json_object(event.data)}") from exc
        return rendered if isinstance(rendered, dict) else {}
    return dict(event.data) if isinstance(event.data, dict) else {}


def not_a_json_object(data: bytes | str | None) -> str:
    """Why an expression reading ``data.<field>`` cannot read this event's data, and what
    to send instead, for the publisher."""
    return (
        f"the event's data, which is {_kind(data)}, not a JSON object: send the event's "
        "data as JSON (datacontenttype, over HTTP Content-Type, application/json)"
    )


def _kind(data: bytes | str | None) -> str:
    """What an event's data that is no JSON value of its own is, for a person."""
    if data is None:
        return "empty"
    if isinstance(data, bytes):
        return f"{len(data)} bytes of a content type that is not JSON"
    return "text"


def correlation_key(definition: Definition, inputs: Mapping[str, Any]) -> str | None:
    """The key a run of ``definition`` with ``inputs`` is correlated by (None: none)."""
    if definition.correlation is None:
        return None
    try:
        value = render(definition.correlation.key, {"inputs": dict(inputs)})
    except ExpressionError:
        return None
    return None if value is None else str(value)


def event_correlation_key(definition: Definition, event: Incoming) -> str | None:
    """The correlation key an event carries for ``definition`` (None: it carries none).

    Raises:
        OverBudget: the key's expression ran out of its step budget on this event (a key
            that is missing or of the wrong type is no key; this one is refused).
    """
    if definition.correlation is None:
        return None
    expression = definition.correlation.events.get(event.type)
    if expression is None:
        return None
    try:
        value = expression.evaluate({"event": event.to_dict(), "data": event.data})
    except OverBudget:
        raise
    except ExpressionError:
        return None
    return None if value is None else str(value)
