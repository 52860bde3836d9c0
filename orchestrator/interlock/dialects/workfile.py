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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path, Span
from interlock.dialects.base import API_VERSION, Lowered, Lowering, agent_def
from interlock.dialects.workfile_parts import (
    DIALECT,
    NAME,
    STEP_NAME,
    SUPPORTED,
    TOP_KEYS,
    WORK_KEYS,
    Workfile,
    lower_inputs,
    lower_recovery,
    lower_triggers,
    lower_value,
    read_steps,
)
from interlock.dialects.workfile_states import lower_states, lower_steps


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


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    wf = Workfile(src, diags)
    check = wf.check
    before = len(diags)
    data = src.data
    if not isinstance(data, dict):
        check.error((), "wrong-type", "a Workfile must be a mapping")
        return None
    fmt, name = _header(wf, data)
    has_steps, has_states = "steps" in data, "states" in data
    inputs = lower_inputs(wf, data.get("inputs"))
    if has_steps and not has_states:
        body = check.items(data["steps"], ("steps",), "steps")
        steps = read_steps(wf, body) if body is not None else []
    else:
        steps = []
    states: dict[str, Any] = {}
    if has_states and not has_steps:
        states = _states_form(wf, data)
    outputs = _outputs(wf, data)
    recovery = lower_recovery(wf, data.get("recovery"))
    if len(diags) != before:
        return None
    return _workflow(wf, data, fmt, name, inputs, steps, states, outputs, recovery, before)


def _header(wf: Workfile, data: dict[str, Any]) -> tuple[Any, str | None]:
    """The Workfile's top-level keys checked; its format version and name."""
    check = wf.check
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
    return fmt, name


def _states_form(wf: Workfile, data: dict[str, Any]) -> dict[str, Any]:
    """The states of the states form, their names and ``initial`` checked."""
    check = wf.check
    states = check.mapping(data["states"], ("states",), "states") or {}
    wf.steps = [str(k) for k in states]
    wf.calls = {
        str(k): str(v["call"]) for k, v in states.items() if isinstance(v, dict) and v.get("call")
    }
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
    return states


def _outputs(wf: Workfile, data: dict[str, Any]) -> Any:
    """The ``outputs`` projection, its names checked."""
    check = wf.check
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
    return outputs


def _workflow(
    wf: Workfile,
    data: dict[str, Any],
    fmt: Any,
    name: str | None,
    inputs: dict[str, Any],
    steps: list[tuple[str, dict[str, Any], Path]],
    states: dict[str, Any],
    outputs: Any,
    recovery: dict[str, Any] | None,
    before: int,
) -> Lowered | None:
    """The native workflow and AgentDef of a checked Workfile."""
    src = wf.src
    lowered = Lowered(DIALECT, src)
    out = Lowering(src, DIALECT)
    stem = re.sub(r"[^a-z0-9]+", "-", _file_stem(src.path)).strip("-") or "workfile"
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
    triggers = lower_triggers(wf, out, data.get("on"))
    if triggers:
        spec["triggers"] = triggers
    projection = {
        str(k): lower_value(wf, v, ("outputs", k), outputs=True) for k, v in outputs.items()
    }
    if "steps" in data:
        initial, native_states = lower_steps(wf, out, steps, projection, recovery)
    else:
        initial, native_states = lower_states(wf, out, states, projection, recovery)
        out.at(("spec", "initial_state"), ("initial",))
    spec["initial_state"] = initial
    spec["states"] = native_states
    native = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata, "spec": spec}
    if len(wf.check.diags) != before:
        return None
    lowered.workflows.append(out.finish(native, lowered))
    lowered.agents.extend(_agents(wf, native_name, native_states, lowered))
    lowered.extra["workfile"] = Called(
        name=native_name,
        outputs=frozenset(str(k) for k in outputs),
        calls={step: callee.replace("_", "-") for step, callee in wf.calls.items()},
        reads=list(wf.call_reads),
    )
    return lowered


@dataclass(frozen=True, slots=True)
class Called:
    """What a Workfile declares for those that call it, and what it reads of its calls."""

    name: str
    """Its workflow name (``metadata.name``)."""
    outputs: frozenset[str]
    """The outputs it declares (none: its result is empty)."""
    calls: dict[str, str]
    """Each call step: the workflow it calls."""
    reads: list[tuple[str, str, Path]]
    """Each path into a call step's result: (step, output, where)."""


def check_calls(
    files: list[Lowered],
    diags: list[Diagnostic],
    stored: Mapping[str, frozenset[str]] | None = None,
) -> None:
    """A path into the result of a call to a Workfile must name one of its outputs; into a
    Workfile that declares none, any path is an error (its result is empty). The called
    Workfile is one given alongside, else one in ``stored`` (its outputs, by workflow
    name); a call to any other workflow is not checked."""
    known = {c.name: c.outputs for item in files if isinstance(c := _called(item), Called)}
    known = {**(stored or {}), **known}
    for item in files:
        caller = _called(item)
        if caller is None:
            continue
        for step, output, path in caller.reads:
            name = caller.calls[step]
            outputs = known.get(name)
            if outputs is None or output in outputs:
                continue
            if not outputs:
                message = (
                    f"{step}.{output}: the called Workfile {name} declares no outputs "
                    "(its result is empty)"
                )
            else:
                message = (
                    f"{step}.{output}: the called Workfile {name} has no output "
                    f"{output!r} (it declares: {', '.join(sorted(outputs))})"
                )
            diags.append(item.source.diag(path, f"{DIALECT}.call-outputs", message))


def _called(item: Lowered) -> Called | None:
    found = item.extra.get("workfile")
    return found if isinstance(found, Called) else None


def called_elsewhere(files: list[Lowered]) -> set[str]:
    """The workflows the Workfiles of ``files`` call and read the result of, that are not
    among ``files`` (to be looked up where they are stored)."""
    given = {c.name for item in files if (c := _called(item)) is not None}
    wanted: set[str] = set()
    for item in files:
        caller = _called(item)
        if caller is not None:
            wanted |= {caller.calls[step] for step, _, _ in caller.reads}
    return wanted - given


def declared_outputs(manifest: Mapping[str, Any]) -> frozenset[str] | None:
    """The outputs a stored workflow lowered from a Workfile declares (every successful
    end renders the same projection), or None when it is not a Workfile's."""
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return None
    context = spec.get("context")
    if not isinstance(context, Mapping) or not isinstance(context.get("workfile"), Mapping):
        return None
    states = spec.get("states")
    names: set[str] = set()
    for state in states.values() if isinstance(states, Mapping) else ():
        if isinstance(state, Mapping) and state.get("type") == "terminal":
            outputs = state.get("outputs")
            names |= {str(k) for k in outputs} if isinstance(outputs, Mapping) else set()
    return frozenset(names)


def _agents(wf: Workfile, name: str, states: dict[str, Any], lowered: Lowered) -> list[Document]:
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


__all__ = [
    "DIALECT",
    "Called",
    "Span",
    "called_elsewhere",
    "check_calls",
    "declared_outputs",
    "detect",
    "lower",
]


_SUFFIXES = (".yaml", ".yml", ".json", ".workfile")


def _file_stem(path: str) -> str:
    """A file's name without the suffixes a Workfile is named with: ``inbox_triage``
    for ``inbox_triage.workfile``, ``inbox_triage.workfile.yaml`` or ``inbox_triage.yml``."""
    name = PurePath(path).name.lower()
    while name.endswith(_SUFFIXES) and "." in name.lstrip("."):
        name = name[: name.rindex(".")]
    return name
