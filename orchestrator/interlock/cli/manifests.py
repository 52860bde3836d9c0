"""Commands that need no server: validate and init."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from interlock.cli import dialect_cmds
from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError, err, read_sources
from interlock.core.names import DNS_LABEL


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="check manifests without running anything",
        description="Check Workflow and AgentDef manifests. Exit 0 valid, 1 invalid, 2 usage.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="manifest files (- for stdin)")
    p.add_argument(
        "--agents",
        nargs="+",
        default=[],
        metavar="FILE",
        help="AgentDef files whose capabilities the workflows may use",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    dialect_cmds.add_dialect_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("init", help="write a starting manifest")
    p.add_argument("kind", choices=["workflow"], help="what to create")
    p.add_argument("name", help="the workflow's name (a DNS label)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=cmd_init)


def cmd_validate(args: argparse.Namespace) -> int:
    sources = read_sources(args.files)
    agents = read_sources(args.agents)
    compiled, prepared = dialect_cmds.compile_files(sources, agents, dialect_cmds.dialect_of(args))
    if args.json:
        print(
            json.dumps(
                {
                    "valid": compiled.ok,
                    "workflows": [
                        {"name": w.name, "namespace": w.namespace, "states": len(w.states)}
                        for w in compiled.workflows
                    ],
                    "agents": [a.name for a in compiled.agents],
                    "webhooks": [
                        {"name": h.name, "namespace": h.namespace, "scheme": h.spec.scheme}
                        for h in compiled.webhooks
                    ],
                    "errors": [
                        {
                            "path": d.path,
                            "line": d.line,
                            "col": d.col,
                            "rule": d.rule,
                            "message": d.message,
                        }
                        for d in compiled.diagnostics
                    ],
                    "capabilities_checked": compiled.capabilities_checked,
                    "warnings": [
                        {
                            "path": w.path,
                            "line": w.line,
                            "col": w.col,
                            "rule": w.rule,
                            "message": w.message,
                        }
                        for w in prepared.warnings
                    ],
                },
                indent=2,
            )
        )
        return EXIT_OK if compiled.ok else EXIT_FAILED
    for diagnostic in compiled.diagnostics:
        err(str(diagnostic))
    dialect_cmds.print_warnings(prepared.warnings)
    if not compiled.ok:
        count = len(compiled.diagnostics)
        err(f"{count} error{'s' if count != 1 else ''}")
        return EXIT_FAILED
    for w in compiled.workflows:
        caps = sorted(w.capabilities())
        print(
            f"ok  workflow {w.namespace}/{w.name}: {_count(len(w.states), 'state')}, "
            f"{_count(len(w.triggers), 'trigger')}, capabilities: {', '.join(caps) or '-'}"
        )
    for a in compiled.agents:
        print(f"ok  agentdef {a.namespace}/{a.name}: capabilities: {', '.join(a.capabilities)}")
    for h in compiled.webhooks:
        signals = ", signals" if h.spec.signals is not None else ""
        print(
            f"ok  webhook {h.namespace}/{h.name}: POST /webhooks/{h.name}, "
            f"scheme {h.spec.scheme}, source {h.source}{signals}"
        )
    asking = sorted({c for w in compiled.workflows for c in w.capabilities()})
    if asking and not compiled.capabilities_checked:
        err(f"note: capabilities not checked (no AgentDef given: add --agents FILE){_ours(asking)}")
    return EXIT_OK


def _ours(capabilities: list[str]) -> str:
    """For the capabilities a reference agent serves, the AgentDef file installed with it
    (a new workflow asks for echo, whose AgentDef is in no folder of the user's)."""
    from interlock.cli.replay_inputs import reference_agentdefs

    files = reference_agentdefs(capabilities)
    if not files:
        return ""
    served = ", ".join(c for caps in files.values() for c in caps)
    return f"; for {served}, the reference agents' AgentDefs: --agents {' '.join(files)}"


def cmd_init(args: argparse.Namespace) -> int:
    if not DNS_LABEL.match(args.name):
        raise CliError(f"name {args.name!r} is not a DNS label (lowercase letters, digits, '-')")
    template = resources.files("interlock").joinpath("templates/workflow.yaml").read_text()
    text = template.replace("__NAME__", args.name)
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(args.output)
    if target.exists() and not args.force:
        raise CliError(f"{target} exists (use --force to overwrite)")
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
    return EXIT_OK


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
