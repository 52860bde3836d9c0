"""ctxmesh's ``Workflow`` custom resource (``agents.ctxmesh.ai/v1beta1``), loaded as written.

Each step becomes a state; ``agentRef`` becomes the capability of the state's action (the
AgentDef implied is named like the AgentDeployment and carries the step's
``outputSchema``); ``next``/``branches``/``default`` become ``task.completed`` transitions,
``catch``/``onError`` ``catch`` entries (failure *codes* such as ``tool_error``
route with ``codes``, not only classes), ``map`` and ``loop`` the native constructs, and
the budget the native budget. CEL reads ctxmesh's variables (``input``,
``steps.<name>.output``), rewritten to the native ones (``inputs``, ``states.<name>.output``).

The controller's load-time rules are checked with rule ids ``ctxmesh.<rule>``.
"""

from __future__ import annotations

import re
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import Document, Path
from interlock.core.vocabulary import ERROR_CLASSES
from interlock.dialects.base import (
    API_VERSION,
    Cel,
    Checker,
    Lowered,
    Lowering,
    Name,
    agent_def,
    check_cel,
    rewrite_cel,
    template,
)

DIALECT = "ctxmesh"
API_VERSIONS = ("agents.ctxmesh.ai/v1beta1",)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
STEP_KEYS = {
    "name",
    "agentRef",
    "input",
    "outputSchema",
    "retries",
    "next",
    "branches",
    "default",
    "onError",
    "catch",
    "map",
    "loop",
}
SPEC_KEYS = {"registryRef", "inputSchema", "steps", "budget"}
EDGE_KINDS = ("next", "branches", "map", "loop")
DONE = "done"
"""The terminal state every path that ends (``next: ""``, no edge) goes to."""

_JSON_TYPES = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "object": "object",
    "array": "list",
}


def detect(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("apiVersion") in API_VERSIONS
        and data.get("kind") == "Workflow"
    )


class _Ctx:
    def __init__(self, src: Document, diags: list[Diagnostic]) -> None:
        self.src = src
        self.check = Checker(src, DIALECT, diags)
        self.diags = diags
        self.steps: dict[str, tuple[int, dict[str, Any]]] = {}
        self.owner: dict[str, str] = {}
        """A map's or loop's `do` step -> the map/loop step that runs it."""


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    """Check a ctxmesh Workflow and lower it; None (with diagnostics) when it is invalid."""
    ctx = _Ctx(src, diags)
    before = len(diags)
    check = ctx.check
    data = src.data
    if not isinstance(data, dict):
        check.error((), "wrong-type", "a ctxmesh Workflow must be an object")
        return None
    if data.get("apiVersion") not in API_VERSIONS or data.get("kind") != "Workflow":
        check.error(
            ("apiVersion",),
            "invalid-value",
            f"expected apiVersion {API_VERSIONS[0]} and kind Workflow",
        )
    check.unknown_keys(data, {"apiVersion", "kind", "metadata", "spec", "status"}, (), "Workflow")
    meta = check.mapping(data.get("metadata", {}), ("metadata",), "metadata") or {}
    name = check.string(
        meta, "name", ("metadata",), required=True, pattern=DNS_LABEL, form="a DNS label"
    )
    namespace = check.string(
        meta, "namespace", ("metadata",), pattern=DNS_LABEL, form="a DNS label"
    )
    if "spec" not in data:
        check.error((), "missing-field", "missing required field 'spec'")
        return None
    spec = check.mapping(data["spec"], ("spec",), "spec")
    if spec is None:
        return None
    check.unknown_keys(spec, SPEC_KEYS, ("spec",), "spec")
    check.string(
        spec, "registryRef", ("spec",), required=True, pattern=DNS_LABEL, form="a DNS label"
    )
    if "inputSchema" in spec:
        check.mapping(spec["inputSchema"], ("spec", "inputSchema"), "inputSchema")
    budget = _budget(ctx, spec)
    if "steps" not in spec:
        check.error(("spec",), "missing-field", "missing required field 'steps'")
        return None
    steps = check.items(spec["steps"], ("spec", "steps"), "steps")
    if steps is None:
        return None
    if not 1 <= len(steps) <= 128:
        check.error(("spec", "steps"), "invalid-value", "steps must hold 1 to 128 steps")
    for i, step in enumerate(steps):
        path: Path = ("spec", "steps", i)
        if not isinstance(step, dict):
            check.error(path, "wrong-type", "a step must be an object")
            continue
        step_name = check.string(
            step, "name", path, required=True, pattern=DNS_LABEL, form="a DNS label"
        )
        if step_name is None:
            continue
        if step_name in ctx.steps:
            check.error(
                (*path, "name"),
                "duplicate-step",
                f"step {step_name!r} is defined twice (first at step {ctx.steps[step_name][0]})",
            )
            continue
        ctx.steps[step_name] = (i, step)
    for step_name, (i, step) in ctx.steps.items():
        _check_step(ctx, step_name, i, step)
    _check_output_schemas(ctx)
    if len(diags) != before or name is None:
        return None
    return _lower(ctx, name, namespace, spec, budget)


# --- checks -------------------------------------------------------------------------------


def _budget(ctx: _Ctx, spec: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    if "budget" not in spec or spec["budget"] is None:
        return out
    budget = ctx.check.mapping(spec["budget"], ("spec", "budget"), "budget")
    if budget is None:
        return out
    path: Path = ("spec", "budget")
    ctx.check.unknown_keys(budget, {"maxFanOut", "maxSpawnDepth", "maxTotalSpawns"}, path, "budget")
    for key in ("maxFanOut", "maxSpawnDepth", "maxTotalSpawns"):
        value = ctx.check.integer(budget, key, path, lo=1 if key != "maxSpawnDepth" else 0)
        if value is not None:
            out[key] = value
    return out


def _target(ctx: _Ctx, value: Any, path: Path, what: str, *, empty_ok: bool) -> None:
    if not isinstance(value, str):
        ctx.check.error(path, "wrong-type", f"{what} must be a string")
        return
    if value == "" and empty_ok:
        return
    if not DNS_LABEL.match(value):
        ctx.check.error(path, "invalid-value", f"{what} {value!r} must be a DNS label")
    elif value not in ctx.steps:
        ctx.check.error(path, "unknown-step", f"{what} {value!r} names no step")


def _check_step(ctx: _Ctx, name: str, i: int, step: dict[str, Any]) -> None:
    check = ctx.check
    path: Path = ("spec", "steps", i)
    check.unknown_keys(step, STEP_KEYS, path, f"step {name!r}")
    kinds = [k for k in EDGE_KINDS if k in step and not (k == "next" and step[k] == "")]
    if len(kinds) > 1:
        check.error(
            (*path, kinds[1]),
            "edge-kind",
            f"step {name!r} sets {' and '.join(kinds)}: exactly one of next, branches, map "
            "or loop per step (none: the step is terminal)",
            key=True,
        )
    if "default" in step and "branches" not in step:
        check.error(
            (*path, "default"), "edge-kind", "default is only meaningful with branches", key=True
        )
    is_node = "map" in step or "loop" in step
    if not is_node:
        check.string(step, "agentRef", path, required=True, pattern=DNS_LABEL, form="a DNS label")
    elif "agentRef" in step:
        check.string(step, "agentRef", path, pattern=DNS_LABEL, form="a DNS label")
    if is_node and step.get("onError"):
        check.error(
            (*path, "onError"),
            "onerror-node",
            "onError is not supported on map/loop nodes (use catch)",
            key=True,
        )
    check.integer(step, "retries", path, lo=0, hi=2**31 - 1)
    if "outputSchema" in step:
        check.mapping(step["outputSchema"], (*path, "outputSchema"), "outputSchema")
    if "input" in step:
        inputs = check.mapping(step["input"], (*path, "input"), "input")
        for key, value in (inputs or {}).items():
            if not isinstance(value, str):
                check.error((*path, "input", key), "wrong-type", "an input value must be CEL text")
                continue
            _cel(ctx, value, (*path, "input", key), owner_of=name)
    if "next" in step:
        _target(ctx, step["next"], (*path, "next"), "next", empty_ok=True)
    if "default" in step:
        _target(ctx, step["default"], (*path, "default"), "default", empty_ok=True)
    if "onError" in step and step["onError"] != "":
        _target(ctx, step["onError"], (*path, "onError"), "onError", empty_ok=True)
    if "branches" in step:
        branches = check.items(step["branches"], (*path, "branches"), "branches") or []
        if len(branches) > 64:
            check.error((*path, "branches"), "invalid-value", "at most 64 branches")
        for j, branch in enumerate(branches):
            bpath: Path = (*path, "branches", j)
            if check.mapping(branch, bpath, "a branch") is None:
                continue
            check.unknown_keys(branch, {"when", "to"}, bpath, "a branch")
            when = check.string(branch, "when", bpath, required=True, min_len=1, max_len=4096)
            if when is not None:
                _cel(ctx, when, (*bpath, "when"), owner_of=name)
            if "to" not in branch:
                check.error(bpath, "missing-field", "missing required field 'to'")
            else:
                _target(ctx, branch["to"], (*bpath, "to"), "to", empty_ok=False)
    if "catch" in step:
        catches = check.items(step["catch"], (*path, "catch"), "catch") or []
        for j, entry in enumerate(catches):
            cpath: Path = (*path, "catch", j)
            if check.mapping(entry, cpath, "a catch entry") is None:
                continue
            check.unknown_keys(entry, {"errors", "next"}, cpath, "a catch entry")
            errors = entry.get("errors")
            if not isinstance(errors, list) or not errors:
                check.error(
                    (*cpath, "errors") if "errors" in entry else cpath,
                    "missing-field" if "errors" not in entry else "invalid-value",
                    "catch errors must list at least one failure code (or *)",
                )
            elif not all(isinstance(e, str) and e for e in errors):
                check.error((*cpath, "errors"), "wrong-type", "failure codes must be strings")
            if "next" not in entry:
                check.error(cpath, "missing-field", "missing required field 'next'")
            else:
                _target(ctx, entry["next"], (*cpath, "next"), "catch next", empty_ok=False)
    if "map" in step:
        _check_map(ctx, name, path, step["map"])
    if "loop" in step:
        _check_loop(ctx, name, path, step["loop"])


def _check_map(ctx: _Ctx, name: str, path: Path, value: Any) -> None:
    check = ctx.check
    mpath: Path = (*path, "map")
    spec = check.mapping(value, mpath, "map")
    if spec is None:
        return
    check.unknown_keys(
        spec, {"over", "as", "parallelism", "do", "join", "completion"}, mpath, "map"
    )
    over = check.string(spec, "over", mpath, required=True, min_len=1, max_len=4096)
    alias = check.string(spec, "as", mpath, required=True, pattern=DNS_LABEL, form="a DNS label")
    check.integer(spec, "parallelism", mpath, lo=1)
    if "do" not in spec:
        check.error(mpath, "missing-field", "missing required field 'do'")
    else:
        _target(ctx, spec["do"], (*mpath, "do"), "map.do", empty_ok=False)
        if isinstance(spec["do"], str) and spec["do"] in ctx.steps:
            ctx.owner.setdefault(spec["do"], name)
    if "join" in spec:
        _target(ctx, spec["join"], (*mpath, "join"), "map.join", empty_ok=False)
    if "completion" in spec and spec["completion"] not in ("all", "any"):
        check.error((*mpath, "completion"), "invalid-value", "completion must be all or any")
    if over is not None:
        _cel(ctx, over, (*mpath, "over"), owner_of=name)
    if alias is not None and "-" in alias:
        check.error((*mpath, "as"), "invalid-value", f"as {alias!r} cannot be read in CEL (a '-')")


def _check_loop(ctx: _Ctx, name: str, path: Path, value: Any) -> None:
    check = ctx.check
    lpath: Path = (*path, "loop")
    spec = check.mapping(value, lpath, "loop")
    if spec is None:
        return
    check.unknown_keys(spec, {"until", "maxIterations", "do"}, lpath, "loop")
    until = check.string(spec, "until", lpath, required=True, min_len=1, max_len=4096)
    check.integer(spec, "maxIterations", lpath, lo=1, required=True)
    if "do" not in spec:
        check.error(lpath, "missing-field", "missing required field 'do'")
    else:
        _target(ctx, spec["do"], (*lpath, "do"), "loop.do", empty_ok=False)
        if isinstance(spec["do"], str) and spec["do"] in ctx.steps:
            ctx.owner.setdefault(spec["do"], name)
    if until is not None:
        _cel(ctx, until, (*lpath, "until"), owner_of=name)


def _map_alias(ctx: _Ctx, step: str) -> frozenset[str]:
    """The variables a `do` step's input may read besides input/steps: the map's `as`."""
    owner = ctx.owner.get(step)
    if owner is None:
        return frozenset()
    spec = ctx.steps[owner][1].get("map")
    if isinstance(spec, dict) and isinstance(spec.get("as"), str):
        return frozenset({spec["as"], "index"})
    return frozenset()


def _cel(ctx: _Ctx, source: str, path: Path, *, owner_of: str) -> Cel | None:
    """Check one ctxmesh CEL expression (its variables, that it compiles)."""
    allowed = {"input", "steps"} | _map_alias(ctx, owner_of)
    ok = True
    for name in _names(source):
        if name.name not in allowed:
            ctx.check.at_span(
                _span_in(ctx.src, path, name.start),
                "cel",
                f"unknown variable {name.name!r} (known: {', '.join(sorted(allowed))})",
            )
            ok = False
        elif name.name == "steps" and name.fields and name.fields[0] not in ctx.steps:
            ctx.check.at_span(
                _span_in(ctx.src, path, name.start),
                "unknown-step",
                f"steps.{name.fields[0]} names no step",
            )
            ok = False
    if not ok:
        return None
    cel = _rewrite(ctx, source, in_loop=None)
    extra = _map_alias(ctx, owner_of) | {"iteration"}
    return cel if check_cel(cel, ctx.check, path, extra) else None


def _names(source: str) -> list[Name]:
    from interlock.dialects.base import top_level_names

    return top_level_names(source)


def _span_in(src: Document, path: Path, offset: int) -> Any:
    from interlock.core.source import Span

    span = src.where(path)
    lead = 1 if span.style in ("'", '"') else 0
    return Span(span.line, span.col + lead + offset)


def _check_output_schemas(ctx: _Ctx) -> None:
    """A step whose output another step reads (when, input, map.over) pins an outputSchema."""
    for name, (i, step) in ctx.steps.items():
        for path, source in _expressions(i, step):
            for ref in _names(source):
                if ref.name != "steps" or not ref.fields or ref.fields[0] not in ctx.steps:
                    continue
                target = ref.fields[0]
                if target == name and "loop" in step:
                    continue
                if "outputSchema" not in ctx.steps[target][1] and not _is_node(ctx, target):
                    ctx.check.at_span(
                        _span_in(ctx.src, path, ref.start),
                        "output-schema",
                        f"step {name!r} reads steps.{target}.output, so step {target!r} "
                        "must declare an outputSchema",
                    )


def _is_node(ctx: _Ctx, name: str) -> bool:
    step = ctx.steps[name][1]
    return "map" in step or "loop" in step


def _expressions(i: int, step: dict[str, Any]) -> list[tuple[Path, str]]:
    path: Path = ("spec", "steps", i)
    out: list[tuple[Path, str]] = []
    for key, value in (
        (step.get("input") or {}).items() if isinstance(step.get("input"), dict) else ()
    ):
        if isinstance(value, str):
            out.append(((*path, "input", key), value))
    branches = step.get("branches") or []
    for j, branch in enumerate(branches if isinstance(branches, list) else []):
        if isinstance(branch, dict) and isinstance(branch.get("when"), str):
            out.append(((*path, "branches", j, "when"), branch["when"]))
    spec = step.get("map")
    if isinstance(spec, dict) and isinstance(spec.get("over"), str):
        out.append(((*path, "map", "over"), spec["over"]))
    return out


# --- lowering -----------------------------------------------------------------------------


def _rewrite(ctx: _Ctx, source: str, in_loop: str | None) -> Cel:
    """``input`` -> ``inputs``; ``steps.X`` -> ``states.X`` (a `do` step's output is its
    map/loop state's; inside a loop's `until`, the `do` step's output is ``result``)."""

    def change(name: Name, text: str) -> tuple[int, str] | None:
        if name.name == "input":
            return len("input"), "inputs"
        if name.name == "steps" and name.fields:
            target = name.fields[0]
            if in_loop is not None and ctx.owner.get(target) == in_loop and len(name.fields) > 1:
                # steps.<do>.output -> result
                head = text.find("output", name.start)
                return head + len("output") - name.start, "result"
            owner = ctx.owner.get(target, target)
            if owner != target:
                head = text.find(target, name.start)
                return head + len(target) - name.start, f"states.{owner}"
            return len("steps"), "states"
        return None

    return rewrite_cel(source, change)


def _lower(
    ctx: _Ctx, name: str, namespace: str | None, spec: dict[str, Any], budget: dict[str, int]
) -> Lowered:
    src = ctx.src
    lowered = Lowered(DIALECT, src)
    out = Lowering(src, DIALECT)
    states: dict[str, Any] = {}
    done = DONE
    while done in ctx.steps:
        done += "_"
    emitted = [s for s in ctx.steps if s not in ctx.owner or _referenced_as_edge(ctx, s)]
    first = next(iter(ctx.steps))
    initial = first if first not in ctx.owner or _referenced_as_edge(ctx, first) else emitted[0]
    schemas: dict[str, list[Any]] = {}
    for step_name in ctx.steps:
        i, step = ctx.steps[step_name]
        if "agentRef" in step and isinstance(step.get("agentRef"), str):
            schemas.setdefault(step["agentRef"], [])
            if "outputSchema" in step and step["outputSchema"] not in schemas[step["agentRef"]]:
                schemas[step["agentRef"]].append(step["outputSchema"])
    for step_name in emitted:
        i, step = ctx.steps[step_name]
        base: Path = ("spec", "states", step_name)
        out.at(base, ("spec", "steps", i))
        states[step_name] = _state(ctx, out, step_name, i, step, done)
    states[done] = {
        "type": "terminal",
        "outputs": {"step": "{{ context.step }}", "output": "{{ context.output }}"},
    }
    out.at(("spec", "states", done), ("spec",))
    out.note(
        ("spec", "states", done),
        'ctxmesh has no workflow outputs: every path that ends (next: "" or no edge) comes '
        "here, with the name and the output of the step it ended on",
    )
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    meta_src = src.data.get("metadata") or {}
    for key in ("labels", "annotations"):
        if isinstance(meta_src.get(key), dict):
            metadata[key] = {str(k): str(v) for k, v in meta_src[key].items()}
    native_spec: dict[str, Any] = {}
    inputs = _inputs(out, spec.get("inputSchema"))
    if inputs:
        native_spec["inputs"] = inputs
    native_budget: dict[str, int] = {}
    if "maxFanOut" in budget:
        native_budget["max_fan_out"] = budget["maxFanOut"]
        out.at(("spec", "budget", "max_fan_out"), ("spec", "budget", "maxFanOut"))
    if "maxTotalSpawns" in budget:
        native_budget["max_actions"] = budget["maxTotalSpawns"]
        out.at(("spec", "budget", "max_actions"), ("spec", "budget", "maxTotalSpawns"))
        out.note(
            ("spec", "budget"),
            "maxTotalSpawns -> max_actions: every node launch (retries, map items and loop "
            "iterations included) counts",
        )
    if "maxSpawnDepth" in budget:
        out.note(
            ("spec", "budget"),
            f"maxSpawnDepth {budget['maxSpawnDepth']}: a workflow's nodes are actions of one "
            "run (depth 1); nothing here spawns deeper",
        )
    if native_budget:
        native_spec["budget"] = native_budget
    native_spec["initial_state"] = initial
    out.at(("spec", "initial_state"), ("spec", "steps", 0, "name"))
    native_spec["states"] = states
    out.at(("spec", "states"), ("spec", "steps"))
    data = {
        "apiVersion": API_VERSION,
        "kind": "Workflow",
        "metadata": metadata,
        "spec": native_spec,
    }
    out.note(
        ("metadata",),
        f"converted from ctxmesh {src.data.get('apiVersion')} Workflow; registryRef "
        f"{spec.get('registryRef')!r}: the capabilities below must be declared by the "
        "AgentDefs of that registry",
    )
    lowered.workflows.append(out.finish(data, lowered))
    lowered.agents.extend(_agents(ctx, namespace, schemas, lowered))
    return lowered


def _referenced_as_edge(ctx: _Ctx, step: str) -> bool:
    """A `do` step that some edge also goes to is a state of its own too."""
    for other, (_, data) in ctx.steps.items():
        if other == step:
            continue
        targets = [data.get("next"), data.get("default"), data.get("onError")]
        targets += [b.get("to") for b in data.get("branches") or [] if isinstance(b, dict)]
        targets += [c.get("next") for c in data.get("catch") or [] if isinstance(c, dict)]
        if isinstance(data.get("map"), dict):
            targets.append(data["map"].get("join"))
        if step in targets:
            return True
    return False


def _action(ctx: _Ctx, out: Lowering, base: Path, i: int, step: dict[str, Any]) -> dict[str, Any]:
    path: Path = ("spec", "steps", i)
    action: dict[str, Any] = {"capability": step["agentRef"]}
    out.at((*base, "capability"), (*path, "agentRef"))
    inputs = step.get("input") or {}
    action["input"] = {}
    for key, source in inputs.items():
        action["input"][key] = template(_rewrite(ctx, source, None).native)
        out.at((*base, "input", key), (*path, "input", key))
    if not inputs:
        out.note((*base, "input"), "the step maps no input: the agent gets an empty object")
    retries = step.get("retries", 0)
    if retries:
        action["retry"] = {"max_attempts": retries + 1}
        out.at((*base, "retry"), (*path, "retries"))
        out.note(
            (*base, "retry"),
            f"retries: {retries} -> {retries + 1} attempts; only retryable failures (timeout, "
            "platform_error, or marked retryable by the agent) are retried",
        )
    return action


def _state(
    ctx: _Ctx, out: Lowering, name: str, i: int, step: dict[str, Any], done: str
) -> dict[str, Any]:
    path: Path = ("spec", "steps", i)
    base: Path = ("spec", "states", name)
    state: dict[str, Any] = {}
    on: list[dict[str, Any]] = []
    if "map" in step:
        spec = step["map"]
        do_i, do_step = ctx.steps[spec["do"]]
        action = _action(ctx, out, (*base, "map", "action"), do_i, do_step)
        action.pop("output", None)
        parallelism = spec.get("parallelism", 1)
        state["map"] = {
            "over": _rewrite(ctx, spec["over"], None).native,
            "as": spec["as"],
            "parallelism": parallelism,
            "completion": spec.get("completion", "all"),
            "action": action,
        }
        for key in ("over", "as", "parallelism", "completion"):
            out.at((*base, "map", key), (*path, "map", key))
        out.at((*base, "map", "action"), (*path, "map", "do"))
        if "parallelism" not in spec:
            out.note((*base, "map", "parallelism"), "ctxmesh's default parallelism is 1")
        join = spec.get("join")
        on.append(_goto(ctx, join, done, name))
        out.at((*base, "on", 0), (*path, "map", "join") if join else (*path, "map"))
        if join is None:
            out.note((*base, "on"), "a map without join ends the workflow with the list of outputs")
    elif "loop" in step:
        spec = step["loop"]
        do_i, do_step = ctx.steps[spec["do"]]
        state["loop"] = {
            "until": _rewrite(ctx, spec["until"], name).native,
            "max_iterations": spec["maxIterations"],
            "action": _action(ctx, out, (*base, "loop", "action"), do_i, do_step),
        }
        for key, orig in (("until", "until"), ("max_iterations", "maxIterations")):
            out.at((*base, "loop", key), (*path, "loop", orig))
        out.at((*base, "loop", "action"), (*path, "loop", "do"))
        on.append(_goto(ctx, None, done, name))
        out.note(
            (*base, "loop"),
            "when until holds the workflow ends with the last iteration's output; out of "
            "maxIterations the step fails with budget_exceeded (catch can route it)",
        )
    else:
        state["actions"] = [_action(ctx, out, (*base, "actions", 0), i, step)]
        out.at((*base, "actions"), (*path, "agentRef"))
        if "branches" in step:
            for j, branch in enumerate(step["branches"]):
                entry = {
                    "event": "task.completed",
                    "guard": _rewrite(ctx, branch["when"], None).native,
                    "goto": branch["to"],
                }
                out.at((*base, "on", len(on)), (*path, "branches", j))
                out.at((*base, "on", len(on), "guard"), (*path, "branches", j, "when"))
                out.at((*base, "on", len(on), "goto"), (*path, "branches", j, "to"))
                on.append(entry)
            out.at((*base, "on", len(on)), (*path, "default") if "default" in step else path)
            on.append(_goto(ctx, step.get("default") or None, done, name))
        else:
            out.at((*base, "on", 0), (*path, "next") if "next" in step else path)
            on.append(_goto(ctx, step.get("next") or None, done, name))
    catches: list[dict[str, Any]] = []
    for j, entry in enumerate(step.get("catch") or []):
        for native in _catch(entry["errors"], entry["next"]):
            out.at((*base, "catch", len(catches)), (*path, "catch", j))
            catches.append(native)
    if step.get("onError"):
        out.at((*base, "catch", len(catches)), (*path, "onError"))
        catches.append({"errors": ["*"], "goto": step["onError"]})
    if catches:
        state["catch"] = catches
        out.note(
            (*base, "catch"),
            "catch/onError, in order: a failure code that is an error class matches the class; "
            "any other (tool_error, guardrail_denied) the agent's own code (codes)",
        )
    state["on"] = on
    return state


def _goto(ctx: _Ctx, target: str | None, done: str, name: str) -> dict[str, Any]:
    if target:
        return {"event": "task.completed", "goto": target}
    return {
        "event": "task.completed",
        "goto": done,
        "set": {"step": name, "output": f"$.states.{name}.output"},
    }


def _catch(errors: list[str], target: str) -> list[dict[str, Any]]:
    """One ctxmesh catch entry as native catch entries (tried in order, like its codes)."""
    if "*" in errors:
        return [{"errors": ["*"], "goto": target}]
    out: list[dict[str, Any]] = []
    classes = [e for e in errors if e in ERROR_CLASSES and e != "agent_error"]
    codes = [e for e in errors if e not in ERROR_CLASSES]
    if classes:
        out.append({"errors": classes, "goto": target})
    if "agent_error" in errors:
        # ctxmesh's agent_error is a code of its own, apart from tool_error & co.
        out.append({"errors": ["agent_error"], "codes": ["", "agent_error"], "goto": target})
    if codes:
        out.append({"codes": codes, "goto": target})
    return out


def _list(items: list[str]) -> str:
    return "[" + ", ".join('"' + i.replace('"', '\\"') + '"' for i in items) + "]"


def _inputs(out: Lowering, schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        if isinstance(schema, dict):
            out.note(("spec",), "inputSchema declares no properties: the inputs are untyped")
        return {}
    listed = schema.get("required")
    required: list[Any] = listed if isinstance(listed, list) else []
    inputs: dict[str, Any] = {}
    dropped = False
    for key, prop in schema["properties"].items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)):
            continue
        entry: dict[str, Any] = {}
        kind = prop.get("type") if isinstance(prop, dict) else None
        if isinstance(kind, str) and kind in _JSON_TYPES:
            entry["type"] = _JSON_TYPES[kind]
            items = prop.get("items")
            if kind == "array" and isinstance(items, dict) and items.get("type") in _JSON_TYPES:
                entry["type"] = f"list[{_JSON_TYPES[items['type']]}]"
        if key in required:
            entry["required"] = True
        if isinstance(prop, dict) and "default" in prop:
            entry["default"] = prop["default"]
        if isinstance(prop, dict) and isinstance(prop.get("description"), str):
            entry["description"] = prop["description"]
        if isinstance(prop, dict) and set(prop) - {"type", "items", "default", "description"}:
            dropped = True
        inputs[str(key)] = entry
        out.at(("spec", "inputs", str(key)), ("spec", "inputSchema", "properties", key))
    if dropped or set(schema) - {"type", "properties", "required"}:
        out.note(
            ("spec", "inputs"),
            "inputSchema -> a type per input; constraints beyond the type (enum, pattern, "
            "minimum, nested shapes) are not checked before a run starts",
        )
    return inputs


def _agents(
    ctx: _Ctx, namespace: str | None, schemas: dict[str, list[Any]], lowered: Lowered
) -> list[Document]:
    out = []
    for agent, found in schemas.items():
        low = Lowering(ctx.src, DIALECT)
        index = next(i for _, (i, s) in ctx.steps.items() if s.get("agentRef") == agent)
        low.at((), ("spec", "steps", index, "agentRef"))
        description = f"ctxmesh AgentDeployment {agent}"
        schema: dict[str, Any] = {}
        if len(found) == 1:
            schema[agent] = found[0]
        elif found:
            schema[agent] = {"anyOf": found}
            low.note(
                ("spec", "capabilities", 0, "output_schema"),
                "steps using this agent declare different outputSchemas: an answer must "
                "match one of them",
            )
        low.note(
            ("metadata",),
            f"implied by agentRef {agent}: the capability is named like the AgentDeployment",
        )
        data = agent_def(agent, [(agent, description)], namespace=namespace, output_schemas=schema)
        out.append(low.finish(data, lowered))
    return out
