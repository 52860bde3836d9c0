"""Manifest files in, compiled definitions or positioned diagnostics out.

Validation is static and complete before anything runs: structure (against the JSON
Schemas generated from :mod:`interlock.core.model`), then the rules of the state machine.
Every problem of every document is reported, each with the file, line and column, and the
rule it breaks (the rule ids are listed in docs/language.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jsonschema

import hashlib
import json
import re
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import msgspec

from interlock.core import model
from interlock.core.definition import (
    TERMINAL,
    ActionDef,
    AgentDefinition,
    BudgetDef,
    CapabilityDef,
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
from interlock.core.diagnostics import Diagnostic, ManifestError
from interlock.core.expr import (
    VARIABLES,
    CompiledValue,
    CompileError,
    Expression,
    ValueProblem,
    compile_value,
    references,
)
from interlock.core.source import Document, Path, Span, load_documents
from interlock.core.vocabulary import ERROR_CLASSES

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
STATE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
WORKFLOW_REF = re.compile(
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
)
CAPABILITY_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
EVENT_TYPE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
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


@dataclass(slots=True)
class Compiled:
    """What a set of manifest files compiled to."""

    workflows: list[Definition] = field(default_factory=list)
    agents: list[AgentDefinition] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    capabilities_checked: bool = True

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    def raise_for_errors(self) -> None:
        if self.diagnostics:
            raise ManifestError(self.diagnostics)


@cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    import jsonschema  # on first use: most commands never validate a manifest

    schema = model.json_schema(kind)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def compile_sources(
    sources: Iterable[tuple[str, str]],
    *,
    agent_sources: Iterable[tuple[str, str]] = (),
    known_capabilities: Collection[str] | None = None,
    documents: Iterable[Document] = (),
) -> Compiled:
    """Compile manifest texts given as (path, text), and ``documents`` already loaded (the
    native documents a dialect lowered, which keep their original file's positions).

    Capabilities are checked against the AgentDefs found in ``sources`` and
    ``agent_sources`` plus ``known_capabilities`` (for example a registry's). When none of
    those names any capability, the check is skipped and ``capabilities_checked`` is False.
    """
    out = Compiled()
    workflow_docs: list[Document] = []
    loaded: list[Document] = list(documents)
    for path, text in [*sources, *agent_sources]:
        docs, errors = load_documents(text, path)
        out.diagnostics.extend(errors)
        loaded.extend(docs)
    for doc in loaded:
        kind = _check_structure(doc, out.diagnostics)
        if kind == "Workflow":
            workflow_docs.append(doc)
        elif kind == "AgentDef":
            agent = _compile_agent(doc, out.diagnostics)
            if agent is not None:
                out.agents.append(agent)
    capabilities = set(known_capabilities or ())
    for agent in out.agents:
        capabilities.update(agent.capabilities)
    out.capabilities_checked = bool(capabilities)
    seen: dict[tuple[str, str], Document] = {}
    for doc in workflow_docs:
        definition = _compile_workflow(
            doc, out.diagnostics, capabilities if out.capabilities_checked else None
        )
        if definition is None:
            continue
        key = (definition.namespace, definition.name)
        if key in seen:
            out.diagnostics.append(
                doc.diag(
                    ("metadata", "name"),
                    "duplicate-name",
                    f"workflow {definition.name!r} is also defined in {seen[key].path}",
                )
            )
            continue
        seen[key] = doc
        out.workflows.append(definition)
    out.diagnostics.sort()
    if out.diagnostics:
        out.workflows.clear()
    return out


def compile_workflow_text(text: str, path: str = "<manifest>") -> Definition:
    """Compile exactly one workflow (capabilities unchecked); raises ManifestError."""
    compiled = compile_sources([(path, text)])
    compiled.raise_for_errors()
    if len(compiled.workflows) != 1:
        raise ManifestError(
            [Diagnostic(path, 1, 1, "wrong-kind", "expected exactly one Workflow document")]
        )
    return compiled.workflows[0]


def compile_workflow_data(data: Mapping[str, Any], path: str = "<stored>") -> Definition:
    """Rebuild a definition from a stored (already validated) manifest document."""
    return compile_workflow_text(json.dumps(data), path)


def compile_agent_data(data: Mapping[str, Any], path: str = "<stored>") -> AgentDefinition:
    """Rebuild an AgentDef from a stored manifest document."""
    compiled = compile_sources([(path, json.dumps(data))])
    compiled.raise_for_errors()
    return compiled.agents[0]


# --- structure ------------------------------------------------------------------------


def _check_structure(doc: Document, diags: list[Diagnostic]) -> str | None:
    """Schema-check one document; returns its kind when it is structurally valid."""
    data = doc.data
    if not isinstance(data, dict):
        diags.append(doc.diag((), "wrong-type", "a manifest must be a mapping"))
        return None
    kind = data.get("kind")
    if kind not in model.KINDS:
        if "kind" not in data:
            diags.append(doc.diag((), "missing-field", "missing required field 'kind'"))
        else:
            known = ", ".join(model.KINDS)
            diags.append(
                doc.diag(("kind",), "unknown-kind", f"unknown kind {kind!r} (known: {known})")
            )
        return None
    prune: list[Path] = []
    failed = False
    for error in _validator(kind).iter_errors(data):
        diags.extend(_schema_diagnostics(doc, error))
        prune.extend(_offending_paths(error))
        failed = True
    if failed:
        # Keep going past structural errors so the rules of the state machine are checked
        # too: drop what is malformed and carry on when what is left still decodes.
        doc.data = _pruned(data, prune)
        try:
            msgspec.convert(doc.data, model.KINDS[kind])
        except msgspec.ValidationError:
            return None
    return str(kind)


def _branch_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For ``X | None`` (``anyOf`` with a null branch) given a non-null value: the errors
    of the X branch, which say what is really wrong (``map`` without ``as``, say)."""
    if error.validator != "anyOf" or error.instance is None:
        return []
    options = error.validator_value if isinstance(error.validator_value, list) else []
    others = [i for i, o in enumerate(options) if o != {"type": "null"}]
    if len(others) != 1 or len(others) == len(options) or _is_type_union(error):
        return []
    return [e for e in error.context or () if e.relative_schema_path[0] == others[0]]


def _offending_paths(error: jsonschema.ValidationError) -> list[Path]:
    branch = _branch_errors(error)
    if branch:
        return [p for e in branch for p in _offending_paths(e)]
    path: Path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(_schema_of(error).get("properties", {}))
        return [(*path, k) for k in error.instance if k not in allowed]
    if error.validator == "required":
        return []  # nothing to drop: decoding fails and the rules wait for a fix
    return [path] if path else []


def _pruned(data: Any, paths: list[Path]) -> Any:
    copy = json.loads(json.dumps(data, default=str))
    # Deepest first, list items from the back, so earlier deletions move nothing later.
    for path in sorted(paths, key=lambda p: (len(p), [str(x) for x in p]), reverse=True):
        parent = copy
        for step in path[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, list) and isinstance(path[-1], int) and path[-1] < len(parent):
            parent.pop(path[-1])
    return copy


def _schema_diagnostics(doc: Document, error: jsonschema.ValidationError) -> list[Diagnostic]:
    branch = _branch_errors(error)
    if branch:
        return [d for e in branch for d in _schema_diagnostics(doc, e)]
    path: Path = tuple(error.absolute_path)
    where = ".".join(str(p) for p in path) or "document"
    validator = error.validator
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(_schema_of(error).get("properties", {}))
        out = []
        for key in error.instance:
            if key not in allowed and not str(key).startswith("x-"):
                hint = ", ".join(sorted(allowed))
                out.append(
                    doc.diag(
                        (*path, key),
                        "unknown-key",
                        f"unknown key {key!r} in {where} (allowed: {hint})",
                        key=True,
                    )
                )
        return out
    if validator == "required":
        return [doc.diag(path, "missing-field", f"{where}: {error.message}")]
    if validator == "type" or (validator == "anyOf" and _is_type_union(error)):
        expected = _expected_types(error)
        got = type(error.instance).__name__ if error.instance is not None else "null"
        got = {"dict": "mapping", "list": "list", "str": "string"}.get(got, got)
        return [doc.diag(path, "wrong-type", f"{where} must be {expected}, got {got}")]
    if validator in ("enum", "const"):
        return [doc.diag(path, "invalid-value", f"{where}: {error.message}")]
    return [doc.diag(path, "invalid-value", f"{where}: {error.message}")]


def _schema_of(error: jsonschema.ValidationError) -> dict[str, Any]:
    return error.schema if isinstance(error.schema, dict) else {}


def _is_type_union(error: jsonschema.ValidationError) -> bool:
    options = error.validator_value if isinstance(error.validator_value, list) else []
    return all(isinstance(o, dict) and set(o) <= {"type"} for o in options)


def _expected_types(error: jsonschema.ValidationError) -> str:
    if error.validator == "type":
        value = error.validator_value
        names = value if isinstance(value, list) else [value]
    else:
        names = [o["type"] for o in error.validator_value]  # type: ignore[union-attr]
    readable = [
        {"object": "a mapping", "array": "a list"}.get(str(n), str(n)) for n in names if n != "null"
    ]
    return " or ".join(readable) or "null"


# --- agents ---------------------------------------------------------------------------


def _compile_agent(doc: Document, diags: list[Diagnostic]) -> AgentDefinition | None:
    spec = msgspec.convert(doc.data, model.AgentDef)
    before = len(diags)
    _check_metadata(doc, spec.metadata, diags)
    capabilities: dict[str, CapabilityDef] = {}
    for i, cap in enumerate(spec.spec.capabilities):
        path: Path = ("spec", "capabilities", i, "name")
        if not CAPABILITY_NAME.match(cap.name):
            diags.append(
                doc.diag(
                    path,
                    "bad-name",
                    f"capability name {cap.name!r} must be dot-separated words "
                    "of letters, digits, '_' or '-' (it becomes a NATS subject)",
                )
            )
        if cap.name in capabilities:
            diags.append(doc.diag(path, "duplicate-name", f"capability {cap.name!r} twice"))
        for which in ("input_schema", "output_schema"):
            schema = getattr(cap, which)
            if schema is None:
                continue
            import jsonschema

            try:
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except jsonschema.SchemaError as exc:
                diags.append(
                    doc.diag(
                        ("spec", "capabilities", i, which),
                        "bad-schema",
                        f"{which} is not a valid JSON Schema: {exc.message}",
                    )
                )
        capabilities[cap.name] = CapabilityDef(
            name=cap.name,
            input_schema=cap.input_schema,
            output_schema=cap.output_schema,
            timeout_s=cap.timeout_seconds,
            max_retries=cap.max_retries,
            description=cap.description,
        )
    if len(diags) != before:
        return None
    return AgentDefinition(
        name=spec.metadata.name,
        namespace=spec.metadata.namespace,
        api_version=spec.apiVersion,
        capabilities=capabilities,
        manifest=doc.data,
    )


def _check_metadata(doc: Document, meta: model.Metadata, diags: list[Diagnostic]) -> None:
    for key in ("name", "namespace"):
        value = getattr(meta, key)
        if not DNS_LABEL.match(value):
            diags.append(
                doc.diag(
                    ("metadata", key),
                    "bad-name",
                    f"metadata.{key} {value!r} is not a DNS label "
                    "(lowercase letters, digits and '-', 1-63 characters, "
                    "starting and ending with a letter or digit)",
                )
            )


# --- workflows ------------------------------------------------------------------------


class _WorkflowCompiler:
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
        _check_metadata(self.doc, wf.metadata, self.diags)
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
        self._graph()
        self._references(states, deadline)
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
        self.diags.append(Diagnostic(self.doc.path, line, col, "cel-compile", error.message))

    def _state(self, name: str, state: model.State) -> StateDef:
        base: Path = ("spec", "states", name)
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
        fail = None
        if state.fail is not None:
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
            fail = FailDef(state.fail.error_class, message)
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
        return CatchDef(frozenset(catch.errors), catch.goto, self._sets((*path, "set"), catch.set))

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

    def _edges(self) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {}
        for name, state in self.states.items():
            targets = {t.goto for t in state.on} | {c.goto for c in state.catch}
            if state.timeout is not None:
                targets.add(state.timeout.goto)
            deadline = self.wf.spec.deadline
            if deadline is not None and deadline.goto is not None:
                targets.add(deadline.goto)  # taken from whatever state the run is in
            edges[name] = {t for t in targets if t in self.states}
        return edges

    def _graph(self) -> None:
        initial = self.wf.spec.initial_state
        edges = self._edges()
        if initial in self.states:
            reachable = _reach({initial}, edges)
            for name in self.states:
                if name not in reachable:
                    self.error(
                        ("spec", "states", name),
                        "unreachable-state",
                        f"state {name!r} cannot be reached from initial state {initial!r}",
                        key=True,
                    )
        reverse: dict[str, set[str]] = {name: set() for name in self.states}
        for source, targets in edges.items():
            for target in targets:
                reverse[target].add(source)
        terminals = {n for n, s in self.states.items() if s.type == TERMINAL}
        if not terminals:
            self.error(
                ("spec", "states"),
                "no-terminal-path",
                "the workflow has no terminal state (add one with type: terminal)",
            )
            return
        finishing = _reach(terminals, reverse)
        for name in self.states:
            if name not in finishing:
                why = "" if edges[name] else " (it has no transitions)"
                self.error(
                    ("spec", "states", name),
                    "no-terminal-path",
                    f"no terminal state can be reached from state {name!r}{why}",
                    key=True,
                )

    def _references(self, states: Mapping[str, StateDef], deadline: DeadlineDef | None) -> None:
        producing = {n for n, s in states.items() if s.produces_output}

        def check(path: Path, value: CompiledValue) -> None:
            for ref in references(value):
                if ref.state not in states:
                    self.error(
                        path,
                        "unknown-state-ref",
                        f"$.states.{ref.state} refers to a state that does not exist",
                    )
                elif ref.state not in producing:
                    self.error(
                        path,
                        "no-output-ref",
                        f"$.states.{ref.state}.output refers to a state that produces no "
                        "output (only states with actions, a map or a loop do)",
                    )

        for name, state in states.items():
            base: Path = ("spec", "states", name)
            for i, action in enumerate(state.actions):
                check((*base, "actions", i, "input"), action.input)
            for t in state.transitions:
                for key, value in t.set:
                    check((*base, "on", t.index, "set", key), value)
            for key, value in state.outputs or ():
                check((*base, "outputs", key), value)
            if state.fail is not None:
                check((*base, "fail", "message"), state.fail.message)
            for i, catch in enumerate(state.catches):
                for key, value in catch.set:
                    check((*base, "catch", i, "set", key), value)
            if state.timeout is not None:
                for key, value in state.timeout.set:
                    check((*base, "timeout", "set", key), value)
            if state.map is not None:
                if state.map.branches:
                    for i, branch in enumerate(state.map.branches):
                        check((*base, "parallel", "actions", i, "input"), branch.input)
                else:
                    check((*base, "map", "action", "input"), state.map.action.input)
            if state.loop is not None:
                check((*base, "loop", "action", "input"), state.loop.action.input)
        for key, value in deadline.set if deadline is not None else ():
            check(("spec", "deadline", "set", key), value)


def _reach(start: set[str], edges: Mapping[str, set[str]]) -> set[str]:
    seen = set(start)
    queue = deque(start)
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _inner_position(span: Span, line: int, col: int) -> tuple[int, int]:
    """Position in the file of (line, col) inside a scalar that starts at ``span``."""
    if span.style in ("|", ">"):
        return span.line + line, (span.content_col or span.col + 1) + col - 1
    if line > 1:
        return span.line + line - 1, col
    lead = 1 if span.style in ("'", '"') else 0
    return span.line, span.col + lead + col - 1


def _compile_workflow(
    doc: Document, diags: list[Diagnostic], capabilities: set[str] | None
) -> Definition | None:
    return _WorkflowCompiler(doc, diags, capabilities).run()
