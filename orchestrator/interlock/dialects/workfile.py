"""Workfiles, loaded as written.

The document structure is the Workfile's own (``workfile``, ``name``, ``owner``,
``version``, ``on``, ``inputs``, ``outputs``, ``recovery``, and ``steps`` or
``initial`` + ``states``; ``x-`` keys anywhere) with its rules, rule ids
``workfile.<rule>``. Both forms become states of the native state machine:

- the steps form runs its steps in order; a step with ``when`` is skipped when it does not
  hold, a ``stop`` step ends the run (successfully, outputs evaluated), a ``call`` step
  runs another workflow as a child run;
- the states form is a state machine already: each state's work, then its ``on`` events
  or its ``next``.

Expressions are ``{{ cel }}`` in the root scope: ``inputs.<name>``, ``run.id``,
``run.started_at``, and each step by its name (``classify.category`` is the ``category``
of the ``classify`` step's result). The file-level ``outputs`` projection is rendered on
every successful end; ``recovery.retry`` is every action's retry policy unless a step sets
its own. ``owner``, ``version`` and the format version are recorded with every run (in
``run.started``, as the context key ``workfile``).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from interlock.core.definition import known_type
from interlock.core.diagnostics import Diagnostic
from interlock.core.lowering_scope import parse_duration
from interlock.core.source import Document, Path, Span
from interlock.dialects.base import (
    API_VERSION,
    Checker,
    Lowered,
    Lowering,
    Name,
    agent_def,
    check_cel,
    rewrite_cel,
    top_level_names,
)

DIALECT = "workfile"
SUPPORTED = (1,)
TOP_KEYS = {
    "workfile",
    "name",
    "owner",
    "version",
    "on",
    "inputs",
    "outputs",
    "recovery",
    "steps",
    "initial",
    "states",
}
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
STEP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
WORK_KEYS = ("agent", "tool", "call")
STEP_KEYS = {"name", *WORK_KEYS, "with", "input", "when", "timeout", "retry", "stop", "description"}
STATE_KEYS = {
    *WORK_KEYS,
    "with",
    "input",
    "timeout",
    "retry",
    "on",
    "next",
    "type",
    "description",
}
INPUT_KEYS = {"type", "default", "required", "description"}
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_WHOLE = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.DOTALL)
_PATH = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*$")


def detect(data: Any) -> bool:
    if not isinstance(data, dict) or "apiVersion" in data or "kind" in data:
        return False
    if "workfile" in data:
        return True
    keys = {k for k in data if not str(k).startswith("x-")}
    steps = data.get("steps")
    if isinstance(steps, list) and steps and all(isinstance(s, dict) and "id" in s for s in steps):
        return False  # a synapse artifact: steps with ids
    return bool(keys & {"steps", "states"}) and keys <= TOP_KEYS


class _Wf:
    def __init__(self, src: Document, diags: list[Diagnostic]) -> None:
        self.src = src
        self.check = Checker(src, DIALECT, diags)
        self.steps: list[str] = []
        self.optional: set[str] = set()
        self.events = False
        self.waits: set[str] = set()
        """States of the states form that do no work: their result is the event that
        left them (kept in the context under the state's name)."""


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    wf = _Wf(src, diags)
    check = wf.check
    before = len(diags)
    data = src.data
    if not isinstance(data, dict):
        check.error((), "wrong-type", "a Workfile must be a mapping")
        return None
    check.unknown_keys(data, TOP_KEYS, (), "a Workfile", x_keys=True)
    fmt = data.get("workfile", SUPPORTED[-1])
    if isinstance(fmt, bool) or not isinstance(fmt, int):
        check.error(("workfile",), "wrong-type", "workfile must be an integer (a major version)")
    elif fmt not in SUPPORTED:
        check.error(
            ("workfile",),
            "unsupported-version",
            f"workfile {fmt} is not supported (supported: {', '.join(map(str, SUPPORTED))})",
        )
    name = check.string(data, "name", (), pattern=NAME, form="^[a-z][a-z0-9_]*$")
    if "version" in data and (
        isinstance(data["version"], bool) or not isinstance(data["version"], int)
    ):
        check.error(("version",), "wrong-type", "version must be an integer")
    if "owner" in data and not isinstance(data["owner"], str | int | float):
        check.error(("owner",), "wrong-type", "owner must be a scalar")
    has_steps, has_states = "steps" in data, "states" in data
    if has_steps == has_states:
        check.error((), "steps-or-states", "a Workfile must contain exactly one of steps or states")
    if has_states and "initial" not in data:
        check.error(
            ("states",), "initial-required", "a Workfile with states must declare initial", key=True
        )
    if has_steps and "initial" in data:
        check.error(
            ("initial",),
            "initial-with-steps",
            "a Workfile with steps must not declare initial",
            key=True,
        )
    inputs = _inputs(wf, data.get("inputs"))
    if has_steps and not has_states:
        body = check.items(data["steps"], ("steps",), "steps")
        steps = _steps(wf, body) if body is not None else []
    else:
        steps = []
    states: dict[str, Any] = {}
    if has_states and not has_steps:
        states = check.mapping(data["states"], ("states",), "states") or {}
        wf.steps = [str(k) for k in states]
        wf.events = True
        wf.waits = {
            str(k)
            for k, v in states.items()
            if not (isinstance(v, dict) and any(v.get(w) for w in WORK_KEYS))
            and not (isinstance(v, dict) and v.get("type") in ("terminal", "stop"))
        }
        for key in states:
            if not STEP_NAME.match(str(key)):
                check.error(
                    ("states", key),
                    "bad-name",
                    f"state name {key!r} must be an identifier",
                    key=True,
                )
        initial = data.get("initial")
        if "initial" in data and (not isinstance(initial, str) or initial not in states):
            check.error(("initial",), "unknown-state", f"initial {initial!r} names no state")
    outputs = data.get("outputs") or {}
    if check.mapping(outputs, ("outputs",), "outputs") is not None:
        for key in outputs:
            if not NAME.match(str(key)):
                check.error(
                    ("outputs", key),
                    "bad-name",
                    f"output name {key!r} must match ^[a-z][a-z0-9_]*$",
                    key=True,
                )
    recovery = _recovery(wf, data.get("recovery"))
    if len(diags) != before:
        return None
    lowered = Lowered(DIALECT, src)
    out = Lowering(src, DIALECT)
    stem = re.sub(r"[^a-z0-9]+", "-", PurePath(src.path).stem.lower()).strip("-") or "workfile"
    native_name = (name or stem).replace("_", "-")[:63].strip("-")
    if name is None:
        out.note(
            ("metadata", "name"),
            f"the file names no workflow: named after the file ({native_name})",
        )
    elif native_name != name:
        out.note(("metadata", "name"), f"name {name} -> {native_name} (a DNS label: no '_')")
    out.at(("metadata", "name"), ("name",))
    metadata: dict[str, Any] = {"name": native_name}
    if "version" in data:
        metadata["version"] = data["version"]
    if "owner" in data:
        metadata["labels"] = {"owner": str(data["owner"])}
    spec: dict[str, Any] = {}
    if inputs:
        spec["inputs"] = inputs
    spec["context"] = {
        **{wait: {} for wait in sorted(wf.waits)},
        "workfile": {
            "format": fmt,
            "name": name or native_name,
            "owner": data.get("owner"),
            "version": data.get("version"),
        },
    }
    out.note(
        ("spec", "context"),
        "owner, version and the format version are recorded with every run (run.started)",
    )
    triggers = _triggers(wf, out, data.get("on"))
    if triggers:
        spec["triggers"] = triggers
    projection = {str(k): _value(wf, v, ("outputs", k), outputs=True) for k, v in outputs.items()}
    if has_steps:
        initial, native_states = _lower_steps(wf, out, steps, projection, recovery)
    else:
        initial, native_states = _lower_states(wf, out, states, projection, recovery)
        out.at(("spec", "initial_state"), ("initial",))
    spec["initial_state"] = initial
    spec["states"] = native_states
    native = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata, "spec": spec}
    if len(diags) != before:
        return None
    lowered.workflows.append(out.finish(native, lowered))
    lowered.agents.extend(_agents(wf, native_name, native_states, lowered))
    return lowered


# --- parts ----------------------------------------------------------------------------------


def _inputs(wf: _Wf, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    inputs = wf.check.mapping(value, ("inputs",), "inputs")
    out: dict[str, Any] = {}
    for key, decl in (inputs or {}).items():
        path: Path = ("inputs", key)
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            wf.check.error(path, "bad-name", f"input name {key!r} must be an identifier", key=True)
            continue
        if isinstance(decl, str):
            decl = {"type": decl}
        if wf.check.mapping(decl, path, f"input {key!r}") is None:
            continue
        wf.check.unknown_keys(decl, INPUT_KEYS, path, f"input {key!r}", x_keys=True)
        entry: dict[str, Any] = {}
        kind = decl.get("type", "any")
        if not isinstance(kind, str) or not known_type(kind):
            wf.check.error((*path, "type"), "input-type", f"unknown type {kind!r}")
            continue
        entry["type"] = kind
        required = decl.get("required", False)
        if not isinstance(required, bool):
            wf.check.error((*path, "required"), "wrong-type", "required must be true or false")
        if required:
            entry["required"] = True
        if "default" in decl and decl["default"] is not None:
            entry["default"] = decl["default"]
        elif not required:
            wf.optional.add(str(key))
        if isinstance(decl.get("description"), str):
            entry["description"] = decl["description"]
        out[str(key)] = entry
    return out


def _recovery(wf: _Wf, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    recovery = wf.check.mapping(value, ("recovery",), "recovery")
    if recovery is None:
        return None
    wf.check.unknown_keys(recovery, {"retry"}, ("recovery",), "recovery", x_keys=True)
    if "retry" not in recovery:
        return None
    return _retry(wf, recovery["retry"], ("recovery", "retry"))


def _retry(wf: _Wf, value: Any, path: Path) -> dict[str, Any] | None:
    retry = wf.check.mapping(value, path, "retry")
    if retry is None:
        return None
    wf.check.unknown_keys(
        retry,
        {"attempts", "backoff", "delay", "multiplier", "max_delay"},
        path,
        "retry",
        x_keys=True,
    )
    attempts = wf.check.integer(retry, "attempts", path, lo=1, required=True)
    out: dict[str, Any] = {"max_attempts": attempts or 1}
    backoff: dict[str, Any] = {}
    for key, native in (("delay", "initial"), ("max_delay", "max")):
        if key in retry:
            if not isinstance(retry[key], str) or parse_duration(retry[key]) is None:
                wf.check.error((*path, key), "bad-duration", f"{key} must be a duration (10s, 1m)")
            else:
                backoff[native] = retry[key]
    if "multiplier" in retry:
        if not isinstance(retry["multiplier"], int | float) or retry["multiplier"] < 1:
            wf.check.error(
                (*path, "multiplier"), "invalid-value", "multiplier must be a number >= 1"
            )
        else:
            backoff["multiplier"] = retry["multiplier"]
    if backoff:
        out["backoff"] = backoff
    return out


def _triggers(wf: _Wf, out: Lowering, value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    triggers: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        path: Path = ("on", i) if isinstance(value, list) else ("on",)
        if isinstance(entry, str):
            entry = {"event": entry}
        if wf.check.mapping(entry, path, "a trigger") is None:
            continue
        wf.check.unknown_keys(
            entry, {"event", "filter", "with", "input"}, path, "a trigger", x_keys=True
        )
        event = wf.check.string(entry, "event", path, required=True)
        if event is None:
            continue
        trigger: dict[str, Any] = {"event": event}
        if isinstance(entry.get("filter"), dict):
            trigger["filter"] = entry["filter"]
        given = entry.get("with", entry.get("input"))
        if isinstance(given, dict):
            trigger["input"] = given
        out.at(("spec", "triggers", len(triggers)), path)
        triggers.append(trigger)
    return triggers


def _steps(wf: _Wf, body: list[Any]) -> list[tuple[str, dict[str, Any], Path]]:
    """(name, body, path) of each step; a stop step is named ``stop`` (its kind)."""
    out: list[tuple[str, dict[str, Any], Path]] = []
    seen: set[str] = set()
    for i, entry in enumerate(body):
        path: Path = ("steps", i)
        if not isinstance(entry, dict):
            wf.check.error(path, "wrong-type", "a step must be an object")
            continue
        keys = [k for k in entry if not str(k).startswith("x-")]
        if "name" in entry:
            name, step, spath = entry.get("name"), entry, path
        elif len(keys) == 1 and isinstance(entry[keys[0]], dict | type(None)):
            name, step, spath = keys[0], entry[keys[0]] or {}, (*path, keys[0])
        else:
            wf.check.error(
                path, "step-form", "a step is `- <name>: {...}` or an object with a `name`"
            )
            continue
        if not isinstance(name, str) or not STEP_NAME.match(name):
            wf.check.error(path, "bad-name", f"step name {name!r} must be an identifier")
            continue
        if name in seen:
            wf.check.error(path, "duplicate-step", f"step {name!r} is defined twice")
            continue
        seen.add(name)
        if name == "stop" and "name" not in entry:
            step = {**step, "stop": True}
        wf.check.unknown_keys(step, STEP_KEYS, spath, f"step {name!r}", x_keys=True)
        kinds = [k for k in (*WORK_KEYS, "stop") if step.get(k)]
        if len(kinds) != 1:
            wf.check.error(
                spath, "step-kind", f"step {name!r} needs exactly one of agent, tool, call or stop"
            )
            continue
        out.append((name, step, spath))
        if not step.get("stop"):
            wf.steps.append(name)
    return out


def _rewrite(wf: _Wf, source: str, path: Path, extra: frozenset[str]) -> str | None:
    """A Workfile expression in the native variables, or None (reported)."""
    known = {"inputs", "run", *wf.steps, *extra}
    if wf.events:
        known |= {"event", "data"}
    for name in top_level_names(source):
        if name.name not in known:
            wf.check.error(
                path,
                "expression",
                f"unknown name {name.name!r} in {source.strip()!r} "
                f"(known: {', '.join(sorted(known))})",
            )
            return None

    def change(name: Name, text: str) -> tuple[int, str] | None:
        if name.name in wf.waits:
            return len(name.name), f"context.{name.name}"
        if name.name in wf.steps and name.name not in ("inputs", "run"):
            return len(name.name), f"states.{name.name}.output"
        if name.name == "inputs" and name.fields and name.fields[0] in wf.optional:
            field = name.fields[0]
            end = text.find(field, name.start) + len(field)
            return end - name.start, f"(has(inputs.{field}) ? inputs.{field} : null)"
        return None

    cel = rewrite_cel(source.strip(), change)
    if "|" in cel.native.replace("||", ""):
        wf.check.error(path, "expression", "filters (`|`) are not supported: write CEL functions")
        return None
    if not check_cel(cel, wf.check, path, extra | {"iteration"}):
        return None
    return cel.native


def _value(
    wf: _Wf, value: Any, path: Path, *, outputs: bool = False, extra: frozenset[str] = frozenset()
) -> Any:
    """A Workfile value (literals, ``{{ }}`` templates) in the native form."""
    if isinstance(value, dict):
        return {
            k: _value(wf, v, (*path, k), outputs=outputs, extra=extra) for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _value(wf, v, (*path, i), outputs=outputs, extra=extra) for i, v in enumerate(value)
        ]
    if not isinstance(value, str) or "{{" not in value:
        return value
    whole = _WHOLE.match(value)
    if whole and "}}" not in whole.group(1):
        path_match = _PATH.match(whole.group(1))
        fields = path_match.group(2).lstrip(".").split(".") if path_match else []
        if path_match and path_match.group(1) in wf.waits and len(fields) == 1 and fields[0]:
            # A wait's result: the event that left it; null when it did not (or lacks it).
            where, key = f"context.{path_match.group(1)}", fields[0]
            return "{{ " + f'"{key}" in {where} ? {where}.{key} : null' + " }}"
        if path_match and path_match.group(1) in wf.steps and path_match.group(1) not in wf.waits:
            # A step's result: null when the step did not run (skipped, or a stop before it).
            return f"$.states.{path_match.group(1)}.output{path_match.group(2)}"
        native = _rewrite(wf, whole.group(1), path, extra)
        return "{{ " + (native or "null") + " }}"

    def each(match: re.Match[str]) -> str:
        native = _rewrite(wf, match.group(1), path, extra)
        return "{{ " + (native or "null") + " }}"

    return _TEMPLATE.sub(each, value)


def _condition(wf: _Wf, value: Any, path: Path) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        wf.check.error(path, "wrong-type", "when must be an expression")
        return None
    whole = _WHOLE.match(value)
    return _rewrite(wf, whole.group(1) if whole else value, path, frozenset())


def _action(
    wf: _Wf,
    out: Lowering,
    base: Path,
    step: dict[str, Any],
    spath: Path,
    recovery: dict[str, Any] | None,
) -> dict[str, Any]:
    action: dict[str, Any] = {}
    if step.get("call"):
        action["workflow"] = str(step["call"]).replace("_", "-")
        out.at((*base, "workflow"), (*spath, "call"))
    else:
        kind = "agent" if step.get("agent") else "tool"
        action["capability"] = str(step[kind])
        out.at((*base, "capability"), (*spath, kind))
    given = step.get("with", step.get("input"))
    action["input"] = (
        _value(wf, given, (*spath, "with" if "with" in step else "input"))
        if given is not None
        else {}
    )
    if "timeout" in step:
        action["timeout"] = step["timeout"]
        out.at((*base, "timeout"), (*spath, "timeout"))
    retry = _retry(wf, step["retry"], (*spath, "retry")) if "retry" in step else recovery
    if retry is not None and not step.get("call"):
        action["retry"] = retry
        if "retry" not in step:
            out.note((*base, "retry"), "the file's recovery.retry")
    return action


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "-end"
    taken.add(name)
    return name


def _lower_steps(
    wf: _Wf,
    out: Lowering,
    steps: list[tuple[str, dict[str, Any], Path]],
    projection: dict[str, Any],
    recovery: dict[str, Any] | None,
) -> tuple[str, dict[str, Any]]:
    taken = {s for s, _, _ in steps}
    done = _unique("done", taken)
    stopped = _unique("stopped", taken)
    states: dict[str, Any] = {}
    conditions = {
        name: _condition(wf, step["when"], (*spath, "when"))
        for name, step, spath in steps
        if "when" in step
    }

    def onward(after: int) -> list[dict[str, Any]]:
        """Where the run goes once steps[:after] are done: the first later step whose
        `when` holds (a stop step ends the run), else the end."""
        edges = []
        for name, step, _ in steps[after:]:
            target = stopped if step.get("stop") else name
            if name in conditions:
                edges.append({"event": "task.completed", "guard": conditions[name], "goto": target})
                continue
            edges.append({"event": "task.completed", "goto": target})
            return edges
        edges.append({"event": "task.completed", "goto": done})
        return edges

    for i, (name, step, spath) in enumerate(steps):
        if step.get("stop"):
            continue
        base: Path = ("spec", "states", name)
        out.at(base, spath)
        states[name] = {
            "actions": [_action(wf, out, (*base, "actions", 0), step, spath, recovery)],
            "on": onward(i + 1),
        }
    initial = steps[0][0] if steps and not steps[0][1].get("stop") else None
    if not steps or "when" in steps[0][1] or initial is None:
        # The first step is conditional: decide before it, with a map over nothing (it
        # completes at once and raises task.completed, whose guards choose the first step).
        start = _unique("start", taken)
        capability = next(
            (
                s["actions"][0].get("capability")
                for s in states.values()
                if s["actions"][0].get("capability")
            ),
            None,
        )
        if capability is None:
            capability = "workfile.noop"
        states[start] = {
            "description": "decide where the run starts (the first step is conditional)",
            "map": {"over": "[]", "as": "unused", "action": {"capability": capability}},
            "on": onward(0),
        }
        out.note(
            ("spec", "states", start),
            "the first step has `when`: this state decides where to start "
            "(an empty map completes at once)",
        )
        initial = start
    states[done] = {"type": "terminal", "outputs": projection}
    if any(step.get("stop") for _, step, _ in steps):
        states[stopped] = {"type": "terminal", "outputs": projection}
    out.note(
        ("spec", "states", done), "the file's outputs projection, rendered on every successful end"
    )
    return initial, states


def _lower_states(
    wf: _Wf,
    out: Lowering,
    states: dict[str, Any],
    projection: dict[str, Any],
    recovery: dict[str, Any] | None,
) -> tuple[str, dict[str, Any]]:
    native: dict[str, Any] = {}
    for name, body in states.items():
        spath: Path = ("states", name)
        base: Path = ("spec", "states", name)
        out.at(base, spath)
        if body is None:
            body = {}
        if wf.check.mapping(body, spath, f"state {name!r}") is None:
            continue
        wf.check.unknown_keys(body, STATE_KEYS, spath, f"state {name!r}", x_keys=True)
        state: dict[str, Any] = {}
        kind = body.get("type", "normal")
        if kind not in ("normal", "terminal", "wait", "human", "stop"):
            wf.check.error(
                (*spath, "type"),
                "invalid-value",
                "type must be normal, wait, human, terminal or stop",
            )
        if kind in ("terminal", "stop"):
            native[name] = {"type": "terminal", "outputs": projection}
            continue
        if kind == "human":
            state["type"] = "human_in_the_loop"
        works = [k for k in WORK_KEYS if body.get(k)]
        if len(works) > 1:
            wf.check.error(spath, "step-kind", f"state {name!r} sets {' and '.join(works)}")
        if works:
            state["actions"] = [_action(wf, out, (*base, "actions", 0), body, spath, recovery)]
        on: list[dict[str, Any]] = []
        raw_on = body.get("on") or []
        entries: list[tuple[Path, Any]] = []
        if isinstance(raw_on, dict):
            for key, value in raw_on.items():
                target = {"goto": value} if isinstance(value, str) else value
                if isinstance(target, dict):
                    target = {"event": key, **target}
                entries.append(((*spath, "on", key), target))
        elif isinstance(raw_on, list):
            entries = [((*spath, "on", j), entry) for j, entry in enumerate(raw_on)]
        else:
            wf.check.error((*spath, "on"), "wrong-type", "on must be a list or a mapping")
        for epath, entry in entries:
            if wf.check.mapping(entry, epath, "a transition") is None:
                continue
            wf.check.unknown_keys(
                entry, {"event", "when", "goto"}, epath, "a transition", x_keys=True
            )
            goto = wf.check.string(entry, "goto", epath, required=True)
            event = wf.check.string(entry, "event", epath, required=True)
            if goto is None or event is None:
                continue
            if goto not in states:
                wf.check.error((*epath, "goto"), "unknown-state", f"goto {goto!r} names no state")
            transition: dict[str, Any] = {"event": event, "goto": goto}
            if "when" in entry:
                guard = _condition(wf, entry["when"], (*epath, "when"))
                if guard is not None:
                    transition["guard"] = guard
            if name in wf.waits:
                transition["set"] = {name: "{{ data }}"}
            out.at((*base, "on", len(on)), epath)
            on.append(transition)
        if "next" in body:
            if not isinstance(body["next"], str) or body["next"] not in states:
                wf.check.error(
                    (*spath, "next"), "unknown-state", f"next {body['next']!r} names no state"
                )
            out.at((*base, "on", len(on)), (*spath, "next"))
            on.append({"event": "task.completed", "goto": body["next"]})
        if "timeout" in body and isinstance(body["timeout"], dict):
            timeout = body["timeout"]
            state["timeout"] = {"after": timeout.get("after"), "goto": timeout.get("goto")}
            if not isinstance(timeout.get("goto"), str) or timeout["goto"] not in states:
                wf.check.error((*spath, "timeout"), "unknown-state", "timeout.goto names no state")
            out.at((*base, "timeout"), (*spath, "timeout"))
            if state.get("actions"):
                state["actions"][0].pop("timeout", None)
        state["on"] = on
        native[name] = state
    return str(wf.src.data.get("initial")), native


def _agents(wf: _Wf, name: str, states: dict[str, Any], lowered: Lowered) -> list[Document]:
    capabilities: list[str] = []
    for state in states.values():
        for action in state.get("actions", []):
            cap = action.get("capability")
            if cap and cap not in capabilities:
                capabilities.append(cap)
    if not capabilities:
        return []
    low = Lowering(wf.src, DIALECT)
    low.note(("metadata",), "implied by the agents and tools the Workfile names")
    data = agent_def(f"{name}-agents"[:63], ((c, f"used by Workfile {name}") for c in capabilities))
    return [low.finish(data, lowered)]


__all__ = ["DIALECT", "Span", "detect", "lower"]
