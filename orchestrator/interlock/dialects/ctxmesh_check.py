"""ctxmesh Workflows as the ctxmesh controller reads them: its load-time rules, checked
with rule ids ``ctxmesh.<rule>`` at their place in the file (metadata, budget, each step's
edges, branches, catches, map and loop, and the CEL it holds, with the variables ctxmesh
knows), and the renaming of ctxmesh's CEL variables to the native ones. What a checked
Workflow becomes is in :mod:`interlock.dialects.ctxmesh`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.names import DNS_LABEL
from interlock.core.source import Document, Path
from interlock.dialects.base import Cel, Checker, Name, check_cel, rewrite_cel

DIALECT = "ctxmesh"
API_VERSIONS = ("agents.ctxmesh.ai/v1beta1",)
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


class Scope:
    """One ctxmesh Workflow being checked: its checker and its steps by name."""

    def __init__(self, src: Document, diags: list[Diagnostic]) -> None:
        self.src = src
        self.check = Checker(src, DIALECT, diags)
        self.diags = diags
        self.steps: dict[str, tuple[int, dict[str, Any]]] = {}
        self.owner: dict[str, str] = {}
        """A map's or loop's `do` step -> the map/loop step that runs it."""


@dataclass(slots=True)
class Checked:
    """A Workflow that passed the controller's rules."""

    scope: Scope
    name: str
    namespace: str | None
    spec: dict[str, Any]
    budget: dict[str, int]


def check(src: Document, diags: list[Diagnostic]) -> Checked | None:
    """The Workflow in ``src`` when it keeps every load-time rule, else None."""
    ctx = Scope(src, diags)
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
    return Checked(ctx, name, namespace, spec, budget)


def rewrite(ctx: Scope, source: str, in_loop: str | None) -> Cel:
    """``input`` -> ``inputs``; ``steps.X`` -> ``states.X`` and ``steps["X"]`` ->
    ``states["X"]`` (a `do` step's output is its map/loop state's; inside a loop's
    `until`, the `do` step's output is ``result``)."""

    def change(name: Name, text: str) -> tuple[int, str] | None:
        if name.name == "input":
            return len("input"), "inputs"
        if name.name == "steps" and name.fields:
            target = name.fields[0]
            if in_loop is not None and ctx.owner.get(target) == in_loop and len(name.fields) > 1:
                # steps.<do>.output -> result
                return name.ends[1] - name.start, "result"
            owner = ctx.owner.get(target, target)
            if owner != target:
                return name.ends[0] - name.start, f"states[{json.dumps(owner)}]"
            return len("steps"), "states"
        return None

    return rewrite_cel(source, change)


def _budget(ctx: Scope, spec: dict[str, Any]) -> dict[str, int]:
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


def _target(ctx: Scope, value: Any, path: Path, what: str, *, empty_ok: bool) -> None:
    if not isinstance(value, str):
        ctx.check.error(path, "wrong-type", f"{what} must be a string")
        return
    if value == "" and empty_ok:
        return
    if not DNS_LABEL.match(value):
        ctx.check.error(path, "invalid-value", f"{what} {value!r} must be a DNS label")
    elif value not in ctx.steps:
        ctx.check.error(path, "unknown-step", f"{what} {value!r} names no step")


def _check_step(ctx: Scope, name: str, i: int, step: dict[str, Any]) -> None:
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
        _check_branches(ctx, name, path, step["branches"])
    if "catch" in step:
        _check_catches(ctx, path, step["catch"])
    if "map" in step:
        _check_map(ctx, name, path, step["map"])
    if "loop" in step:
        _check_loop(ctx, name, path, step["loop"])


def _check_branches(ctx: Scope, name: str, path: Path, value: Any) -> None:
    check = ctx.check
    branches = check.items(value, (*path, "branches"), "branches") or []
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


def _check_catches(ctx: Scope, path: Path, value: Any) -> None:
    check = ctx.check
    catches = check.items(value, (*path, "catch"), "catch") or []
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


def _check_map(ctx: Scope, name: str, path: Path, value: Any) -> None:
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


def _check_loop(ctx: Scope, name: str, path: Path, value: Any) -> None:
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


def _map_alias(ctx: Scope, step: str) -> frozenset[str]:
    """The variables a `do` step's input may read besides input/steps: the map's `as`."""
    owner = ctx.owner.get(step)
    if owner is None:
        return frozenset()
    spec = ctx.steps[owner][1].get("map")
    if isinstance(spec, dict) and isinstance(spec.get("as"), str):
        return frozenset({spec["as"], "index"})
    return frozenset()


def _cel(ctx: Scope, source: str, path: Path, *, owner_of: str) -> Cel | None:
    """Check one ctxmesh CEL expression (its variables, that it compiles)."""
    allowed = {"input", "steps"} | _map_alias(ctx, owner_of)
    ok = True
    for name in _names(source):
        if name.name not in allowed:
            ctx.check.at_span(
                _span_in(ctx.src, path, source, name.start),
                "cel",
                f"unknown variable {name.name!r} (known: {', '.join(sorted(allowed))})",
            )
            ok = False
        elif name.name == "steps" and name.fields and name.fields[0] not in ctx.steps:
            ctx.check.at_span(
                _span_in(ctx.src, path, source, name.start),
                "unknown-step",
                f"{source[name.start : name.ends[0]]} names no step",
            )
            ok = False
        elif name.name == "steps" and not name.fields:
            ctx.check.at_span(
                _span_in(ctx.src, path, source, name.start),
                "cel",
                'a step reference names its step: steps.<name> or steps["<name>"] '
                "(a step name with '-' needs the index form)",
            )
            ok = False
    if not ok:
        return None
    cel = rewrite(ctx, source, in_loop=None)
    extra = _map_alias(ctx, owner_of) | {"iteration"}
    return cel if check_cel(cel, ctx.check, path, extra) else None


def _names(source: str) -> list[Name]:
    from interlock.dialects.base import top_level_names

    return top_level_names(source)


def _span_in(src: Document, path: Path, source: str, offset: int) -> Any:
    """Where the character at ``offset`` of the expression ``source`` at ``path`` is
    written (across lines, in a block scalar, after escapes)."""
    from interlock.core.source import Span, position_in

    return Span(*position_in(src.where(path), source, offset))


def _check_output_schemas(ctx: Scope) -> None:
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
                        _span_in(ctx.src, path, source, ref.start),
                        "output-schema",
                        f"step {name!r} reads {source[ref.start : ref.ends[0]]}.output, so "
                        f"step {target!r} must declare an outputSchema",
                    )


def _is_node(ctx: Scope, name: str) -> bool:
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
