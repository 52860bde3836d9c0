"""Debugging by replay: explain, replay --against, shadow, fork and migrate.

Each works on exported logs (``--file``) with manifest files alone, or against a server;
``--json`` prints the report documented in docs/debugging.md. This module holds their
parsers; the commands are in :mod:`.explain_cmds` (explain, replay), :mod:`.shadow_cmds`
(shadow, migrate) and :mod:`.fork_cmd`, over what :mod:`.replay_inputs` reads.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from interlock.cli import connecting
from interlock.cli.explain_cmds import cmd_explain, cmd_replay
from interlock.cli.fork_cmd import cmd_fork
from interlock.cli.shadow_cmds import cmd_migrate, cmd_shadow

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    _add_explain(sub)
    _add_replay(sub)
    _add_shadow(sub)
    _add_fork(sub)
    _add_migrate(sub)


def _add_explain(sub: Sub) -> None:
    p = sub.add_parser(
        "explain",
        help="why a run went where it went: each guard weighed and the values it read",
        description="For each step of a run: the input, every `on` entry weighed with the "
        "values its guard read, the entry that fired or why none did, and what `set` and "
        "`outputs` produced; for a running run, what would move it now.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg, help="the run (online)")
    p.add_argument("--file", help="a JSONL export of the run (offline)")
    p.add_argument(
        "--workflow",
        metavar="FILE",
        help="the manifest the run ran (required with --file; online: default the version "
        "the run names)",
    )
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--at", type=int, metavar="SEQ", help="only the step holding record SEQ")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_explain)


def _add_replay(sub: Sub) -> None:
    p = sub.add_parser(
        "replay",
        help="fold a run's log step by step; with --against, what another definition "
        "would have done",
        description="Without --against: fold the log one record at a time, printing the "
        "state after each. With --against: re-drive the run's recorded inputs through "
        "another definition and report the first record where the logs diverge and why. "
        "Exit 0 when they agree, 1 when they diverge.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg)
    p.add_argument("--file", help="a JSONL export (no server needed)")
    p.add_argument(
        "--against",
        metavar="FILE|WORKFLOW@VERSION",
        help="a manifest file, WORKFLOW@VERSION or VERSION (of the run's workflow) to compare",
    )
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON (one object per step without --against, the report with it)",
    )
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_replay)


def _add_shadow(sub: Sub) -> None:
    p = sub.add_parser(
        "shadow",
        help="replay recorded runs against a candidate manifest, grouped by divergence",
        description="Replay recorded runs of WORKFLOW against a candidate manifest: how "
        "many would end the same, which diverge, grouped by where and why with one example "
        "each. Exit 0 when every run agrees, 1 when some diverge.",
    )
    p.add_argument("workflow", help="NAME or NAMESPACE/NAME")
    p.add_argument("--candidate", required=True, metavar="FILE", help="the candidate manifest")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--runs", type=int, metavar="N", help="the N most recent runs")
    which.add_argument(
        "--since", metavar="TIME", help="runs started at or after TIME (RFC 3339, or an age: 2h)"
    )
    p.add_argument(
        "--file",
        nargs="+",
        metavar="PATH",
        help="JSONL exports, or folders of them (offline)",
    )
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_shadow)


def _add_fork(sub: Sub) -> None:
    p = sub.add_parser(
        "fork",
        help="a new run from the first SEQ records of another, continuing live",
        description="Start a new run whose log begins with the first SEQ records of RUN_ID "
        "(marked as a fork of it), then enters the state the run was in at SEQ again, "
        "optionally on another version. The original is not touched.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg)
    p.add_argument("--at", type=int, required=True, metavar="SEQ")
    p.add_argument(
        "--workflow",
        metavar="FILE|VERSION",
        help="go on under this manifest (applied first) or version (default: the run's)",
    )
    p.add_argument("--run-id", dest="new_run_id", help="the fork's run id (default: a new one)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="say what the fork would be (its state, version and records); write nothing",
    )
    p.add_argument("--file", help="fork an exported log offline; writes the fork's log")
    p.add_argument("-o", "--output", help="with --file: where to write the fork's log")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_fork)


def _add_migrate(sub: Sub) -> None:
    p = sub.add_parser(
        "migrate",
        help="move running runs onto another version where their logs agree with it",
        description="Move the running runs of WORKFLOW onto VERSION when a replay finds "
        "their logs agree with it so far; list the others with the reason. Each move is a "
        "run.migrated record in the run's log. Exit 0 when every run moved (or would), 1 "
        "when some stay.",
    )
    p.add_argument("workflow", help="NAME or NAMESPACE/NAME")
    p.add_argument(
        "--to", required=True, metavar="VERSION|FILE", help="the version (offline: a manifest file)"
    )
    p.add_argument("--dry-run", action="store_true", help="check, write nothing")
    p.add_argument("--file", nargs="+", metavar="PATH", help="JSONL exports (offline, dry run)")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_migrate)
