"""Lowering: a structurally valid workflow document to its :class:`Definition`.

Each state, action, transition and trigger is checked against the rules that concern it
alone (names, durations, CEL, error classes, budgets) and compiled; the rules over the
whole workflow (reachability, references) are in :mod:`interlock.core.rules`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from interlock.core import model
from interlock.core.definition import (
    TERMINAL,
    ActionDef,
    BudgetDef,
    CatchDef,
    CorrelationDef,
    DeadlineDef,
    Definition,
    FailDef,
    InputDef,
    LoopDef,
    MapDef,
    RetryPolicy,
    StateDef,
    TimeoutDef,
    TransitionDef,
    TriggerDef,
    known_type,
    type_matches,
)
from interlock.core.diagnostics import Diagnostic
from interlock.core.expr import (
    VARIABLES,
    CompiledValue,
    CompileError,
    CostError,
    Expression,
    ValueProblem,
    compile_value,
)
from interlock.core.names import (
    CAPABILITY_NAME,
    EVENT_TYPE,
    INPUT_NAME,
    STATE_NAME,
    WORKFLOW_REF,
    check_metadata,
)
from interlock.core.rules import check_graph, check_references
from interlock.core.source import Document, Path, Span
from interlock.core.vocabulary import ERROR_CLASSES

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float | None:
    """Seconds in ``30s``, ``30m``, ``1h``, ``1h30m``, ``250ms``; None when malformed."""
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def spec_hash(document: Any) -> str:
    """A stable hash of a manifest's content (key order does not matter)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class WorkflowLowering:
    """One workflow document to a :class:`Definition`, every problem reported on the way."""

    def __init__(
        self, doc: Document, diags: list[Diagnostic], capabilities: set[str] | None
    ) -> None:
        self.doc = doc
        self.diags = diags
        self.capabilities = capabilities
        self.wf = msgspec.convert(doc.data, model.Workflow)
        self.states = self.wf.spec.states

    def error(self, path: Path, rule: str, message: str, *, key: bool = False) -> None:
        self.diags.append(self.doc.diag(path, rule, message, key=key))

    def run(self) -> Definition | None:
        before = len(self.diags)
        wf, spec = self.wf, self.wf.spec
        check_metadata(self.doc, wf.metadata, self.diags)
        inputs = self._inputs()
        if spec.initial_state not in self.states:
            self.error(
                ("spec", "initial_state"),
                "initial-state",
                f"initial_state {spec.initial_state!r} is not a state "
                f"(states: {', '.join(self.states)})",
            )
        budget = BudgetDef(
            spec.budget.max_transitions, spec.budget.max_actions, spec.budget.max_fan_out
        )
        self.budget = budget
        states = {name: self._state(name, state) for name, state in self.states.items()}
        triggers = tuple(self._trigger(i, t) for i, t in enumerate(spec.triggers))
        correlation = self._correlation()
        deadline = self._deadline()
        check_graph(spec, self.error)
        check_references(states, deadline, self.error)
        if len(self.diags) != before:
            return None
        return Definition(
            name=wf.metadata.name,
            namespace=wf.metadata.namespace,
            api_version=wf.apiVersion,
            spec_hash=spec_hash(self.doc.data),
            initial_state=spec.initial_state,
            states=states,
            triggers=triggers,
            inputs=inputs,
            context=dict(spec.context),
            version_label=None if wf.metadata.version is None else str(wf.metadata.version),
            description=spec.description,
            manifest=self.doc.data,
            budget=budget,
            correlation=correlation,
            deadline=deadline,
        )

    def _deadline(self) -> DeadlineDef | None:
        spec = self.wf.spec.deadline
        if spec is None:
            return None
        base: Path = ("spec", "deadline")
        after = self._duration((*base, "after"), spec.after)
        if spec.goto is not None:
            self._goto((*base, "goto"), spec.goto)
        sets = self._sets((*base, "set"), spec.set)
        return DeadlineDef(after or 0.0, spec.goto, sets)

    def _correlation(self) -> CorrelationDef | None:
        spec = self.wf.spec.correlate
        if spec is None:
            return None
        base: Path = ("spec", "correlate")
        key = self._value((*base, "key"), spec.key)
        events: dict[str, Expression] = {}
        for event_type, source in spec.events.items():
            if not EVENT_TYPE.match(event_type):
                self.error(
                    (*base, "events", event_type),
                    "bad-name",
                    f"event type {event_type!r} must be dot-separated words",
                    key=True,
                )
            expression = self._expression((*base, "events", event_type), source)
            if expression is not None:
                events[event_type] = expression
        return CorrelationDef(key, events)

    def _expression(
        self, path: Path, source: str, extra: frozenset[str] = frozenset()
    ) -> Expression | None:
        try:
            return Expression(source, extra)
        except CompileError as exc:
            self._cel_error(path, exc)
            return None

    def _inputs(self) -> tuple[InputDef, ...]:
        out = []
        for name, spec in self.wf.spec.inputs.items():
            path: Path = ("spec", "inputs", name)
            if not INPUT_NAME.match(name):
                self.error(path, "bad-name", f"input name {name!r} must be an identifier", key=True)
            if not known_type(spec.type):
                self.error(
                    (*path, "type"),
                    "input-type",
                    f"unknown input type {spec.type!r} (string, integer, number, boolean, "
                    "object, list, list[<type>], any)",
                )
            raw = self.doc.data["spec"]["inputs"][name]
            has_default = isinstance(raw, dict) and "default" in raw
            if has_default and known_type(spec.type) and not type_matches(spec.type, spec.default):
                self.error(
                    (*path, "default"),
                    "input-type",
                    f"default of input {name!r} is not a {spec.type}",
                )
            out.append(InputDef(name, spec.type, spec.required, spec.default, has_default))
        return tuple(out)

    def _duration(self, path: Path, text: str | None) -> float | None:
        if text is None:
            return None
        seconds = parse_duration(text)
        if seconds is None or seconds <= 0:
            self.error(
                path,
                "bad-duration",
                f"{text!r} is not a duration (a number and a unit: 250ms, 30s, 30m, 1h, 1d)",
            )
        return seconds

    def _value(self, path: Path, value: Any, extra: frozenset[str] = frozenset()) -> CompiledValue:
        problems: list[ValueProblem] = []
        compiled = compile_value(value, extra, path, problems)
        for problem in problems:
            self._cel_error(problem.path, problem.error, problem.offset)
        return compiled

    def _cel_error(self, path: Path, error: CompileError, offset: int = 0) -> None:
        span = self.doc.where(path)
        line, col = _inner_position(span, error.line, error.col + offset)
        if isinstance(error, CostError):
            self.diags.append(Diagnostic(self.doc.path, line, col, "cel-cost", error.message))
        else:
            self.diags.append(Diagnostic(self.doc.path, line, col, "cel-compile", error.message))

    def _state(self, name: str, state: model.State) -> StateDef:
        base: Path = ("spec", "states", name)
        self._check_shape(base, name, state)
        fail = self._fail(base, name, state)
        actions = tuple(self._action((*base, "actions", i), a) for i, a in enumerate(state.actions))
        transitions = tuple(
            self._transition((*base, "on", i), i, t) for i, t in enumerate(state.on)
        )
        by_event: dict[str, tuple[TransitionDef, ...]] = {}
        for t in transitions:
            by_event[t.event] = (*by_event.get(t.event, ()), t)
        outputs = None
        if state.outputs is not None:
            outputs = tuple(
                (k, self._value((*base, "outputs", k), v)) for k, v in state.outputs.items()
            )
        catches = tuple(self._catch((*base, "catch", i), c) for i, c in enumerate(state.catch))
        timeout = None
        if state.timeout is not None:
            after = self._duration((*base, "timeout", "after"), state.timeout.after)
            self._goto((*base, "timeout", "goto"), state.timeout.goto)
            sets = self._sets((*base, "timeout", "set"), state.timeout.set)
            timeout = TimeoutDef(after or 0.0, state.timeout.goto, sets)
        return StateDef(
            name,
            state.type,
            actions,
            transitions,
            outputs,
            by_event,
            catches=catches,
            timeout=timeout,
            map=self._map((*base, "map"), state.map)
            or self._parallel((*base, "parallel"), state.parallel),
            loop=self._loop((*base, "loop"), state.loop),
            fail=fail,
        )

    def _check_shape(self, base: Path, name: str, state: model.State) -> None:
        """The state's name, and what a state of its type may declare."""
        if not STATE_NAME.match(name):
            self.error(
                base,
                "bad-name",
                f"state name {name!r} must start with a letter and hold only letters, "
                "digits, '_' or '-'",
                key=True,
            )
        terminal = state.type == TERMINAL
        if terminal and state.on:
            self.error(
                (*base, "on"), "terminal-transitions", f"terminal state {name!r} has transitions"
            )
        for what in ("actions", "map", "loop", "parallel", "catch", "timeout"):
            if terminal and getattr(state, what):
                self.error(
                    (*base, what),
                    "terminal-transitions",
                    f"terminal state {name!r} has {what} (a terminal state ends the run)",
                )
        kinds = [k for k in ("actions", "map", "loop", "parallel") if getattr(state, k)]
        if len(kinds) > 1:
            self.error(
                (*base, kinds[1]),
                "state-kind",
                f"state {name!r} has {' and '.join(kinds)}: a state runs actions, a map, a "
                "loop or parallel actions, not several",
            )
        if state.outputs is not None and not terminal:
            self.error(
                (*base, "outputs"),
                "outputs-non-terminal",
                f"state {name!r} declares outputs but is not terminal (only terminal states "
                "return outputs)",
            )

    def _fail(self, base: Path, name: str, state: model.State) -> FailDef | None:
        """How a terminal state fails the run, if it does."""
        if state.fail is None:
            return None
        terminal = state.type == TERMINAL
        if not terminal:
            self.error(
                (*base, "fail"),
                "fail-non-terminal",
                f"state {name!r} has fail but is not terminal (fail says how a terminal "
                "state ends the run)",
            )
        if state.fail.error_class not in ERROR_CLASSES:
            self.error(
                (*base, "fail", "class"),
                "unknown-error-class",
                f"unknown error class {state.fail.error_class!r} "
                f"(known: {', '.join(ERROR_CLASSES)})",
            )
        message = self._value((*base, "fail", "message"), state.fail.message)
        return FailDef(state.fail.error_class, message)

    def _goto(self, path: Path, goto: str) -> None:
        if goto not in self.states:
            self.error(
                path,
                "unknown-goto",
                f"goto {goto!r} is not a state (states: {', '.join(self.states)})",
            )

    def _sets(self, path: Path, values: Mapping[str, Any]) -> tuple[tuple[str, CompiledValue], ...]:
        return tuple((k, self._value((*path, k), v)) for k, v in values.items())

    def _catch(self, path: Path, catch: model.Catch) -> CatchDef:
        for i, error_class in enumerate(catch.errors):
            if error_class != "*" and error_class not in ERROR_CLASSES:
                self.error(
                    (*path, "errors", i),
                    "unknown-error-class",
                    f"unknown error class {error_class!r} (known: {', '.join(ERROR_CLASSES)}, *)",
                )
        self._goto((*path, "goto"), catch.goto)
        return CatchDef(
            frozenset(catch.errors),
            catch.goto,
            self._sets((*path, "set"), catch.set),
            frozenset(catch.codes),
        )

    def _map(self, path: Path, spec: model.MapSpec | None) -> MapDef | None:
        if spec is None:
            return None
        if not INPUT_NAME.match(spec.as_) or spec.as_ in VARIABLES:
            self.error(
                (*path, "as"),
                "bad-name",
                f"map item name {spec.as_!r} must be an identifier other than "
                f"{', '.join(sorted(VARIABLES))}",
            )
        raw_map = self.doc.data["spec"]["states"][path[2]].get("map", {})
        given = isinstance(raw_map, dict) and "parallelism" in raw_map
        parallelism = spec.parallelism if given else min(spec.parallelism, self.budget.max_fan_out)
        if parallelism > self.budget.max_fan_out:
            self.error(
                (*path, "parallelism"),
                "budget",
                f"parallelism {parallelism} is above budget.max_fan_out "
                f"({self.budget.max_fan_out})",
            )
        over = self._expression((*path, "over"), spec.over)
        extra = frozenset({spec.as_, "index"})
        action = self._action((*path, "action"), spec.action, extra)
        # The engine never applies it per item, so accepting it would silently drop writes.
        if (*path, "action", "output") in self.doc.keys:
            self.error(
                (*path, "action", "output"),
                "map-output",
                "a map's action has no per-item output mapping: the map's result (a list) "
                f"becomes states.{path[2]}.output; read it there or map it in a transition's set",
                key=True,
            )
        if over is None:
            return None
        return MapDef(over, spec.as_, action, parallelism, spec.completion)

    def _parallel(self, path: Path, spec: model.ParallelSpec | None) -> MapDef | None:
        """A parallel state runs on the map's machinery: one item per branch."""
        if spec is None:
            return None
        if len(spec.actions) > self.budget.max_fan_out:
            self.error(
                (*path, "actions"),
                "budget",
                f"{len(spec.actions)} parallel actions are above budget.max_fan_out "
                f"({self.budget.max_fan_out})",
            )
        extra = frozenset({"index"})
        branches = []
        for i, action in enumerate(spec.actions):
            branches.append(self._action((*path, "actions", i), action, extra))
            if (*path, "actions", i, "output") in self.doc.keys:
                self.error(
                    (*path, "actions", i, "output"),
                    "map-output",
                    "a parallel action has no output mapping of its own: the state's result "
                    f"(the list of results) becomes states.{path[2]}.output; read it there or "
                    "map it in a transition's set",
                    key=True,
                )
        return MapDef(
            None, "", branches[0], len(branches), spec.completion, branches=tuple(branches)
        )

    def _loop(self, path: Path, spec: model.LoopSpec | None) -> LoopDef | None:
        if spec is None:
            return None
        extra = frozenset({"iteration"})
        until = self._expression((*path, "until"), spec.until, extra)
        action = self._action((*path, "action"), spec.action, extra)
        if until is None:
            return None
        return LoopDef(until, spec.max_iterations, action)

    def _action(
        self, path: Path, action: model.Action, extra: frozenset[str] = frozenset()
    ) -> ActionDef:
        if (action.capability is None) == (action.workflow is None):
            self.error(
                path,
                "action-target",
                "an action names exactly one of capability (work for an agent) and workflow "
                "(a child run)",
            )
        if action.capability is not None:
            if not CAPABILITY_NAME.match(action.capability):
                self.error(
                    (*path, "capability"),
                    "bad-name",
                    f"capability name {action.capability!r} must be dot-separated words",
                )
            elif self.capabilities is not None and action.capability not in self.capabilities:
                self.error(
                    (*path, "capability"),
                    "unknown-capability",
                    f"no AgentDef declares capability {action.capability!r}",
                )
        if action.workflow is not None and not WORKFLOW_REF.match(action.workflow):
            self.error(
                (*path, "workflow"),
                "bad-name",
                f"workflow {action.workflow!r} must be NAME or NAMESPACE/NAME (DNS labels)",
            )
        retry = None
        if action.retry is not None:
            b = action.retry.backoff
            retry = RetryPolicy(
                max_attempts=action.retry.max_attempts,
                initial_s=self._duration((*path, "retry", "backoff", "initial"), b.initial) or 1.0,
                multiplier=b.multiplier,
                max_s=self._duration((*path, "retry", "backoff", "max"), b.max) or 60.0,
                jitter=b.jitter,
            )
        return ActionDef(
            capability=action.capability or "",
            # No input: the agent gets an empty object, never null.
            input=self._value(
                (*path, "input"), {} if action.input is None else action.input, extra
            ),
            timeout_s=self._duration((*path, "timeout"), action.timeout),
            output=tuple(action.output.items()),
            retry=retry,
            workflow=action.workflow,
        )

    def _transition(self, path: Path, index: int, t: model.Transition) -> TransitionDef:
        if not EVENT_TYPE.match(t.event):
            self.error(
                (*path, "event"), "bad-name", f"event type {t.event!r} must be dot-separated words"
            )
        self._goto((*path, "goto"), t.goto)
        guard = None
        if t.guard is not None:
            try:
                guard = Expression(t.guard)
            except CompileError as exc:
                self._cel_error((*path, "guard"), exc)
        sets = tuple((k, self._value((*path, "set", k), v)) for k, v in t.set.items())
        return TransitionDef(index, t.event, t.goto, guard, sets)

    def _trigger(self, index: int, trigger: model.Trigger) -> TriggerDef:
        path: Path = ("spec", "triggers", index)
        if not EVENT_TYPE.match(trigger.event):
            self.error(
                (*path, "event"),
                "bad-name",
                f"event type {trigger.event!r} must be dot-separated words",
            )
        filters = tuple((tuple(str(k).split(".")), v) for k, v in trigger.filter.items())
        compiled_input = None
        if trigger.input is not None:
            compiled_input = self._value((*path, "input"), trigger.input)
        return TriggerDef(trigger.event, filters, compiled_input)


def _inner_position(span: Span, line: int, col: int) -> tuple[int, int]:
    """Position in the file of (line, col) inside a scalar that starts at ``span``."""
    if span.style in ("|", ">"):
        return span.line + line, (span.content_col or span.col + 1) + col - 1
    if line > 1:
        return span.line + line - 1, col
    lead = 1 if span.style in ("'", '"') else 0
    return span.line, span.col + lead + col - 1


def lower_workflow(
    doc: Document, diags: list[Diagnostic], capabilities: set[str] | None
) -> Definition | None:
    """The workflow's definition, or None when ``diags`` got a problem."""
    return WorkflowLowering(doc, diags, capabilities).run()
