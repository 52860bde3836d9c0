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
from interlock.dialects.base import API_VERSION, Lowered, Lowering, agent_def, template
from interlock.dialects.ctxmesh_check import (
    API_VERSIONS,
    DIALECT,
    DONE,
    Scope,
    check,
    rewrite,
)

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


def lower(src: Document, diags: list[Diagnostic]) -> Lowered | None:
    """Check a ctxmesh Workflow and lower it; None (with diagnostics) when it is invalid."""
    checked = check(src, diags)
    if checked is None:
        return None
    return _lower(checked.scope, checked.name, checked.namespace, checked.spec, checked.budget)


def _lower(
    ctx: Scope, name: str, namespace: str | None, spec: dict[str, Any], budget: dict[str, int]
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
    resolved = _budget(out, budget, native_spec)
    _cap_parallelism(out, states, resolved["maxFanOut"])
    native_spec["numbers"] = "double"
    out.at(("spec", "numbers"), ("spec",))
    out.note(
        ("spec", "numbers"),
        "ctxmesh evaluates CEL in Go, where every JSON number is a double: 80 and 80.0 are "
        "one number, and numbers compare across int and double (input.amount <= 100.0)",
    )
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


BUDGET_DEFAULTS = {"maxFanOut": 4, "maxSpawnDepth": 3, "maxTotalSpawns": 20}
"""ctxmesh's SpawnBudget defaults: a field left out takes its default, and so does every
field of an absent ``budget`` block (the controller resolves a nil block to them)."""

NATIVE_FAN_OUT = 64
"""The native ``budget.max_fan_out`` (items of one map) when a workflow sets none."""


def _budget(out: Lowering, budget: dict[str, int], native_spec: dict[str, Any]) -> dict[str, int]:
    """ctxmesh's SpawnBudget, its defaults applied, as the native budgets: each node launch
    is a spawn; ``maxFanOut`` bounds a step's sub-runs in flight (a map's parallelism).
    Returns the resolved budget."""
    resolved = {**BUDGET_DEFAULTS, **budget}
    native_budget: dict[str, int] = {
        "max_spawn_depth": resolved["maxSpawnDepth"],
        "max_total_spawns": resolved["maxTotalSpawns"],
    }
    if resolved["maxFanOut"] > NATIVE_FAN_OUT:
        # A parallelism up to maxFanOut must stay valid natively.
        native_budget["max_fan_out"] = resolved["maxFanOut"]
    for key, native in (
        ("maxFanOut", "max_fan_out"),
        ("maxSpawnDepth", "max_spawn_depth"),
        ("maxTotalSpawns", "max_total_spawns"),
    ):
        if key in budget and native in native_budget:
            out.at(("spec", "budget", native), ("spec", "budget", key))
    defaulted = [f"{k}: {v}" for k, v in BUDGET_DEFAULTS.items() if k not in budget]
    if defaulted:
        out.note(
            ("spec", "budget"),
            f"ctxmesh's budget defaults for what the file leaves out ({', '.join(defaulted)})",
        )
    out.note(
        ("spec", "budget"),
        "a spawn is a node launch (retries, map items and loop iterations included), "
        "at depth 1 below this run; run as a child run, its launches count against "
        "the spawn budgets of the tree it runs in; maxFanOut bounds a map's items in "
        f"flight ({resolved['maxFanOut']})",
    )
    native_spec["budget"] = native_budget
    return resolved


def _cap_parallelism(out: Lowering, states: dict[str, Any], fan_out: int) -> None:
    """The controller does not check a map's parallelism against the budget; the budget
    bounds what runs at once: a wider parallelism runs maxFanOut items at a time."""
    for name, state in states.items():
        spec = state.get("map")
        if isinstance(spec, dict) and spec.get("parallelism", 1) > fan_out:
            out.note(
                ("spec", "states", name, "map", "parallelism"),
                f"parallelism {spec['parallelism']} is above budget.maxFanOut ({fan_out}): "
                f"{fan_out} items at a time",
            )
            spec["parallelism"] = fan_out


def _referenced_as_edge(ctx: Scope, step: str) -> bool:
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


def _action(ctx: Scope, out: Lowering, base: Path, i: int, step: dict[str, Any]) -> dict[str, Any]:
    path: Path = ("spec", "steps", i)
    action: dict[str, Any] = {"capability": step["agentRef"]}
    out.at((*base, "capability"), (*path, "agentRef"))
    inputs = step.get("input") or {}
    action["input"] = {}
    for key, source in inputs.items():
        action["input"][key] = template(rewrite(ctx, source, None).native.strip())
        out.at((*base, "input", key), (*path, "input", key))
    if not inputs:
        out.note((*base, "input"), "the step maps no input: the agent gets an empty object")
    retries = step.get("retries", 0)
    if retries:
        action["retry"] = {"max_attempts": retries + 1, "errors": ["*"]}
        out.at((*base, "retry"), (*path, "retries"))
        out.note(
            (*base, "retry"),
            f"retries: {retries} -> {retries + 1} attempts, after any failure (errors: *), "
            "as ctxmesh retries a node before its catch/onError",
        )
    return action


def _state(
    ctx: Scope, out: Lowering, name: str, i: int, step: dict[str, Any], done: str
) -> dict[str, Any]:
    path: Path = ("spec", "steps", i)
    base: Path = ("spec", "states", name)
    state: dict[str, Any] = {}
    on: list[dict[str, Any]] = []
    if "map" in step:
        _map_state(ctx, out, name, i, step, done, state, on)
    elif "loop" in step:
        _loop_state(ctx, out, name, i, step, done, state, on)
    else:
        state["actions"] = [_action(ctx, out, (*base, "actions", 0), i, step)]
        out.at((*base, "actions"), (*path, "agentRef"))
        if "branches" in step:
            for j, branch in enumerate(step["branches"]):
                entry = {
                    "event": "task.completed",
                    "guard": rewrite(ctx, branch["when"], None).native.strip(),
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


def _map_state(
    ctx: Scope,
    out: Lowering,
    name: str,
    i: int,
    step: dict[str, Any],
    done: str,
    state: dict[str, Any],
    on: list[dict[str, Any]],
) -> None:
    """A map step: the native map over its `do` step's action."""
    path: Path = ("spec", "steps", i)
    base: Path = ("spec", "states", name)
    spec = step["map"]
    do_i, do_step = ctx.steps[spec["do"]]
    action = _action(ctx, out, (*base, "map", "action"), do_i, do_step)
    action.pop("output", None)
    parallelism = spec.get("parallelism", 1)
    state["map"] = {
        "over": rewrite(ctx, spec["over"], None).native.strip(),
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


def _loop_state(
    ctx: Scope,
    out: Lowering,
    name: str,
    i: int,
    step: dict[str, Any],
    done: str,
    state: dict[str, Any],
    on: list[dict[str, Any]],
) -> None:
    """A loop step: the native loop of its `do` step's action."""
    path: Path = ("spec", "steps", i)
    base: Path = ("spec", "states", name)
    spec = step["loop"]
    do_i, do_step = ctx.steps[spec["do"]]
    state["loop"] = {
        "until": rewrite(ctx, spec["until"], name).native.strip(),
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


def _goto(ctx: Scope, target: str | None, done: str, name: str) -> dict[str, Any]:
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
    ctx: Scope, namespace: str | None, schemas: dict[str, list[Any]], lowered: Lowered
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
