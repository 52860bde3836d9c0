"""``interlock fork``: a new run from the first records of another, online (it goes on
live) or on an exported log (the fork's log is written)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interlock.cli import connecting, read_cmds
from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    err,
    print_json,
    read_sources,
)
from interlock.cli.replay_inputs import is_online, manifest, now, read_log, replaying_of
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.state import fold


def cmd_fork(args: argparse.Namespace) -> int:
    from interlock.runtime.client import new_run_id

    run_id = args.new_run_id or new_run_id()
    if not is_online(args):
        return _fork_offline(args, run_id)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)
    workflow_is_file = bool(args.workflow) and Path(args.workflow).is_file()

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.client.debugging import workflow_paused
        from interlock.runtime.replaying import parse_version

        replaying = replaying_of(client)
        records = await client.ops.read(a.run_id)
        state = fold(records)
        definition: Definition | None = None
        version: int | None = None
        if a.workflow:
            number = parse_version(a.workflow)
            if number is not None and not workflow_is_file:
                version = number
                definition = await replaying.definition(state.namespace, state.workflow, number)
            else:
                result = await client.ops.apply(read_sources([a.workflow]))
                if not result.compiled.ok:
                    for diagnostic in result.compiled.diagnostics:
                        err(str(diagnostic))
                    raise CliError(f"{a.workflow}: not a valid manifest", EXIT_FAILED)
                applied = [x for x in result.applied if x.kind == "Workflow"]
                if len(applied) != 1:
                    raise CliError(f"{a.workflow}: give a file with one workflow")
                version = applied[0].version
                definition = await replaying.definition(
                    applied[0].namespace, applied[0].name, version
                )
        # NotPossible and RunExists: connecting.with_client answers them (exit 1).
        paused = await workflow_paused(client.ops, state.namespace, state.workflow)
        if a.dry_run:
            version = state.version if version is None else version
            definition = definition or await replaying.definition(
                state.namespace, state.workflow, version
            )
            made = analysis.fork(
                records,
                a.at,
                run_id=run_id,
                definition=definition,
                version=version,
                now=replaying.clock(),
                paused=paused,
            )
            return _report_fork(a.run_id, a.at, run_id, version, made, a)
        forked = await replaying.fork(
            records, a.at, run_id=run_id, definition=definition, version=version, paused=paused
        )
        return _report_fork(a.run_id, a.at, forked.run_id, forked.version, forked.records, a)

    return connecting.with_client(body)(args)


def _fork_offline(args: argparse.Namespace, run_id: str) -> int:
    records = read_log(args.file)
    state = fold(records)
    if args.workflow and Path(args.workflow).is_file():
        definition = manifest(args.workflow, args.agents, state.workflow)
    else:
        raise CliError("offline, give the manifest to go on under: --workflow FILE")
    version = state.version if definition.spec_hash == state.spec_hash else state.version + 1
    try:
        made = analysis.fork(
            records,
            args.at,
            run_id=run_id,
            definition=definition,
            version=version,
            now=now(),
        )
    except analysis.NotPossible as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    lines = b"".join(ev.encode(r) + b"\n" for r in made)
    if args.output:
        read_cmds.write_atomically(Path(args.output), lines)
    elif not args.json:
        from interlock.cli.terminal import write_json_lines

        write_json_lines(lines)
        return EXIT_OK
    return _report_fork(records[0].subject, args.at, run_id, version, made, args)


def _report_fork(
    origin: str,
    at: int,
    run_id: str,
    version: int,
    records: Sequence[ev.AnyRecord],
    args: argparse.Namespace,
) -> int:
    from interlock.client.debugging import fork_report

    dry_run = bool(getattr(args, "dry_run", False))
    report = fork_report(origin, at, run_id, version, records, dry_run=dry_run)
    marker = next(r for r in records if isinstance(r, ev.RunForked))
    if args.json:
        print_json(report)
        return EXIT_OK
    named = run_id
    if dry_run and not getattr(args, "new_run_id", None):
        # A fork made without --run-id gets an id of its own, not this preview's.
        named = f"a new run ({run_id} in this preview; --run-id NEW names it)"
    sys.stdout.write(
        f"{'would fork' if dry_run else 'forked'} {origin} at record {at} as {named} "
        f"(version {version}); it {'would go' if dry_run else 'goes'} on in "
        f"state {marker.data.state}{' (dry run: nothing written)' if dry_run else ''}\n"
    )
    for line in report["records"]:
        sys.stdout.write(f"    #{line['seq']:<3} {line['summary']}\n")
    return EXIT_OK
