"""The seed systems' own files: ``interlock convert`` (and the ``--dialect`` option that
``validate`` and ``apply`` take), plus synapse's ``compile`` and ``plan``.

Every format is lowered to the native manifest language by :mod:`interlock.dialects` and
compiled by the one compiler; nothing here runs a workflow.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError, err, print_json, read_sources

if TYPE_CHECKING:
    from interlock.core.compiler import Compiled
    from interlock.core.diagnostics import Diagnostic
    from interlock.dialects import Prepared, synapse

DIALECTS = ("ctxmesh", "workfile", "synapse", "kxm")
"""``interlock.dialects.DIALECTS``, named here so that building the parser loads none of
them (a test keeps the two equal)."""
DIALECT_CHOICES = ["auto", "native", *DIALECTS]


def add_dialect_option(parser: argparse.ArgumentParser) -> None:
    """``--dialect``: the format of the files (detected from each document by default)."""
    parser.add_argument(
        "--dialect",
        choices=DIALECT_CHOICES,
        default="auto",
        help="the files' format: detected from each document by default (apiVersion/kind, "
        "the JSON shape, the `workfile:` key)",
    )


def dialect_of(args: argparse.Namespace) -> str | None:
    value = getattr(args, "dialect", "auto")
    return None if value in (None, "auto") else str(value)


def compile_files(
    sources: list[tuple[str, str]],
    agents: list[tuple[str, str]],
    dialect: str | None,
) -> tuple[Compiled, Prepared]:
    """Validate files of any format. The AgentDefs a dialect file implies count as given
    unless ``agents`` are given: then those are the registry the workflows must use."""
    from interlock.core.compiler import compile_sources
    from interlock.dialects import prepare

    prepared = prepare(sources, dialect)
    documents = list(prepared.documents)
    if not agents:
        seen = set()
        for agent in prepared.agents:
            meta = agent.data.get("metadata", {})
            key = (meta.get("namespace", "default"), meta.get("name"))
            if key not in seen:  # several files may imply the same agent
                seen.add(key)
                documents.append(agent)
    compiled = compile_sources(prepared.sources, agent_sources=agents, documents=documents)
    compiled.diagnostics = sorted([*prepared.diagnostics, *compiled.diagnostics])
    if compiled.diagnostics:
        compiled.workflows.clear()
    return compiled, prepared


def print_warnings(warnings: list[Diagnostic]) -> None:
    """What a file says that is kept but not acted on: ``path:line:col: warning: rule:``."""
    for w in warnings:
        err(f"{w.path}:{w.line}:{w.col}: warning: {w.rule}: {w.message}")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert",
        help="write native manifests for ctxmesh, workfile, synapse or kxm files",
        description="Convert workflow files of another format to native interlock.io/v1 "
        "manifests (and the AgentDefs they imply), commented where the mapping took a "
        "decision. Exit 0 converted, 1 invalid, 2 usage.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="files to convert (- for stdin)")
    p.add_argument(
        "-o",
        "--output-dir",
        metavar="DIR",
        help="write <name>.yaml per file here (default: print to stdout)",
    )
    p.add_argument("--force", action="store_true", help="overwrite files in DIR")
    add_dialect_option(p)
    p.set_defaults(func=cmd_convert)
    add_synapse_parsers(sub)


def cmd_convert(args: argparse.Namespace) -> int:
    from interlock.dialects.emit import to_yaml

    sources = read_sources(args.files)
    compiled, prepared = compile_files(sources, [], dialect_of(args))
    for diagnostic in compiled.diagnostics:
        err(str(diagnostic))
    print_warnings(prepared.warnings)
    if not compiled.ok:
        count = len(compiled.diagnostics)
        err(f"{count} error{'s' if count != 1 else ''}; nothing was written")
        return EXIT_FAILED
    if prepared.sources:
        names = ", ".join(path for path, _ in prepared.sources)
        err(f"note: already native, not converted: {names}")
    outputs: list[tuple[str, str]] = []
    for lowered in prepared.lowered:
        parts: list[str] = []
        for doc in [*lowered.workflows, *lowered.agents]:
            header = []
            if not parts:
                header = [
                    f"Converted from {lowered.source.path} ({lowered.dialect}) "
                    "by interlock convert.",
                    "interlock validate <this file>; interlock apply <this file>",
                ]
            parts.append(to_yaml(doc.data, prepared.notes(doc), header))
        text = "---\n".join(parts)
        outputs.append((_output_name(lowered.source.path, lowered.workflows[0].data), text))
    if not args.output_dir:
        sys.stdout.write("---\n".join(text for _, text in outputs))
        return EXIT_OK
    target = Path(args.output_dir)
    target.mkdir(parents=True, exist_ok=True)
    planned = [(target / name, text) for name, text in _unique(outputs)]
    existing = [str(p) for p, _ in planned if p.exists()]
    if existing and not args.force:
        raise CliError(f"{', '.join(existing)} exist (use --force to overwrite)")
    for path, text in planned:
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        print(f"wrote {path}")
    return EXIT_OK


def _output_name(path: str, workflow: dict[str, object]) -> str:
    meta = workflow.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        name = re.sub(r"[^a-z0-9-]+", "-", Path(path).stem.lower()) or "workflow"
    return f"{name}.yaml"


def _unique(outputs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: dict[str, int] = {}
    out = []
    for name, text in outputs:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append((name if not count else name.replace(".yaml", f"-{count + 1}.yaml"), text))
    return out


# --- synapse: compile and plan --------------------------------------------------------------

SYNAPSE_INVALID = 2
"""synapse's exit code for an invalid workflow, agents or evidence file."""


def add_synapse_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compile",
        help="a synapse workflow's blackboard task declarations",
        description="Print the tasks a synapse workflow compiles to, in dependency order. "
        "Exit 0, or 2 when the workflow is invalid.",
    )
    p.add_argument("file", metavar="FILE", help="a synapse workflow (JSON)")
    p.add_argument("--json", action="store_true", help="the task declarations as JSON")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "plan",
        help="what a synapse workflow does next, from a board snapshot (offline)",
        description="Work out, from a board snapshot and an evidence snapshot, which tasks "
        "are done, in flight, ready, blocked or skipped, and which ready tasks go to which "
        "agents. Pure and deterministic: reads only the files given. Exit 0 when a plan was "
        "rendered, 2 when the workflow, status, agents or evidence file is invalid.",
    )
    p.add_argument("file", metavar="FILE", help="a synapse workflow (JSON)")
    p.add_argument("--status", metavar="FILE", help='board statuses: {"release/build": "done"}')
    p.add_argument("--evidence", metavar="FILE", help="evidence snapshot, by task id")
    p.add_argument("--agents", metavar="FILE", help='agents and classes: {"alice": ["ci"]}')
    p.add_argument("--max-in-flight", type=int, default=4, metavar="N")
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.set_defaults(func=cmd_plan)


def _synapse(path: str) -> synapse.Workflow:
    from interlock.dialects import load, synapse

    ((name, text),) = read_sources([path])
    documents, errors, _ = load(text, name, "synapse")
    diagnostics = list(errors)
    workflow = synapse.parse(documents[0], diagnostics) if documents else None
    for diagnostic in sorted(diagnostics):
        err(str(diagnostic))
    if workflow is None:
        raise CliError(f"{name}: not a valid synapse workflow", SYNAPSE_INVALID)
    return workflow


def _json_file(path: str | None, what: str, shape: type) -> Any:
    if path is None:
        return None
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(
            f"{what} {path}: cannot read: {exc.strerror or exc}", SYNAPSE_INVALID
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"{what} {path}: not JSON: {exc}", SYNAPSE_INVALID) from exc
    if not isinstance(value, shape):
        raise CliError(f"{what} {path}: must be a JSON {shape.__name__}", SYNAPSE_INVALID)
    return value


def cmd_compile(args: argparse.Namespace) -> int:
    from interlock.dialects import synapse

    workflow = _synapse(args.file)
    if args.json:
        print_json([task.declaration() for task in workflow.tasks])
    else:
        print(synapse.summary(workflow))
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from interlock.dialects import synapse

    workflow = _synapse(args.file)
    status = _json_file(args.status, "--status", dict) or {}
    evidence = _json_file(args.evidence, "--evidence", dict) or {}
    agents = _json_file(args.agents, "--agents", dict) or {}
    if not all(isinstance(v, str) for v in status.values()):
        raise CliError("--status: each task's status must be a string", SYNAPSE_INVALID)
    if not all(isinstance(v, dict) for v in evidence.values()):
        raise CliError("--evidence: each task's evidence must be an object", SYNAPSE_INVALID)
    if not all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in agents.values()):
        raise CliError("--agents: each agent's classes must be a list of strings", SYNAPSE_INVALID)
    if args.max_in_flight < 1:
        raise CliError("--max-in-flight must be at least 1", SYNAPSE_INVALID)
    result = synapse.plan(workflow, status, evidence, agents, args.max_in_flight)
    if args.json:
        print_json(result.as_json())
    else:
        print(result.text())
    return EXIT_OK
