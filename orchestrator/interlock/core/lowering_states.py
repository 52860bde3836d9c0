"""Lowering one state of a workflow to its :class:`StateDef`.

What a state may declare depends on its kind (actions, a map, parallel actions, a loop, or
a terminal state with outputs or a failure); each piece is checked against the rules that
concern it alone and compiled here. The workflow around the states is lowered in
:mod:`interlock.core.lowering`.
"""

from __future__ import annotations

from interlock.core import model
from interlock.core.definition import (
    TERMINAL,
    ActionDef,
    CatchDef,
    ContinueDef,
    FailDef,
    GateDef,
    LoopDef,
    MapDef,
    RetryPolicy,
    StateDef,
    StateGateDef,
    TimeoutDef,
    TransitionDef,
)
from interlock.core.expr import VARIABLES, CompileError, Expression
from interlock.core.limitdef import MAX_PRIORITY
from interlock.core.lowering_dag import lower_dag
from interlock.core.lowering_scope import LoweringScope
from interlock.core.names import (
    CAPABILITY_NAME,
    EVENT_TYPE,
    INPUT_NAME,
    STATE_NAME,
    WORKFLOW_REF,
)
from interlock.core.source import Path
from interlock.core.vocabulary import ERROR_CLASSES


class StateLowering(LoweringScope):
    """The states of one workflow, each to a :class:`StateDef`."""

    def state(self, name: str, state: model.State) -> StateDef:
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
            dag=lower_dag(self, (*base, "dag"), state.dag),
            gate=self._gate((*base, "gate"), name, state),
        )

    def _gate(self, path: Path, name: str, state: model.State) -> StateGateDef | None:
        """A state's evidence gate: on the answer that completes its ``actions``."""
        spec = state.gate
        if spec is None:
            return None
        waits = [t for t in state.on if t.event not in ("task.completed", "task.failed")]
        kind = state.map or state.parallel or state.loop or state.dag
        if not state.actions and (not waits or kind):
            self.error(
                path,
                "gate-placement",
                f"state {name!r} has a gate but no actions and takes no event from outside: "
                "a gate checks the answer that completes a state's actions, or the event "
                "a state without actions takes (a DAG step takes requires)",
                key=True,
            )
        evidence = tuple(
            self._expression((*path, "evidence", i), text) for i, text in enumerate(spec.evidence)
        )
        when = None if spec.when is None else self._expression((*path, "when"), spec.when)
        gate = GateDef(spec.subject or name, tuple(spec.requires.items()))
        return StateGateDef(gate, tuple(e for e in evidence if e is not None), when)

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
        for what in ("actions", "map", "loop", "parallel", "dag", "catch", "timeout"):
            if terminal and getattr(state, what):
                self.error(
                    (*base, what),
                    "terminal-transitions",
                    f"terminal state {name!r} has {what} (a terminal state ends the run)",
                )
        kinds = [k for k in ("actions", "map", "loop", "parallel", "dag") if getattr(state, k)]
        if len(kinds) > 1:
            self.error(
                (*base, kinds[1]),
                "state-kind",
                f"state {name!r} has {' and '.join(kinds)}: a state runs actions, a map, a "
                "loop, parallel actions or a dag, not several",
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

    def _retried(self, path: Path, errors: list[str]) -> tuple[str, ...]:
        for i, error_class in enumerate(errors):
            if error_class != "*" and error_class not in ERROR_CLASSES:
                self.error(
                    (*path, i),
                    "unknown-error-class",
                    f"unknown error class {error_class!r} (known: {', '.join(ERROR_CLASSES)}, *)",
                )
        return tuple(errors)

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
            self._budgets((*path, "budget"), catch.budget),
        )

    def _budgets(self, path: Path, names: list[str]) -> tuple[str, ...]:
        """The edge budgets an edge counts against: each declared in spec.budget.edges."""
        for i, name in enumerate(names):
            if name not in self.budget.edges:
                declared = ", ".join(self.budget.edges) or "none"
                self.error(
                    (*path, i),
                    "unknown-budget",
                    f"edge budget {name!r} is not declared in spec.budget.edges "
                    f"(declared: {declared})",
                )
        return tuple(dict.fromkeys(names))

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
        completion, at_least = _completion(spec.completion)
        return MapDef(over, spec.as_, action, parallelism, completion, at_least=at_least)

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
        completion, at_least = _completion(spec.completion)
        if at_least > len(branches):
            self.error(
                (*path, "completion", "at_least"),
                "quorum-unreachable",
                f"completion at_least {at_least} is more than the {len(branches)} parallel "
                "actions could ever answer",
            )
        return MapDef(
            None,
            "",
            branches[0],
            len(branches),
            completion,
            branches=tuple(branches),
            at_least=at_least,
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
                errors=self._retried((*path, "retry", "errors"), action.retry.errors),
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
            priority=self._action_priority((*path, "priority"), action, extra),
        )

    def _action_priority(
        self, path: Path, action: model.Action, extra: frozenset[str]
    ) -> Expression | None:
        """An action's ``priority``: an integer, or CEL over the run's values giving one."""
        if action.priority is None:
            return None
        if action.workflow is not None:
            self.error(path, "priority", "priority orders a capability's requests: not a workflow")
            return None
        if isinstance(action.priority, int) and abs(action.priority) > MAX_PRIORITY:
            self.error(
                path, "priority", f"priority must be from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,}"
            )
            return None
        source = action.priority if isinstance(action.priority, str) else str(action.priority)
        return self._expression(path, source, extra)

    def _transition(self, path: Path, index: int, t: model.Transition) -> TransitionDef:
        if not EVENT_TYPE.match(t.event):
            self.error(
                (*path, "event"), "bad-name", f"event type {t.event!r} must be dot-separated words"
            )
        self._goto((*path, "goto"), t.goto)
        guard = None
        if t.guard is not None:
            try:
                guard = Expression(t.guard, doubles=self.doubles)
            except CompileError as exc:
                self._cel_error((*path, "guard"), exc, text=t.guard, whole=True)
        sets = tuple((k, self._value((*path, "set", k), v)) for k, v in t.set.items())
        budget = self._budgets((*path, "budget"), t.budget)
        return TransitionDef(index, t.event, t.goto, guard, sets, budget, self._renew(path, t))

    def _renew(self, path: Path, t: model.Transition) -> ContinueDef | None:
        """A transition's ``continue_as_new``: its inputs compiled; never into a terminal
        state (the new run would end at once: go there in this one)."""
        if t.continue_as_new is False:
            return None
        target = self.states.get(t.goto)
        if target is not None and target.type == "terminal":
            self.error(
                (*path, "continue_as_new"),
                "continue-terminal",
                f"continue_as_new into terminal state {t.goto!r}: the new run would end at "
                "once; go there in this run (drop continue_as_new)",
            )
        given = {} if t.continue_as_new is True else t.continue_as_new.inputs
        at: Path = (*path, "continue_as_new", "inputs")
        return ContinueDef(tuple((k, self._value((*at, k), v)) for k, v in given.items()))


def _completion(spec: model.Completion) -> tuple[str, int]:
    """A map's or parallel state's completion as the engine reads it: its name, and the
    quorum's size (0 when not a quorum)."""
    if isinstance(spec, model.Quorum):
        return "at_least", spec.at_least
    return spec, 0
