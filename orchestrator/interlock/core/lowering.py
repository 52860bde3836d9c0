"""Lowering: a structurally valid workflow document to its :class:`Definition`.

Each state, action, transition and trigger is checked against the rules that concern it
alone (names, durations, CEL, error classes, budgets) and compiled; the rules over the
whole workflow (reachability, references) are in :mod:`interlock.core.rules`. This module
lowers what belongs to the workflow itself (metadata, inputs, triggers, correlation, the
deadline); :mod:`interlock.core.lowering_states` lowers each state, and
:mod:`interlock.core.lowering_scope` holds what both share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from interlock.core import model
from interlock.core.definition import (
    ArchiveDef,
    BudgetDef,
    CorrelationDef,
    DeadlineDef,
    Definition,
    HistoryDef,
    InputDef,
    TriggerDef,
    known_type,
    type_matches,
)
from interlock.core.diagnostics import Diagnostic
from interlock.core.expr import Expression, ExpressionError, expressions, references
from interlock.core.flowmodel import TriggerRate
from interlock.core.history import MIN_HISTORY_BYTES, parse_size
from interlock.core.limitdef import (
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MAX_WEIGHT,
    LimitDef,
    TriggerRateDef,
    WindowDef,
    key_text,
)
from interlock.core.lowering_dag import STEPS_VARIABLE, check_gates
from interlock.core.lowering_scope import LoweringScope
from interlock.core.lowering_states import StateLowering
from interlock.core.names import BUCKET_NAME, DNS_LABEL, EVENT_TYPE, INPUT_NAME, check_metadata
from interlock.core.outcomes import check_outcomes
from interlock.core.rules import check_cycles, check_graph, check_references, check_required
from interlock.core.source import Document, Path

AT_START = frozenset({"inputs", "event", "data"})
"""What an expression computed when a run starts may read (its priority, its concurrency
limits' key, fairness key and weight)."""

_Want = tuple[Callable[[Any], bool], str, Callable[[Any], str]]
"""What a value computed at a run's start must be, how to say it, and what to say of a
value that is not."""
_PRIORITY: _Want = (
    lambda v: type(v) is int and -MAX_PRIORITY <= v <= MAX_PRIORITY,
    f"an integer from {-MAX_PRIORITY:,} to {MAX_PRIORITY:,}",
    lambda v: key_text(v)[:64],
)
_WEIGHT: _Want = (
    lambda v: type(v) is int and 1 <= v <= MAX_WEIGHT,
    f"an integer from 1 to {MAX_WEIGHT:,}",
    lambda v: key_text(v)[:64],
)
_KEY: _Want = (
    lambda v: len(key_text(v)) <= MAX_KEY_LENGTH,
    f"at most {MAX_KEY_LENGTH}",
    lambda v: f"{len(key_text(v)):,} characters long",
)


def spec_hash(document: Any) -> str:
    """A stable hash of a manifest's content (key order does not matter)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class WorkflowLowering(LoweringScope):
    """One workflow document to a :class:`Definition`, every problem reported on the way."""

    def __init__(
        self,
        doc: Document,
        diags: list[Diagnostic],
        capabilities: set[str] | None,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.outputs = outputs or {}
        self.wf = msgspec.convert(doc.data, model.Workflow)
        spec = self.wf.spec
        budget = BudgetDef(
            spec.budget.max_transitions,
            spec.budget.max_actions,
            spec.budget.max_fan_out,
            spec.budget.max_cost,
            dict(spec.budget.edges),
            spec.budget.max_spawn_depth,
            spec.budget.max_total_spawns,
        )
        super().__init__(doc, diags, capabilities, spec.states, budget)

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
        state_lowering = StateLowering(
            self.doc, self.diags, self.capabilities, self.states, self.budget
        )
        states = {name: state_lowering.state(name, state) for name, state in self.states.items()}
        triggers = tuple(self._trigger(i, t) for i, t in enumerate(spec.triggers))
        correlation = self._correlation()
        deadline = self._deadline()
        retention_s = self._duration(("spec", "retention"), spec.retention)
        archive = self._archive()
        history = self._history()
        concurrency = self._concurrency()
        priority = self._priority()
        check_graph(spec, self.error)
        if self._cycles_need_budgets():
            check_cycles(spec, self.error)
        check_outcomes(spec, self.outputs, self.error)
        check_required(spec, self.error)
        check_gates(self.error, spec)
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
            budget=self.budget,
            correlation=correlation,
            deadline=deadline,
            evidence_events=frozenset(spec.evidence.events if spec.evidence else ()),
            retention_s=retention_s,
            archive=archive,
            history=history,
            concurrency=concurrency,
            priority=priority,
            source=self.doc.text,
        )

    def _priority(self) -> Expression | None:
        """``spec.priority``: CEL over what a run starts with, like a concurrency key."""
        source = self.wf.spec.priority
        if source is None:
            return None
        expression = self._expression(("spec", "priority"), source, sees=AT_START)
        unseen = sorted(expression.names - {"inputs", "event", "data"}) if expression else []
        if unseen:
            self.error(
                ("spec", "priority"),
                "priority",
                "the priority sees only 'inputs', 'event' and 'data' (it is computed when "
                f"the run starts); it reads {', '.join(repr(n) for n in unseen)}",
            )
        self._constant(("spec", "priority"), expression, "priority", "the priority", _PRIORITY)
        return expression

    def _constant(
        self, path: Path, expression: Expression | None, rule: str, what: str, want: _Want
    ) -> None:
        """An expression that reads nothing gives every run one value: a value every run
        would fail at its start with (a weight of 10**9, a key of 300 characters) is
        refused here, at its place, where it failed each run (``schema_error``)."""
        if expression is None or expression.names:
            return
        try:
            value = expression.evaluate({})
        except ExpressionError as exc:
            self.error(path, rule, f"{what} reads nothing and cannot be computed: {exc}")
            return
        if not want[0](value):
            self.error(
                path,
                rule,
                f"{what} is always {want[2](value)}, not {want[1]}: every run would fail at "
                "its start",
            )

    def _concurrency(self) -> tuple[LimitDef, ...]:
        """``spec.concurrency``: each limit's key compiled (it sees what a run starts
        with: its inputs and trigger event), its scope a name, no scope named twice."""
        wf = self.wf
        out: list[LimitDef] = []
        scopes: set[str] = set()
        for i, limit in enumerate(wf.spec.concurrency):
            base: Path = ("spec", "concurrency", i)
            key = self._expression((*base, "key"), limit.key, sees=AT_START)
            unseen = sorted(key.names - {"inputs", "event", "data"}) if key else []
            if unseen:
                self.error(
                    (*base, "key"),
                    "concurrency-key",
                    "a concurrency key sees only 'inputs', 'event' and 'data' (it is computed "
                    f"when the run starts); it reads {', '.join(repr(n) for n in unseen)}",
                )
            if limit.scope is not None and not DNS_LABEL.match(limit.scope):
                self.error(
                    (*base, "scope"),
                    "bad-name",
                    f"scope {limit.scope!r} must be a DNS label (lowercase letters, digits, '-')",
                )
            if limit.scope is not None and limit.scope in scopes:
                self.error(
                    (*base, "scope"),
                    "concurrency-scope",
                    f"scope {limit.scope!r} is named by two limits of this workflow",
                )
            scopes.add(limit.scope or "")
            name = limit.scope or f"{wf.metadata.name}#{i + 1}"
            fair = None
            if limit.fair is not None:
                fair = self._expression((*base, "fair"), limit.fair, sees=AT_START)
                reads = sorted(fair.names - {"inputs", "event", "data"}) if fair else []
                if reads:
                    self.error(
                        (*base, "fair"),
                        "concurrency-key",
                        "a fairness key sees only 'inputs', 'event' and 'data' (it is computed "
                        f"when the run starts); it reads {', '.join(repr(n) for n in reads)}",
                    )
            self._constant((*base, "key"), key, "concurrency-key", "the key", _KEY)
            self._constant((*base, "fair"), fair, "concurrency-key", "the fairness key", _KEY)
            weight = self._weight(base, limit.weight, fair)
            if key is not None:
                ref = f"{wf.metadata.namespace}/{name}"
                out.append(LimitDef(ref, key, limit.limit, limit.on_limit, fair, weight))
        return tuple(out)

    def _weight(self, base: Path, source: str | None, fair: Expression | None) -> Expression | None:
        """A limit's ``weight``: CEL over what a run starts with, beside a ``fair``."""
        if source is None:
            return None
        if fair is None and self.wf.spec.concurrency[int(base[-1])].fair is None:
            self.error(
                (*base, "weight"),
                "concurrency-key",
                "a weight is the share of a fairness key: it needs 'fair' beside it",
            )
        weight = self._expression((*base, "weight"), source, sees=AT_START)
        reads = sorted(weight.names - {"inputs", "event", "data"}) if weight else []
        if reads:
            self.error(
                (*base, "weight"),
                "concurrency-key",
                "a weight sees only 'inputs', 'event' and 'data' (it is computed when the "
                f"run starts); it reads {', '.join(repr(n) for n in reads)}",
            )
        self._constant((*base, "weight"), weight, "concurrency-key", "the weight", _WEIGHT)
        return weight

    def _history(self) -> HistoryDef | None:
        spec = self.wf.spec.history
        if spec is None:
            return None
        max_bytes = spec.max_bytes
        if isinstance(max_bytes, str):
            max_bytes = parse_size(max_bytes)
            if max_bytes is None:
                self.error(
                    ("spec", "history", "max_bytes"),
                    "bad-size",
                    f"max_bytes {spec.max_bytes!r} is not a size (a number of bytes, or a "
                    "whole number followed by KB, MB, GB, KiB, MiB or GiB: 64MiB)",
                )
        if max_bytes is not None and max_bytes < MIN_HISTORY_BYTES:
            self.error(
                ("spec", "history", "max_bytes"),
                "bad-size",
                f"max_bytes must be at least {MIN_HISTORY_BYTES} (a run's first records "
                "take a few KB)",
            )
        return HistoryDef(spec.max_records, max_bytes, spec.continue_as_new)

    def _archive(self) -> ArchiveDef | None:
        spec = self.wf.spec.archive
        if spec is None:
            return None
        base: Path = ("spec", "archive")
        if (spec.bucket is None) == (spec.directory is None):
            self.error(base, "archive", "archive names exactly one of 'bucket' or 'directory'")
        if spec.bucket is not None and not BUCKET_NAME.match(spec.bucket):
            self.error(
                (*base, "bucket"),
                "bad-name",
                f"bucket {spec.bucket!r} must be letters, digits, '-' and '_'",
            )
        if spec.directory is not None and not spec.directory.strip():
            self.error((*base, "directory"), "archive", "directory is empty")
        return ArchiveDef(spec.bucket, spec.directory)

    def _cycles_need_budgets(self) -> bool:
        """Whether a cycle must declare its budget: not when the workflow declares its run's
        ``budget.max_transitions`` (that bounds every cycle, as the author chose), nor in a
        zynax.io/v1 manifest (which runs as written, under the default run budget)."""
        if self.wf.apiVersion == "zynax.io/v1":
            return False
        spec = self.doc.data.get("spec") if isinstance(self.doc.data, dict) else None
        budget = spec.get("budget") if isinstance(spec, dict) else None
        return not (isinstance(budget, dict) and "max_transitions" in budget)

    def _deadline(self) -> DeadlineDef | None:
        spec = self.wf.spec.deadline
        if spec is None:
            return None
        base: Path = ("spec", "deadline")
        after = self._duration((*base, "after"), spec.after)
        if spec.goto is not None:
            self._goto((*base, "goto"), spec.goto)
        elif spec.after is None:
            self.error(
                base,
                "deadline",
                "a deadline needs 'after' (how long a run may take, unless started with a "
                "deadline of its own) or 'goto' (where a run started with one goes then)",
            )
        # The DAG's steps as they stand (a DAG state's run) may be read, as a step's input.
        dag = any(s.dag is not None for s in self.wf.spec.states.values())
        sets = tuple(
            (k, self._value((*base, "set", k), v, STEPS_VARIABLE if dag else frozenset()))
            for k, v in spec.set.items()
        )
        return DeadlineDef(after, spec.goto, sets)

    def _correlation(self) -> CorrelationDef | None:
        spec = self.wf.spec.correlate
        if spec is None:
            return None
        base: Path = ("spec", "correlate")
        key = self._value((*base, "key"), spec.key)
        # Rendered when the run starts, from its inputs alone: nothing else exists yet.
        unseen = sorted({n for e in expressions(key) for n in e.names} - {"inputs"})
        if unseen or references(key):
            read = ", ".join(repr(n) for n in unseen) or "'$.states'"
            self.error(
                (*base, "key"),
                "cel-compile",
                f"the correlation key sees only 'inputs' (rendered when the run starts); "
                f"it reads {read}",
            )
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
        meta = self.wf.metadata
        return TriggerDef(
            trigger.event,
            filters,
            compiled_input,
            name=f"{meta.namespace}/{meta.name}#trigger{index + 1}",
            window=self._window(path, trigger),
            rate=self._trigger_rate(path, trigger.rate),
        )

    def _trigger_key(self, path: Path, source: str | None) -> Expression | None:
        """A trigger's ``key``: CEL over the event alone (computed when it arrives)."""
        if source is None:
            return None
        key = self._expression(path, source, sees=frozenset({"event", "data"}))
        unseen = sorted(key.names - {"event", "data"}) if key else []
        if unseen:
            self.error(
                path,
                "trigger-key",
                "a trigger's key sees only 'event' and 'data' (it is computed when the event "
                f"arrives); it reads {', '.join(repr(n) for n in unseen)}",
            )
        self._constant(path, key, "trigger-key", "the key", _KEY)
        return key

    def _window(self, path: Path, trigger: model.Trigger) -> WindowDef | None:
        """A trigger's ``debounce`` or ``batch`` (at most one of them and ``rate``)."""
        given = [n for n in ("debounce", "batch", "rate") if getattr(trigger, n) is not None]
        if len(given) > 1:
            self.error(
                (*path, given[1]),
                "trigger-flow",
                f"a trigger takes one of debounce, batch and rate; this one has {given[0]} "
                f"and {given[1]} (use two triggers, or a concurrency limit on the workflow)",
            )
        if trigger.debounce is not None:
            d, base = trigger.debounce, (*path, "debounce")
            period = self._duration((*base, "period"), d.period) or 0.0
            max_wait = self._duration((*base, "max_wait"), d.max_wait)
            if period and max_wait is not None and max_wait < period:
                self.error(
                    (*base, "max_wait"),
                    "trigger-flow",
                    f"max_wait ({d.max_wait}) is shorter than period ({d.period}): a run "
                    "would never wait the period after an event",
                )
            key = self._trigger_key((*base, "key"), d.key)
            return WindowDef("debounce", key, max_wait, period_s=period)
        if trigger.batch is not None:
            b, base = trigger.batch, (*path, "batch")
            max_wait = self._duration((*base, "max_wait"), b.max_wait)
            key = self._trigger_key((*base, "key"), b.key)
            return WindowDef("batch", key, max_wait, max_events=b.max_events)
        return None

    def _trigger_rate(self, path: Path, rate: TriggerRate | None) -> TriggerRateDef | None:
        if rate is None:
            return None
        base = (*path, "rate")
        per = self._duration((*base, "per"), rate.per) or 0.0
        key = self._trigger_key((*base, "key"), rate.key)
        return TriggerRateDef(rate.limit, per, key, rate.on_limit)


def lower_workflow(
    doc: Document,
    diags: list[Diagnostic],
    capabilities: set[str] | None,
    outputs: Mapping[str, Mapping[str, Any]] | None = None,
) -> Definition | None:
    """The workflow's definition, or None when ``diags`` got a problem. ``outputs``: the
    output schema of each capability known (``gate-outcome-impossible`` reads them)."""
    return WorkflowLowering(doc, diags, capabilities, outputs).run()
