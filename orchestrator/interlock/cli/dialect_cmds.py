"""The seed systems' own files: ``interlock convert`` (and the ``--dialect`` option that
``validate`` and ``apply`` take), plus synapse's ``compile`` and ``plan``.

Every format is lowered to the native manifest language by :mod:`interlock.dialects` and
compiled by the one compiler; nothing here runs a workflow.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError, err, read_sources
from interlock.core.compiler import Compiled, compile_sources
from interlock.dialects import DIALECTS, Prepared, prepare
from interlock.dialects.emit import to_yaml

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


def cmd_convert(args: argparse.Namespace) -> int:
    sources = read_sources(args.files)
    compiled, prepared = compile_files(sources, [], dialect_of(args))
    for diagnostic in compiled.diagnostics:
        err(str(diagnostic))
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
