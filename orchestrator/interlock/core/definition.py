"""The compiled form of a workflow: immutable, with every CEL expression compiled once.

Every dialect compiles to these classes; the engine reads nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from interlock.core.expr import CompiledValue, Expression, Literal
from interlock.core.inputtypes import json_type
from interlock.core.inputtypes import known_type as known_type
from interlock.core.inputtypes import type_matches as type_matches
from interlock.core.limitdef import CapacityDef, LimitDef, TriggerRateDef, WindowDef
from interlock.core.vocabulary import StepStatus

NORMAL = "normal"
TERMINAL = "terminal"
HUMAN = "human_in_the_loop"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 1
    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 60.0
    jitter: bool = True
    errors: tuple[str, ...] = ()
    """Error classes retried too, though not retryable (``*``: any failure)."""


NO_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class ActionDef:
    capability: str
    input: CompiledValue
    timeout_s: float | None = None
    output: tuple[tuple[str, str], ...] = ()
    """(result key, context key) pairs written when the action completes."""
    retry: RetryPolicy | None = None
    """None: the capability's default (its AgentDef's max_retries), else no retries."""
    workflow: str | None = None
    """A sub-workflow to run as a child run instead of a capability."""
    priority: Expression | None = None
    """Its place in its capability's lines (CEL over the run's values): highest first."""
    limits: tuple[CapacityDef, ...] = ()
    """Its capability's limits (linked from the AgentDef, like the timeout)."""


@dataclass(frozen=True, slots=True)
class CatchDef:
    errors: frozenset[str]
    goto: str
    set: tuple[tuple[str, CompiledValue], ...] = ()
    codes: frozenset[str] = frozenset()
    """When set, the failure's code must be one of these too."""
    budget: tuple[str, ...] = ()
    """The edge budgets it counts against."""

    def matches(self, error_class: str, code: str = "") -> bool:
        if self.codes and code not in self.codes:
            return False
        return "*" in self.errors or error_class in self.errors


@dataclass(frozen=True, slots=True)
class TimeoutDef:
    after_s: float
    goto: str
    set: tuple[tuple[str, CompiledValue], ...] = ()


@dataclass(frozen=True, slots=True)
class MapDef:
    """A map over a CEL list, or (``branches`` set) a parallel state (an item a branch)."""

    over: Expression | None
    item: str
    action: ActionDef
    parallelism: int = 8
    completion: str = "all"
    branches: tuple[ActionDef, ...] = ()
    at_least: int = 0
    """For ``completion: at_least``: how many distinct producers must answer."""

    def action_for(self, item: int | None) -> ActionDef:
        """The action an item runs: its branch's in a parallel state, else the map's."""
        if self.branches and item is not None:
            return self.branches[item]
        return self.action


@dataclass(frozen=True, slots=True)
class DagEdge:
    """A step waits for ``step`` to end; it runs only if that step ended one of ``on``."""

    step: str
    on: frozenset[str] = frozenset({StepStatus.COMPLETED})


@dataclass(frozen=True, slots=True)
class GateDef:
    """Evidence a step needs: for ``subject``, each predicate's value (True: any)."""

    subject: str
    requires: tuple[tuple[str, str | bool], ...]

    def missing(self, evidence: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
        """The predicates the evidence does not prove (empty: the gate is open).
        Fail-closed: no evidence, another value or an empty one proves nothing (``true`` is
        proven by any value but null, false or an empty text, list or map)."""
        proofs = (evidence or {}).get(self.subject, {})
        out: list[str] = []
        for predicate, wanted in self.requires:
            value = proofs.get(predicate)
            if wanted is True:
                empty = isinstance(value, str | list | dict) and not value
                if value is None or value is False or empty:
                    out.append(predicate)
            elif value != wanted:
                out.append(predicate)
        return out


@dataclass(frozen=True, slots=True)
class StateGateDef:
    """Evidence the answer that completes a state must prove (when ``when`` holds): its
    ``evidence`` merged over what the run proved for ``subject`` must prove ``requires``."""

    gate: GateDef
    evidence: tuple[Expression, ...] = ()
    when: Expression | None = None


@dataclass(frozen=True, slots=True)
class DagStep:
    name: str
    action: ActionDef
    depends_on: tuple[DagEdge, ...] = ()
    gate: GateDef | None = None


@dataclass(frozen=True, slots=True)
class DagDef:
    """Steps that run once the steps they depend on ended as their edges ask, at most
    ``parallelism`` at once; ``steps`` in an order where each follows those it depends on."""

    steps: tuple[DagStep, ...]
    parallelism: int = 8
    completion: str = "all"

    def step(self, name: str) -> DagStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def handles_failure(self, name: str) -> bool:
        """Whether a step's failure is a branch the DAG takes: some step depends on it with
        an edge that a failure satisfies (so under ``completion: all`` it is not fatal)."""
        return any(
            edge.step == name and StepStatus.FAILED in edge.on
            for step in self.steps
            for edge in step.depends_on
        )


@dataclass(frozen=True, slots=True)
class LoopDef:
    until: Expression
    max_iterations: int
    action: ActionDef


@dataclass(frozen=True, slots=True)
class BudgetDef:
    max_transitions: int = 1000
    max_actions: int = 1000
    max_fan_out: int = 64
    max_cost: float | None = None
    """The most the run may spend, summed from the ``cost`` each answer reports."""
    edges: Mapping[str, int] = field(default_factory=dict)
    """Named edge budgets: how often the transitions naming one may fire, altogether."""
    max_spawn_depth: int | None = None
    """How deep below this run actions may be spawned (its own are at depth 1)."""
    max_total_spawns: int | None = None
    """Spawns (actions requested) this run and its child runs may make, altogether."""


@dataclass(frozen=True, slots=True)
class CorrelationDef:
    key: CompiledValue
    events: Mapping[str, Expression]


@dataclass(frozen=True, slots=True)
class ContinueDef:
    """A transition's ``continue_as_new``: ``goto`` is entered in a new run, whose inputs
    are the run's with these replaced."""

    inputs: tuple[tuple[str, CompiledValue], ...] = ()


@dataclass(frozen=True, slots=True)
class TransitionDef:
    index: int
    event: str
    goto: str
    guard: Expression | None = None
    set: tuple[tuple[str, CompiledValue], ...] = ()
    budget: tuple[str, ...] = ()
    """The edge budgets it counts against."""
    renew: ContinueDef | None = None
    """Set when the transition continues the run as new (``continue_as_new``)."""


@dataclass(frozen=True, slots=True)
class StateDef:
    name: str
    kind: str
    actions: tuple[ActionDef, ...] = ()
    transitions: tuple[TransitionDef, ...] = ()
    outputs: tuple[tuple[str, CompiledValue], ...] | None = None
    by_event: Mapping[str, tuple[TransitionDef, ...]] = field(default_factory=dict)
    catches: tuple[CatchDef, ...] = ()
    timeout: TimeoutDef | None = None
    map: MapDef | None = None
    loop: LoopDef | None = None
    fail: FailDef | None = None
    dag: DagDef | None = None
    gate: StateGateDef | None = None

    @property
    def produces_output(self) -> bool:
        return (
            bool(self.actions)
            or self.map is not None
            or self.loop is not None
            or self.dag is not None
        )

    @property
    def terminal(self) -> bool:
        return self.kind == TERMINAL

    def transitions_for(self, event_type: str) -> tuple[TransitionDef, ...]:
        """The transitions keyed by ``event_type``, in declaration order."""
        return self.by_event.get(event_type, ())


@dataclass(frozen=True, slots=True)
class DeadlineDef:
    """The run's deadline: ``after_s`` from its start (None: a run's own only), ``goto``."""

    after_s: float | None
    goto: str | None = None
    set: tuple[tuple[str, CompiledValue], ...] = ()


@dataclass(frozen=True, slots=True)
class HistoryDef:
    """``spec.history``: each field None where the workflow leaves it to the installation."""

    max_records: int | None = None
    max_bytes: int | None = None
    continue_as_new: str | None = None


@dataclass(frozen=True, slots=True)
class ArchiveDef:
    """Where a finished run's log goes before it is deleted: an Object Store ``bucket`` or
    a ``directory`` on the orchestrator's host (exactly one)."""

    bucket: str | None = None
    directory: str | None = None


@dataclass(frozen=True, slots=True)
class FailDef:
    """A terminal state's failure: the run ends ``failed`` with this class and message."""

    error_class: str
    message: CompiledValue


@dataclass(frozen=True, slots=True)
class TriggerDef:
    event: str
    filter: tuple[tuple[tuple[str, ...], Any], ...] = ()
    input: CompiledValue | None = None
    name: str = ""  # <namespace>/<workflow>#trigger<n>: its windows and rates are kept by it
    window: WindowDef | None = None  # its debounce or batch
    rate: TriggerRateDef | None = None


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
    budget: BudgetDef = BudgetDef()
    correlation: CorrelationDef | None = None
    deadline: DeadlineDef | None = None
    evidence_events: frozenset[str] = frozenset()
    """Event types the run records as evidence whenever they arrive."""
    retention_s: float | None = None
    """How long a finished run is kept (None: the installation's default)."""
    archive: ArchiveDef | None = None
    """Where a run's log goes before retention deletes it (None: the installation's)."""
    history: HistoryDef | None = None
    """How long a run's log may grow (None: as the installation says)."""
    concurrency: tuple[LimitDef, ...] = ()
    priority: Expression | None = None
    source: str = ""
    """The manifest as written (comments and all), when compiled from text."""

    def all_actions(self) -> list[ActionDef]:
        out: list[ActionDef] = []
        for state in self.states.values():
            out.extend(state.actions)
            if state.map is not None:
                out.extend(state.map.branches or (state.map.action,))
            if state.loop is not None:
                out.append(state.loop.action)
            if state.dag is not None:
                out.extend(step.action for step in state.dag.steps)
        return out

    def capabilities(self) -> frozenset[str]:
        return frozenset(a.capability for a in self.all_actions() if a.workflow is None)


@dataclass(frozen=True, slots=True)
class CapabilityDef:
    name: str
    input_schema: Mapping[str, Any] | None = None
    output_schema: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    description: str | None = None
    limits: tuple[CapacityDef, ...] = ()
    """Its concurrency limit, then its rate limit, where declared."""


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    name: str
    namespace: str
    api_version: str
    capabilities: Mapping[str, CapabilityDef]
    manifest: Mapping[str, Any] = field(default_factory=dict)


def link(definition: Definition, capabilities: Mapping[str, CapabilityDef]) -> Definition:
    """Fill each action's unset timeout and retry policy from its capability's AgentDef.

    Pure; the shell links a definition with the AgentDefs it knows when it loads it. What a
    run actually used is recorded in each ``action.requested`` record."""

    def linked(action: ActionDef) -> ActionDef:
        cap = capabilities.get(action.capability)
        if cap is None or action.workflow is not None:
            return action
        timeout = action.timeout_s if action.timeout_s is not None else cap.timeout_s
        retry = action.retry
        if retry is None and cap.max_retries:
            retry = RetryPolicy(max_attempts=cap.max_retries + 1)
        return replace(action, timeout_s=timeout, retry=retry, limits=cap.limits)

    states = {}
    for name, state in definition.states.items():
        states[name] = replace(
            state,
            actions=tuple(linked(a) for a in state.actions),
            map=None
            if state.map is None
            else replace(
                state.map,
                action=linked(state.map.action),
                branches=tuple(linked(b) for b in state.map.branches),
            ),
            loop=None
            if state.loop is None
            else replace(state.loop, action=linked(state.loop.action)),
            dag=None
            if state.dag is None
            else replace(
                state.dag,
                steps=tuple(replace(s, action=linked(s.action)) for s in state.dag.steps),
            ),
        )
    return replace(definition, states=states)


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
                f"input {spec.name!r} must be {spec.type}, got {json_type(given[spec.name])}"
            )
    return resolved, problems


def may_loop(definition: Definition) -> bool:
    """Whether any expression of ``definition`` has a comprehension, the one construct
    whose cost grows with the values it meets (bounded by each evaluation's step budget,
    which still makes it the slow kind): the shell evaluates such a workflow's decisions
    away from the loop that serves every other run."""
    return loops(definition)


def loops(value: Any) -> bool:
    """Whether an expression in ``value`` (a definition, a trigger's ``input``, one
    expression...) has a comprehension."""
    return any(e.loops for e in _expressions(value))


def _expressions(value: Any) -> Iterator[Expression]:
    if isinstance(value, Expression):
        yield value
    elif isinstance(value, Literal | str | int | float | bool) or value is None:
        return
    elif isinstance(value, Definition):
        for name in ("states", "triggers", "correlation", "deadline"):
            yield from _expressions(getattr(value, name))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _expressions(getattr(value, f.name))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _expressions(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _expressions(item)
