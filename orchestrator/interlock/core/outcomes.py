"""The rule ``gate-outcome-impossible``: a transition taken on an answer that the state's
capability can never give. Pure.

A capability whose AgentDef output schema fixes a field to a few values (``enum`` or
``const``: a gate that answers ``passed`` or ``implementation-failure``) can never answer
another; a ``task.completed`` transition whose guard asks ``result.<field> == "<value>"``
for another value could never fire, and a run would wait there for an answer that never
comes. The guard's plain comparisons are read (``result.f == "v"``, ``"v" == result.f``);
what a more involved expression computes is not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from interlock.core import model
from interlock.core.rules import Report

_FIELD = r"result\.([A-Za-z_][A-Za-z0-9_]*)"
_TEXT = r'("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')'
_COMPARISONS = (
    re.compile(_FIELD + r"\s*==\s*" + _TEXT),
    re.compile(_TEXT + r"\s*==\s*" + _FIELD),
)


def _comparisons(guard: str) -> Iterator[tuple[str, str]]:
    """Each ``(field, value)`` a guard compares ``result.<field>`` with, as a string."""
    for pattern in _COMPARISONS:
        for match in pattern.finditer(guard):
            first, second = match.groups()
            field, text = (first, second) if pattern is _COMPARISONS[0] else (second, first)
            if text.startswith("'"):
                text = '"' + text[1:-1].replace('"', '\\"') + '"'
            try:
                value = json.loads(text)
            except ValueError:
                continue
            yield field, value


def _allowed(schema: Mapping[str, Any], field: str) -> list[Any] | None:
    """The values an output schema lets ``field`` take (None: any)."""
    properties = schema.get("properties")
    prop = properties.get(field) if isinstance(properties, Mapping) else None
    if not isinstance(prop, Mapping):
        return None
    if "const" in prop:
        return [prop["const"]]
    enum = prop.get("enum")
    return list(enum) if isinstance(enum, list) else None


def check_outcomes(
    spec: model.WorkflowSpec, outputs: Mapping[str, Mapping[str, Any]], error: Report
) -> None:
    """Refuse each ``task.completed`` transition of a state with actions whose guard asks
    for a value the last action's capability never answers (``gate-outcome-impossible``)."""
    for name, state in spec.states.items():
        if not state.actions or state.actions[-1].capability is None:
            continue
        capability = state.actions[-1].capability
        schema = outputs.get(capability)
        if not schema:
            continue
        for i, transition in enumerate(state.on):
            if transition.event != "task.completed" or transition.guard is None:
                continue
            for field, value in _comparisons(transition.guard):
                allowed = _allowed(schema, field)
                if allowed is not None and value not in allowed:
                    error(
                        ("spec", "states", name, "on", i, "guard"),
                        "gate-outcome-impossible",
                        f"transition {i} of state {name!r} waits for result.{field} == "
                        f"{json.dumps(value)}, which capability {capability!r} never answers "
                        f"(its output schema allows {', '.join(json.dumps(v) for v in allowed)})",
                    )
