"""Entry point: builds the parser from each command module and maps errors to exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from interlock import __version__
from interlock.cli import (
    creds,
    dialect_cmds,
    gateway_cmds,
    manifests,
    process_cmds,
    replay_cmds,
    runtime_cmds,
)
from interlock.cli.common import CliError, InvalidInput, err


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interlock",
        description="Interlock: an event-sourced workflow orchestrator on NATS JetStream.",
    )
    parser.add_argument("--version", action="version", version=f"interlock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    manifests.add_parsers(sub)
    dialect_cmds.add_parsers(sub)
    runtime_cmds.add_parsers(sub)
    replay_cmds.add_parsers(sub)
    process_cmds.add_process_parsers(sub)
    gateway_cmds.add_parsers(sub)
    creds.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
