"""``interlock shadow`` and ``interlock migrate``: the recorded runs of a workflow replayed
against another definition, to see which would diverge, or to move those that agree onto it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from interlock.cli import connecting
from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError, print_json, since_time
from interlock.cli.read_cmds import applied, qualified
from interlock.cli.replay_inputs import (
    end_text,
    headed_logs,
    is_online,
    manifest,
    now,
    read_log,
    replaying_of,
    starts_workflow,
)
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.migrating import slots_moved
from interlock.core.state import fold
from interlock.core.vocabulary import RunStatus


def cmd_shadow(args: argparse.Namespace) -> int:
    if args.runs is not None and args.runs < 1:
        raise CliError(f"--runs must be 1 or more, got {args.runs}")
    # Compared with the runs' start times as text: the same UTC form, or a usage error
    # (a malformed time compared as text chose no run, or every run, and said nothing).
    args.since = since_time(args.since)
    candidate = manifest(args.candidate, args.agents, args.workflow)
    if not is_online(args):
        # Which logs, chosen from their first lines; then read and replayed one at a time.
        chosen = _select(
            [
                (p, first)
                for p, first in headed_logs(args.file)
                if starts_workflow(first, args.workflow)
            ],
            args.runs,
            args.since,
        )
        summary = analysis.Shadow(candidate, label=args.candidate)
        for path, _ in chosen:
            summary.add(read_log(path))
        return _report_shadow(summary.summary(), args)

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.runtime.replaying import select_runs

        chosen = select_runs(await client.ops.list_runs(a.workflow), a.runs, a.since)
        if not chosen and not await applied(client, a.workflow):
            # A misspelt name replays no run, and 'every run agrees' would pass a check.
            raise CliError(
                f"workflow {qualified(a.workflow)} is not applied and has no runs "
                "(interlock workflows)",
                EXIT_FAILED,
            )
        summary = await replaying_of(client).shadow(chosen, candidate, label=a.candidate)
        return _report_shadow(summary, a)

    return connecting.with_client(body)(args)


def _select(
    logs: list[tuple[str, ev.AnyRecord]], runs: int | None, since: str | None
) -> list[tuple[str, ev.AnyRecord]]:
    logs = sorted(logs, key=lambda item: item[1].time)
    if since:
        logs = [item for item in logs if item[1].time >= since]
    if runs is not None:
        logs = logs[-runs:] if runs else []
    return logs


def _report_shadow(summary: dict[str, Any], args: argparse.Namespace) -> int:
    code = EXIT_OK if summary["agree"] == summary["runs"] else EXIT_FAILED
    if args.json:
        print_json(summary)
        return code
    out = sys.stdout.write
    out(
        f"{summary['runs']} runs replayed against {args.candidate}: {summary['agree']} agree, "
        f"{summary['diverge']} diverge, {summary['same_end']} would end the same\n"
    )
    for group in summary["groups"]:
        ex = group["example"]
        out(
            f"\n{group['count']} run(s): {group['kind']}: {group['why']} "
            f"({group['same_end']} end the same)\n"
        )
        out(f"  e.g. {ex['run_id']} at record {ex['seq']}: {ex['reason']}\n")
        recorded, replayed = end_text(ex["recorded_end"]), end_text(ex["replayed_end"])
        out(f"  recorded end: {recorded}; new end: {replayed}\n")
    for problem in summary["errors"]:
        out(f"\nnot replayed: {problem['run_id']}: {problem['error']}\n")
    return code


def cmd_migrate(args: argparse.Namespace) -> int:
    if not is_online(args):
        if not Path(args.to).is_file():
            raise CliError("offline, --to takes a manifest file")
        definition = manifest(args.to, args.agents, args.workflow)
        chosen = [p for p, first in headed_logs(args.file) if starts_workflow(first, args.workflow)]
        moved, stayed = [], []
        for path in chosen:
            records = read_log(path)
            target = fold(records).version + 1
            made, report = analysis.migration(records, definition, version=target, now=now())
            state = fold(records)
            base = {
                "run_id": records[0].subject,
                "from_version": state.version,
                "state": state.state,
            }
            if made:
                moved.append(
                    {**base, "reason": None, "seq": state.seq + 1, **slots_moved(state, made)}
                )
            elif state.status == RunStatus.RUNNING:
                out = {**base, "reason": report["migrate"]}
                if report["divergence"] is not None:
                    d = report["divergence"]
                    out["divergence"] = {k: d[k] for k in ("seq", "kind", "reason")}
                stayed.append(out)
        summary = {
            "workflow": {"name": definition.name, "namespace": definition.namespace},
            "to": {"version": None, "spec_hash": definition.spec_hash, "label": args.to},
            "dry_run": True,
            "moved": moved,
            "stayed": stayed,
        }
        return _report_migrate(summary, args)

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.runtime.replaying import in_flight, parse_version

        version = parse_version(a.to)
        if version is None:
            raise CliError(f"--to {a.to}: give a version number")
        replaying = replaying_of(client)
        namespace, _, name = a.workflow.rpartition("/")
        definition = await replaying.definition(namespace or "default", name, version)
        running = in_flight(await client.ops.list_runs(a.workflow, RunStatus.RUNNING), version)
        summary = await replaying.migrate(running, definition, version, dry_run=a.dry_run)
        return _report_migrate(summary, a)

    return connecting.with_client(body)(args)


def _report_migrate(summary: dict[str, Any], args: argparse.Namespace) -> int:
    code = EXIT_OK if not summary["stayed"] else EXIT_FAILED
    if args.json:
        print_json(summary)
        return code
    out = sys.stdout.write
    to = summary["to"].get("version") or summary["to"].get("label")
    verb = "would move" if summary["dry_run"] else "moved"
    out(f"{len(summary['moved'])} run(s) {verb} to version {to}; {len(summary['stayed'])} stay\n")
    for run in summary["moved"]:
        slots = "".join(
            f"; {said} " + ", ".join(f"{s['limit']} key {s['key']!r}" for s in run[field])
            for field, said in (("asks", "waits for a slot of"), ("frees", "gives back"))
            if run.get(field)
        )
        out(f"  {verb}: {run['run_id']} (v{run['from_version']}, in {run['state']}){slots}\n")
    for run in summary["stayed"]:
        out(f"  stays: {run['run_id']} (v{run.get('from_version')}): {run['reason']}\n")
        if "divergence" in run:
            out(f"         {run['divergence']['reason']}\n")
    return code
