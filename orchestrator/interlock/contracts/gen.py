"""Generate the published contracts from the code that defines them.

``python -m interlock.contracts`` writes, under ``contracts/``:

- ``schemas/workflow.schema.json`` and ``schemas/agentdef.schema.json``: the manifest
  kinds (from :func:`interlock.core.structure.json_schema`);
- ``runlog/<type>.schema.json``: one JSON Schema per run-log record type (from
  :func:`interlock.core.events.data_schemas`), and ``runlog/catalogue.md`` listing them;
- ``asyncapi.yaml``: the NATS wire contract as an AsyncAPI 3 document (from
  :mod:`interlock.contracts.wire`: subjects, roles, headers, payloads, the task consumer).

Output is stable (sorted keys, two-space indent, trailing newline), so the files can be
checked in and ``--check`` can tell when they drift from the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from interlock.contracts import wire
from interlock.core import events, structure
from interlock.core.vocabulary import ErrorClass

MANIFEST_KINDS = ("Workflow", "AgentDef", "Webhook")

RECORD_MEANINGS: Mapping[str, str] = {
    "run.started": "A run began: workflow name, version, spec hash, resolved inputs, initial "
    "context and, when a trigger started it, a copy of the trigger event.",
    "state.entered": "The run entered a state; its actions (if any) are requested next.",
    "action.requested": "A capability was asked to do work (outbox: appended before the "
    "request is published; `action_id` is the request's idempotency key). With `limits`, "
    "it waits for `action.admitted`, unless `admitted_at` says it was admitted at once, "
    "in this record (its `deadline` counted from then).",
    "action.completed": "An agent answered an action: the result, the event type it answered "
    "with, and the context writes of the action's `output` mapping.",
    "action.failed": "An action failed with a classified error (`timeout`, `agent_error`, ...).",
    "event.received": "An external CloudEvent the run was waiting for arrived; a full copy "
    "is kept so a replay needs no other stream.",
    "guard.failed": "A guard errored or gave a non-boolean: the transition did not fire "
    "(fail-closed) and the error is kept.",
    "transition.fired": "The run moved from one state to another on an event, with the "
    "context writes of the transition's `set`.",
    "action.cancelled": "An action in flight was cancelled (its state was left or the run "
    "ended); its agent is told to stop.",
    "map.started": "A map state evaluated its list: the items, parallelism and completion.",
    "map.completed": "A map state finished: its result (all outputs in order, or the first).",
    "timer.scheduled": "A durable timer was set (an action or state deadline, a retry backoff).",
    "timer.fired": "A durable timer went off.",
    "run.completed": "The run reached a terminal state; its declared outputs.",
    "run.failed": "The run failed, with the error class and message.",
    "run.cancelled": "The run was cancelled, with the reason given.",
    "run.forked": "The records before this one are a copy of another run's first "
    "`origin_seq` records (`interlock fork`); the run goes on by itself from here, on the "
    "version named, entering `state` again.",
    "run.migrated": "The run moved onto another version of its workflow (`interlock "
    "migrate`), whose replay agreed with its log through `checked_through`.",
    "dag.started": "A DAG state began: its steps (each after those it depends on), "
    "parallelism and completion; each step's action is requested, with its `step`, as soon "
    "as what it depends on allows.",
    "step.skipped": "A DAG step will never run: a step it depends on ended otherwise than "
    "its edge asks (a branch not taken), with the reason.",
    "dag.completed": "A DAG state finished: each step by name with its status (completed, "
    "failed, skipped) and its output or error.",
    "evidence.recorded": "An evidence event arrived (a type the workflow's `evidence.events` "
    "names): a full copy, kept whatever state the run is in; its data "
    "(`{subject: {predicate: value}}`) is what evidence gates read.",
    "gate.checked": "A DAG step's evidence gate was checked: `proven` (the step starts now) "
    "or not (the step is held; `missing` names the predicates not proven).",
    "run.queued": "The run waits for a slot of each of its workflow's concurrency limits "
    "(`spec.concurrency`): each slot's limit, key and size; no state is entered until "
    "`run.admitted`. A fork's (after `run.forked`) names the `state` it goes on in.",
    "run.admitted": "The run holds a slot of each limit it waited for (freed by the record "
    "that ends it); its first state (a fork's: the state it was forked in) is entered next.",
    "run.paused": "The run takes no transition and requests no action until `run.resumed` "
    "(the reason; `workflow`: paused with its workflow, resumed with it).",
    "event.held": "An event reached the paused run that it would take (an answer, a due "
    "timer, an external event): a full copy, decided on once the run is resumed.",
    "run.resumed": "The run goes on: the events it held are decided on next, in the order "
    "they came, their records following this one.",
    "action.queued": "A request waits, undispatched, for a slot or token of its capability's "
    "limit `limit` for `key` (its `place` in line then), or for its paused capability "
    "(`limit` `cap:NAME@paused`); its deadline runs only from `action.admitted`.",
    "action.admitted": "A request holds a slot and a token of each limit of its capability "
    "(`limits` of `action.requested`): it is dispatched now, its `deadline` counted from "
    "here. The record that ends the attempt names the lines it leaves (`freed`). "
    "`at_once`: in logs written before `admitted_at`, a request admitted in the append "
    "of its request.",
    "run.continued": "The run's log ends here and the run goes on as a new run (`run_id`, "
    "derived from this run's id and this record's position) that enters `state` with "
    "`inputs` and takes over the run's context, states' outputs and the rest; its "
    "`run.started` names this run in `continued_from`. `reason`: a `continue_as_new` "
    "transition, or a history limit neared (`history.max_records`, `history.max_bytes`).",
}
"""One line per record type, keyed by the type without the ``io.interlock.`` prefix."""


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _short(record_type: str) -> str:
    return record_type.removeprefix(events.PREFIX)


def _data_fields(schema: Mapping[str, Any]) -> str:
    """``a, b?`` for the data payload of a record schema (``?`` marks optional fields)."""
    defs = schema.get("$defs", {})
    root = defs.get(str(schema.get("$ref", "")).rsplit("/", 1)[-1], {})
    data_ref = str(root.get("properties", {}).get("data", {}).get("$ref", ""))
    data = defs.get(data_ref.rsplit("/", 1)[-1], {})
    required = set(data.get("required", ()))
    names = [n if n in required else f"{n}?" for n in data.get("properties", {})]
    return ", ".join(f"`{n}`" for n in names)


def _catalogue(schemas: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        "# Run-log record types",
        "",
        "Generated by `python -m interlock.contracts` from `interlock.core.events`; do not",
        "edit by hand. Every record is a CloudEvent 1.0 in structured mode (JSON) with",
        "`subject` = the run id, `id` = `<run id>:<log position>`, `source` =",
        f"`{events.SOURCE}`. A run's state is the fold of its records, in order.",
        "",
        "| type | meaning | data fields (`?` optional) | schema |",
        "|---|---|---|---|",
    ]
    for record_type, schema in schemas.items():
        meaning = RECORD_MEANINGS[_short(record_type)]
        lines.append(
            f"| `{record_type}` | {meaning} | {_data_fields(schema)} | "
            f"[{record_type}.schema.json]({record_type}.schema.json) |"
        )
    classes = ", ".join(f"`{c}`" for c in ErrorClass)
    lines += ["", f"Error classes (`error.class`): {classes}.", ""]
    return "\n".join(lines)


def generate() -> dict[str, str]:
    """Every generated file, as path relative to the repository root -> text."""
    out: dict[str, str] = {}
    for kind in MANIFEST_KINDS:
        out[f"contracts/schemas/{kind.lower()}.schema.json"] = _json(structure.json_schema(kind))
    schemas = events.data_schemas()
    missing = sorted(_short(t) for t in schemas if _short(t) not in RECORD_MEANINGS)
    if missing:
        raise SystemExit(f"interlock.contracts: no meaning written for record types: {missing}")
    for record_type, schema in schemas.items():
        out[f"contracts/runlog/{record_type}.schema.json"] = _json(schema)
    out["contracts/runlog/catalogue.md"] = _catalogue(schemas)
    out["contracts/asyncapi.yaml"] = wire.render()
    return out


def _stale(root: Path, generated: Mapping[str, str]) -> list[str]:
    """Generated-looking files on disk that the code no longer produces."""
    found: list[str] = []
    for pattern in ("contracts/schemas/*.schema.json", "contracts/runlog/*.schema.json"):
        for path in sorted(root.glob(pattern)):
            relative = path.relative_to(root).as_posix()
            if relative not in generated:
                found.append(relative)
    return found


def drifted(root: Path) -> list[str]:
    """Paths (relative to ``root``) that differ from what the code generates."""
    generated = generate()
    out = []
    for relative, text in generated.items():
        path = root / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(relative)
    return out + _stale(root, generated)


def write(root: Path) -> list[str]:
    """Write every generated file under ``root``; returns the paths that changed."""
    changed = []
    for relative, text in generate().items():
        path = root / relative
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(relative)
    return changed


def _default_root() -> Path:
    # orchestrator/interlock/contracts/gen.py -> the repository root
    return Path(__file__).resolve().parents[3]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m interlock.contracts",
        description="Write contracts/ (manifest and run-log JSON Schemas, the AsyncAPI wire "
        "contract) from the code.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming every file that differs from the code",
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="repository root (default: this checkout)"
    )
    args = parser.parse_args(argv)
    root: Path = args.root or _default_root()
    if args.check:
        bad = drifted(root)
        for relative in bad:
            sys.stderr.write(f"drifted: {relative}\n")
        if bad:
            sys.stderr.write(
                f"{len(bad)} contract file(s) differ from the code: "
                "run `python -m interlock.contracts` (or `make contracts`)\n"
            )
            return 1
        print(f"contracts up to date ({len(generate())} files)")
        return 0
    stale = _stale(root, generate())
    for relative in write(root):
        print(f"wrote {relative}")
    for relative in stale:
        sys.stderr.write(f"stale (no longer generated, delete it): {relative}\n")
    return 0
