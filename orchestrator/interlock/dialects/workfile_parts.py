"""The parts of a Workfile that both of its forms share, checked with the Workfile's rules
and lowered: its inputs, ``recovery`` retry policy, ``on`` triggers, steps, the actions a
step or state asks for, and ``{{ cel }}`` in the Workfile's root scope rewritten to native
CEL. :mod:`interlock.dialects.workfile_states` puts them into states;
:mod:`interlock.dialects.workfile` is the entry.
"""

from __future__ import annotations

import re
from typing import Any

from interlock.core.definition import known_type
from interlock.core.diagnostics import Diagnostic
from interlock.core.lowering_scope import parse_duration
from interlock.core.source import Document, Path, Span, position_in
from interlock.dialects.base import (
    Checker,
    Lowering,
    Name,
    check_cel,
    rewrite_cel,
    top_level_names,
    value_at,
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


class Workfile:
    """One Workfile being lowered: its checker, and what the parts learn about it."""

    def __init__(self, src: Document, diags: list[Diagnostic]) -> None:
        self.src = src
        self.check = Checker(src, DIALECT, diags)
        self.steps: list[str] = []
        self.optional: set[str] = set()
        self.events = False
        self.waits: set[str] = set()
        """States of the states form that do no work: their result is the event that
        left them (kept in the context under the state's name)."""
        self.calls: dict[str, str] = {}
        """Each ``call`` step or state: the Workfile it calls (as written)."""
        self.call_reads: list[tuple[str, str, Path]] = []
        """Paths into a call's result: (step, the output read, where)."""

    def read(self, step: str, fields: list[str], path: Path) -> None:
        """An expression at ``path`` reads ``step``'s result, down ``fields``."""
        if step in self.calls and fields and fields[0]:
            self.call_reads.append((step, fields[0], path))


def lower_inputs(wf: Workfile, value: Any) -> dict[str, Any]:
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


def lower_recovery(wf: Workfile, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    recovery = wf.check.mapping(value, ("recovery",), "recovery")
    if recovery is None:
        return None
    wf.check.unknown_keys(recovery, {"retry"}, ("recovery",), "recovery", x_keys=True)
    if "retry" not in recovery:
        return None
    return _retry(wf, recovery["retry"], ("recovery", "retry"))


def _retry(wf: Workfile, value: Any, path: Path) -> dict[str, Any] | None:
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


def lower_triggers(wf: Workfile, out: Lowering, value: Any) -> list[dict[str, Any]]:
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


def read_steps(wf: Workfile, body: list[Any]) -> list[tuple[str, dict[str, Any], Path]]:
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
        if step.get("call"):
            wf.calls[name] = str(step["call"])
        if not step.get("stop"):
            wf.steps.append(name)
    return out


_FILTER = re.compile(r"(?<!\|)\|(?!\|)\s*([A-Za-z_][A-Za-z0-9_]*)?")
"""A filter (``x | upper``): a single ``|``, not CEL's ``||``."""
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
"""A CEL string literal (a ``|`` inside one is not a filter)."""


def _rewrite(
    wf: Workfile, source: str, path: Path, extra: frozenset[str], at: int = 0
) -> str | None:
    """A Workfile expression in the native variables, or None (reported). ``at``: where
    ``source`` begins in the value at ``path`` (a problem is reported where it is written)."""
    known = {"inputs", "run", *wf.steps, *extra}
    if wf.events:
        known |= {"event", "data"}

    def where(offset: int) -> Span:
        value = value_at(wf.check.src.data, path)
        span = wf.check.src.where(path)
        if not isinstance(value, str):
            return span
        return Span(*position_in(span, value, at + offset))

    # A filter first: its name is no unknown name, it is a construct not supported.
    filtered = _FILTER.search(_STRING.sub(lambda m: "x" * len(m.group()), source))
    if filtered:
        wf.check.at_span(
            where(filtered.start(1) if filtered.group(1) else filtered.start()),
            "expression",
            f"the filter `| {filtered.group(1)}` in {source.strip()!r} is not supported: "
            "the Workfile format does not define its filters, so none is; write CEL "
            "functions instead (an instant: run.started_at + duration('4h'))",
        )
        return None
    for name in top_level_names(source):
        if name.name not in known:
            wf.check.at_span(
                where(name.start),
                "expression",
                f"unknown name {name.name!r} in {source.strip()!r} "
                f"(known: {', '.join(sorted(known))})",
            )
            return None

    def change(name: Name, text: str) -> tuple[int, str] | None:
        if name.name in wf.waits:
            return len(name.name), f"context.{name.name}"
        if name.name in wf.steps and name.name not in ("inputs", "run"):
            wf.read(name.name, list(name.fields), path)
            # A step that did not run (skipped, or after a stop) reads as null wherever it
            # is referenced, as the Workfile says: the path into it, up to a method called.
            end = name.end
            for field_end in name.ends:
                if text[field_end:].lstrip().startswith("("):
                    break
                end = field_end
            step = f"states.{name.name}"
            into = text[name.end : end]
            return end - name.start, f"(has({step}) ? {step}.output{into} : null)"
        if name.name == "run" and name.fields[:1] == ("started_at",):
            # The Workfile's run.started_at is a timestamp (the run records it as RFC 3339).
            end = text.find("started_at", name.start) + len("started_at")
            return end - name.start, "timestamp(run.started_at)"
        if name.name == "inputs" and name.fields and name.fields[0] in wf.optional:
            field = name.fields[0]
            end = text.find(field, name.start) + len(field)
            return end - name.start, f"(has(inputs.{field}) ? inputs.{field} : null)"
        return None

    cel = rewrite_cel(source.strip(), change)
    lead = len(source) - len(source.lstrip())
    if not check_cel(cel, wf.check, path, extra | {"iteration"}, offset=at + lead):
        return None
    return cel.native


def lower_value(
    wf: Workfile,
    value: Any,
    path: Path,
    *,
    outputs: bool = False,
    extra: frozenset[str] = frozenset(),
) -> Any:
    """A Workfile value (literals, ``{{ }}`` templates) in the native form."""
    if isinstance(value, dict):
        return {
            k: lower_value(wf, v, (*path, k), outputs=outputs, extra=extra)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            lower_value(wf, v, (*path, i), outputs=outputs, extra=extra)
            for i, v in enumerate(value)
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
            wf.read(path_match.group(1), fields, path)
            return f"$.states.{path_match.group(1)}.output{path_match.group(2)}"
        native = _rewrite(wf, whole.group(1), path, extra, whole.start(1))
        return "{{ " + (native or "null") + " }}"

    def each(match: re.Match[str]) -> str:
        native = _rewrite(wf, match.group(1), path, extra, match.start(1))
        return "{{ " + (native or "null") + " }}"

    return _TEMPLATE.sub(each, value)


def lower_condition(wf: Workfile, value: Any, path: Path) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        wf.check.error(path, "wrong-type", "when must be an expression")
        return None
    whole = _WHOLE.match(value)
    return _rewrite(
        wf, whole.group(1) if whole else value, path, frozenset(), whole.start(1) if whole else 0
    )


def lower_action(
    wf: Workfile,
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
        lower_value(wf, given, (*spath, "with" if "with" in step else "input"))
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
