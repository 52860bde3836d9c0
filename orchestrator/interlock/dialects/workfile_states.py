"""A Workfile's two forms as native states: the steps form (steps in order, ``when`` to
skip one, ``stop`` to end the run, a decision state when the first step is conditional)
and the states form (a state machine already: each state's work, then its ``on`` events,
its ``next`` or its timeout).
"""

from __future__ import annotations

from typing import Any

from interlock.core.source import Path
from interlock.dialects.base import Lowering
from interlock.dialects.workfile_parts import (
    STATE_KEYS,
    WORK_KEYS,
    Workfile,
    lower_action,
    lower_condition,
)


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "-end"
    taken.add(name)
    return name


def lower_steps(
    wf: Workfile,
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
        name: lower_condition(wf, step["when"], (*spath, "when"))
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
            "actions": [lower_action(wf, out, (*base, "actions", 0), step, spath, recovery)],
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


def lower_states(
    wf: Workfile,
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
            state["actions"] = [lower_action(wf, out, (*base, "actions", 0), body, spath, recovery)]
        on = _events(wf, out, name, body, states)
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


def _events(
    wf: Workfile, out: Lowering, name: str, body: dict[str, Any], states: dict[str, Any]
) -> list[dict[str, Any]]:
    """A state's ``on`` (a list, or a mapping by event) as native transitions."""
    spath: Path = ("states", name)
    base: Path = ("spec", "states", name)
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
        wf.check.unknown_keys(entry, {"event", "when", "goto"}, epath, "a transition", x_keys=True)
        goto = wf.check.string(entry, "goto", epath, required=True)
        event = wf.check.string(entry, "event", epath, required=True)
        if goto is None or event is None:
            continue
        if goto not in states:
            wf.check.error((*epath, "goto"), "unknown-state", f"goto {goto!r} names no state")
        transition: dict[str, Any] = {"event": event, "goto": goto}
        if "when" in entry:
            guard = lower_condition(wf, entry["when"], (*epath, "when"))
            if guard is not None:
                transition["guard"] = guard
        if name in wf.waits:
            transition["set"] = {name: "{{ data }}"}
        out.at((*base, "on", len(on)), epath)
        on.append(transition)
    return on
