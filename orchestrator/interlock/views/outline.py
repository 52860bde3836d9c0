"""A workflow's outline: what readers show of a compiled workflow, without compiling it.

``interlock describe run`` and ``interlock get workflow`` need a workflow's states and their
kinds, its transitions (event, guard text, target), its inputs, triggers and correlated
events; not its compiled CEL programs or JSON Schemas. Compiling a stored manifest again to
learn them loads the compiler, the expression language and jsonschema, which costs more
than everything else such a command does. So the registry stores this outline beside each
version's manifest when the workflow is applied (computed here from the definition the
apply compiled anyway), and readers decode it. A version stored before outlines were (no
``outline`` key) is compiled once to compute it, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from interlock.views.shapes import TransitionView

if TYPE_CHECKING:
    from interlock.core.definition import Definition, StateDef


class WorkflowOutline(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of a compiled workflow that readers show (stored under ``outline`` in
    the value of ``wf.<namespace>.<name>.<version>`` in the workflows bucket)."""

    initial_state: str = ""
    description: str | None = None
    """``spec.description``, else ``metadata.description``."""
    triggers: list[str] = []
    """The event types that start a run, sorted."""
    inputs: dict[str, Any] = {}
    """Each declared input: ``type``, ``required`` and its ``default`` when it has one."""
    kinds: dict[str, str] = {}
    """Each state (in the manifest's order) and its kind."""
    transitions: list[TransitionView] = []
    """Every edge of the state machine (see :func:`transitions_of`)."""
    correlated: list[str] = []
    """The event types that reach a run by its correlation key."""
    asks: dict[str, list[str]] | None = None
    """Each state that asks for work and what it asks: capabilities, and child workflows
    as ``workflow:<name>`` (None: stored before outlines had it; compiled again)."""
    timeouts: dict[str, str] = {}
    """Each state with a timeout and where it goes."""


def outline_of(definition: Definition) -> WorkflowOutline:
    """The outline of a compiled workflow."""
    inputs = {
        i.name: {
            "type": i.type,
            "required": i.required,
            **({"default": i.default} if i.has_default else {}),
        }
        for i in definition.inputs
    }
    return WorkflowOutline(
        initial_state=definition.initial_state,
        description=description_of(definition),
        triggers=sorted({t.event for t in definition.triggers}),
        inputs=inputs,
        kinds={name: state.kind for name, state in definition.states.items()},
        transitions=transitions_of(definition),
        correlated=sorted(definition.correlation.events) if definition.correlation else [],
        asks={name: asked for name, state in definition.states.items() if (asked := _asks(state))},
        timeouts={
            name: state.timeout.goto
            for name, state in definition.states.items()
            if state.timeout is not None
        },
    )


def _asks(state: StateDef) -> list[str]:
    """What a state asks for: its actions', map items', loop's or DAG steps' capabilities
    (``workflow:<name>`` for a child workflow), each once, in order."""
    actions = list(state.actions)
    if state.map is not None:
        actions += [state.map.action, *state.map.branches]
    if state.loop is not None:
        actions.append(state.loop.action)
    if state.dag is not None:
        actions += [step.action for step in state.dag.steps]
    names = [f"workflow:{a.workflow}" if a.workflow else a.capability for a in actions]
    return list(dict.fromkeys(n for n in names if n))


def transitions_of(definition: Definition) -> list[TransitionView]:
    """Every edge of the state machine, state by state in the manifest's order: a state's
    ``on`` entries in their order, then its catches, then its timeout."""
    out: list[TransitionView] = []
    for name, state in definition.states.items():
        for t in state.transitions:
            guard = t.guard.source if t.guard is not None else None
            out.append(
                TransitionView(
                    from_state=name,
                    to_state=t.goto,
                    kind="on",
                    event=t.event,
                    guard=guard,
                    index=t.index,
                )
            )
        for c in state.catches:
            out.append(
                TransitionView(
                    from_state=name, to_state=c.goto, kind="catch", event=",".join(sorted(c.errors))
                )
            )
        if state.timeout is not None:
            out.append(TransitionView(from_state=name, to_state=state.timeout.goto, kind="timeout"))
    return out


def description_of(definition: Definition) -> str | None:
    """``spec.description``, else ``metadata.description``."""
    if definition.description:
        return definition.description
    metadata = definition.manifest.get("metadata")
    found = metadata.get("description") if isinstance(metadata, Mapping) else None
    return found if isinstance(found, str) else None


def encode_outline(outline: WorkflowOutline) -> dict[str, Any]:
    """The outline as plain JSON data, to store."""
    data: dict[str, Any] = msgspec.to_builtins(outline)
    return data


def decode_outline(data: Any) -> WorkflowOutline | None:
    """A stored outline, or None when there is none (or it is not one: compile instead)."""
    if not isinstance(data, Mapping):
        return None
    try:
        return msgspec.convert(data, WorkflowOutline)
    except msgspec.ValidationError:
        return None
