"""Entry point: builds the parser from each command module and maps errors to exit codes.

Only the module of the command being run is imported (``interlock runs`` never loads the
compiler or the HTTP gateway), and ``interlock --help`` imports none: :data:`COMMANDS`
names each command's module and one-line help. A test keeps it equal to what the modules
declare; a command missing from it still works, through the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from interlock import __version__
from interlock.cli.common import CliError, InvalidInput, err

ADDERS: tuple[tuple[str, str], ...] = (
    ("manifests", "add_parsers"),
    ("dialect_cmds", "add_parsers"),
    ("runtime_cmds", "add_parsers"),
    ("replay_cmds", "add_parsers"),
    ("query_cmds", "add_parsers"),
    ("process_cmds", "add_process_parsers"),
    ("gateway_cmds", "add_parsers"),
    ("creds", "add_parsers"),
    ("pause_cmds", "add_parsers"),
    ("partition_cmds", "add_parsers"),
)
"""The modules of ``interlock.cli`` and the function of each that adds its commands, in
the order ``--help`` lists them (``completion`` comes last, on the whole parser)."""

COMMANDS: dict[str, tuple[int, str]] = {
    "validate": (0, "check manifests without running anything"),
    "init": (0, "write a starting manifest"),
    "convert": (1, "write native manifests for ctxmesh, workfile, synapse or kxm files"),
    "compile": (1, "a synapse workflow's blackboard task declarations"),
    "plan": (1, "what a synapse workflow does next, from a board snapshot (offline)"),
    "apply": (2, "validate and store Workflows and AgentDefs"),
    "start": (2, "start a run of a workflow"),
    "emit": (2, "publish a CloudEvent as an external system would"),
    "signal": (2, "send a named event to one run (e.g. an approval)"),
    "runs": (2, "list runs, newest first"),
    "agents": (2, "list AgentDefs and live agent workers"),
    "logs": (2, "a run's timeline"),
    "result": (2, "a run's outputs"),
    "cancel": (2, "cancel a run"),
    "export": (2, "write a run's log as JSONL CloudEvents"),
    "dead-letters": (2, "messages that could not be handled: list, show, redrive"),
    "explain": (3, "why a run went where it went: each guard weighed and the values it read"),
    "replay": (
        3,
        "fold a run's log step by step; with --against, what another definition would have done",
    ),
    "shadow": (3, "replay recorded runs against a candidate manifest, grouped by divergence"),
    "fork": (3, "a new run from the first SEQ records of another, continuing live"),
    "migrate": (3, "move running runs onto another version where their logs agree with it"),
    "workflows": (4, "list the workflows applied (newest versions)"),
    "get": (4, "one workflow, run or agent"),
    "describe": (4, "everything about one run now"),
    "queues": (4, "concurrency and rate limits: runs and requests at work and waiting, per key"),
    "delete": (4, "stop a workflow from starting new runs"),
    "serve": (5, "run the orchestrator"),
    "agent": (5, "agent workers"),
    "dev": (5, "embedded NATS, the orchestrator and the reference agents"),
    "gateway": (6, "serve CloudEvents over HTTP, signed webhooks and the REST API"),
    "tokens": (6, "bearer tokens of the HTTP gateway's callers"),
    "creds": (7, "keys, credentials per role, revocation (NATS decentralized auth)"),
    "pause": (8, "hold a workflow's new runs, a run, or a capability's requests, until resumed"),
    "resume": (8, "let what a paused workflow, run or capability held go on, in order"),
    "partitions": (9, "the run-log partitions: layout, leaders, owners; set N changes P live"),
}
"""Each command: the index of its adder in :data:`ADDERS`, and its one-line help."""

COMPLETION_HELP = "print a shell completion script (bash or zsh)"


class _Parser(argparse.ArgumentParser):
    """An argument parser that notes, in what it parses, the innermost command parser that
    took part (argparse reports arguments no command knows with the top-level usage)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # A command's own parser parses first: the outer ones leave its note be.
        if not hasattr(parsed, "command_parser"):
            parsed.command_parser = self
        return parsed, extras


def _root() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser: argparse.ArgumentParser = _Parser(
        prog="interlock",
        description="Interlock: an event-sourced workflow orchestrator on NATS JetStream.",
    )
    parser.add_argument("--version", action="version", version=f"interlock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    return parser, sub


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], index: int) -> None:
    module, adder = ADDERS[index]
    getattr(importlib.import_module(f"interlock.cli.{module}"), adder)(sub)


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI (every command module imported)."""
    from interlock.cli import completion

    parser, sub = _root()
    for index in range(len(ADDERS)):
        _add(sub, index)
    completion.add_parsers(sub, parser)
    return parser


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """A parser that knows the command ``argv`` names in full (and no other), or with no
    command named, every command by name (what ``--help`` lists)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "completion" or (command is not None and command not in COMMANDS):
        return build_parser()  # completion needs it all; an unknown name gets the real error
    parser, sub = _root()
    if command is not None:  # the others' names are not needed: only --help lists them
        _add(sub, COMMANDS[command][0])
        return parser
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    sub.add_parser("completion", help=COMPLETION_HELP, add_help=False)
    return parser


_CONNECTION_FLAGS = frozenset(
    {"--server", "-s", "--creds", "--nkey", "--user", "--password", "--token", "--tls-ca",
     "--tls-cert", "--tls-key", "--prefix"}
)  # fmt: skip
"""The flags of ``connecting.add_connection_flags``, each with a value."""


def _connection_flags_last(argv: list[str]) -> list[str]:
    """``argv`` with connection flags given before the command moved after it, so that
    ``interlock --server URL runs`` works as ``interlock runs --server URL`` (as the nats
    CLI and kubectl take theirs)."""
    moved: list[str] = []
    rest = argv
    while rest and rest[0].split("=", 1)[0] in _CONNECTION_FLAGS:
        width = 1 if "=" in rest[0] else 2
        if len(rest) < width:
            break
        moved += rest[:width]
        rest = rest[width:]
    return [*rest, *moved] if moved and rest else argv


def main(argv: Sequence[str] | None = None) -> int:
    from interlock.cli.terminal import guard_terminals

    guard_terminals()
    given = _connection_flags_last(list(sys.argv[1:] if argv is None else argv))
    parser = _parser_for(given)
    args, extras = parser.parse_known_args(given)
    if extras:  # the usage of the command given, not the top-level one
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        code: int = args.func(args)
    except InvalidInput as exc:
        err(str(exc))
        return exc.code
    except CliError as exc:
        err(f"interlock: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
