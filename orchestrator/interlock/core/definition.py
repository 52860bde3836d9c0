"""The compiled form of a workflow: immutable, with every CEL expression compiled once.

Every dialect compiles to these classes; the engine reads nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.expr import CompiledValue, Expression

NORMAL = "normal"
TERMINAL = "terminal"
HUMAN = "human_in_the_loop"


@dataclass(frozen=True, slots=True)
class ActionDef:
    capability: str
    input: CompiledValue
    timeout_s: float | None = None
    output: tuple[tuple[str, str], ...] = ()
    """(result key, context key) pairs written when the action completes."""


@dataclass(frozen=True, slots=True)
class TransitionDef:
    index: int
    event: str
    goto: str
    guard: Expression | None = None
    set: tuple[tuple[str, CompiledValue], ...] = ()


@dataclass(frozen=True, slots=True)
class StateDef:
    name: str
    kind: str
    actions: tuple[ActionDef, ...] = ()
    transitions: tuple[TransitionDef, ...] = ()
    outputs: tuple[tuple[str, CompiledValue], ...] | None = None
    by_event: Mapping[str, tuple[TransitionDef, ...]] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.kind == TERMINAL

    def transitions_for(self, event_type: str) -> tuple[TransitionDef, ...]:
        """The transitions keyed by ``event_type``, in declaration order."""
        return self.by_event.get(event_type, ())


@dataclass(frozen=True, slots=True)
class TriggerDef:
    event: str
    filter: tuple[tuple[tuple[str, ...], Any], ...] = ()
    input: CompiledValue | None = None


@dataclass(frozen=True, slots=True)
class InputDef:
    name: str
    type: str = "any"
    required: bool = False
    default: Any = None
    has_default: bool = False


@dataclass(frozen=True, slots=True)
class Definition:
    """A workflow, compiled."""

    name: str
    namespace: str
    api_version: str
    spec_hash: str
    initial_state: str
    states: Mapping[str, StateDef]
    triggers: tuple[TriggerDef, ...] = ()
    inputs: tuple[InputDef, ...] = ()
    context: Mapping[str, Any] = field(default_factory=dict)
    version_label: str | None = None
    description: str | None = None
    manifest: Mapping[str, Any] = field(default_factory=dict)
    """The source document (JSON-like), kept so the definition can be stored and rebuilt."""

    def capabilities(self) -> frozenset[str]:
        return frozenset(a.capability for s in self.states.values() for a in s.actions)


@dataclass(frozen=True, slots=True)
class CapabilityDef:
    name: str
    input_schema: Mapping[str, Any] | None = None
    output_schema: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    name: str
    namespace: str
    api_version: str
    capabilities: Mapping[str, CapabilityDef]
    manifest: Mapping[str, Any] = field(default_factory=dict)


# --- typed inputs ----------------------------------------------------------------------

_SCALARS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "int": (int,),
    "number": (int, float),
    "float": (int, float),
    "boolean": (bool,),
    "bool": (bool,),
    "object": (dict,),
    "map": (dict,),
    "list": (list,),
    "any": (object,),
}
_LIST = re.compile(r"^list\[(.+)\]$")


def known_type(type_name: str) -> bool:
    """Whether an input type is one the language knows."""
    inner = _LIST.match(type_name)
    if inner:
        return known_type(inner.group(1).strip())
    return type_name in _SCALARS


def type_matches(type_name: str, value: Any) -> bool:
    """Whether ``value`` is of the declared input type (``list[string]`` checks items)."""
    inner = _LIST.match(type_name)
    if inner:
        return isinstance(value, list) and all(
            type_matches(inner.group(1).strip(), v) for v in value
        )
    allowed = _SCALARS.get(type_name, (object,))
    if bool not in allowed and isinstance(value, bool) and type_name != "any":
        return False  # true is not an integer here, whatever Python says
    return isinstance(value, allowed)


def resolve_inputs(
    definition: Definition, given: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Apply defaults and check types; returns (inputs, problems). Pure."""
    problems: list[str] = []
    resolved: dict[str, Any] = dict(given)
    for spec in definition.inputs:
        if spec.name not in given:
            if spec.required:
                problems.append(f"input {spec.name!r} is required ({spec.type})")
            elif spec.has_default:
                resolved[spec.name] = spec.default
            continue
        if not type_matches(spec.type, given[spec.name]):
            problems.append(
                f"input {spec.name!r} must be {spec.type}, got {_json_type(given[spec.name])}"
            )
    return resolved, problems


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
