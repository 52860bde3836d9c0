"""Commands that read what an installation holds: runs, logs, results, exports, agents
and dead letters (with ``redrive``, the one write on dead letters). None of them creates a
stream or a bucket, and none loads the compiler."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    err,
    read_records,
    since_time,
)
from interlock.cli.connecting import print_json, with_client
from interlock.cli.output import dump, emit, output_format, print_table
from interlock.core.vocabulary import FINISHED, RunStatus
from interlock.views.build import waiting_text

if TYPE_CHECKING:
    from interlock.client import Client
    from interlock.core import events as ev
    from interlock.views import RunResult, RunSummary


async def cmd_runs(client: Client, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise CliError(f"--limit must be 0 or more, got {args.limit}")
    runs = await client.runs(
        workflow=args.workflow, status=args.status, limit=args.limit, waiting=args.waiting
    )

    def table() -> None:
        if not runs:
            print("no runs")
            return
        print_table(
            ["RUN", "WORKFLOW", "STATUS", "STATE", "WAITING FOR", "STARTED"],
            [
                (
                    r.run_id,
                    f"{r.namespace}/{r.workflow}",
                    _status(r),
                    r.state,
                    _waiting(r),
                    r.started_at,
                )
                for r in runs
            ],
        )

    emit(args, runs, table)
    if not runs and args.workflow and not await applied(client, args.workflow):
        err(f"note: workflow {qualified(args.workflow)} is not applied (interlock workflows)")
    await _index_note(client)
    return EXIT_OK


def qualified(workflow: str) -> str:
    """``namespace/name`` of a workflow named as the commands take it (``name``: default)."""
    return workflow if "/" in workflow else f"default/{workflow}"


async def applied(client: Client, workflow: str) -> bool:
    """Whether ``workflow`` (``name`` or ``namespace/name``) is applied now: asked of a
    filter that found no run, where a misspelt name found none and said nothing."""
    return any(f"{w.namespace}/{w.name}" == qualified(workflow) for w in await client.workflows())


async def _index_note(client: Client) -> None:
    """The run list is the run index, written just behind the logs: say when it is behind
    now, as a list read right after a start or a pause can show a run as it was."""
    from interlock.client.reading import index_behind

    behind = await index_behind(client.ops)
    if behind:
        err(
            f"note: the run index is behind the run logs ({behind} "
            f"append{'s' if behind > 1 else ''} not yet in it): a run started, paused or "
            "moved just now may be missing or shown as it was ('interlock describe run "
            "RUN_ID' reads its log)"
        )


WAITING_WIDTH = 64
"""The widest a run's WAITING FOR cell is (a reason or a key is cut short with ``...``)."""


def _status(run: RunSummary) -> str:
    if run.paused is not None:
        return f"{run.status} (paused)"
    if any(w.kind == "slot" for w in run.waiting):
        return f"{run.status} (queued)"
    return run.status


def _waiting(run: RunSummary) -> str:
    """What holds the run: its pause (by itself, or with its workflow, and why), the lines
    it is queued in (its workflow's pause; each limit, its key; its trigger's rate), or
    what its state waits for. Names are said relative to the run's workflow (``#1`` for
    its first limit), which the row names already."""
    said: list[str] = []
    if run.paused is not None:
        how = "paused with its workflow" if run.paused.workflow else "paused by itself"
        said.append(how + (f": {run.paused.reason}" if run.paused.reason else ""))
    slots = [w for w in run.waiting if w.kind == "slot"]
    # Its workflow's pause first: the run waits for it before any limit.
    slots.sort(key=lambda w: not w.name.endswith(("@paused", "@resumed")))
    for w in slots:
        name = _relative(w.name, run)
        if w.name.endswith("@paused"):
            said.append("its workflow paused")
        elif w.name.endswith("@resumed"):
            if len(slots) == 1:  # (else the limits it goes on to are said)
                said.append("its admission (its workflow resumed)")
        elif w.name.endswith("@rate"):
            said.append(f"rate of {name.removesuffix('@rate')}" + _key(w.key))
        else:
            said.append(f"slot {name}" + _key(w.key))
    if not said:
        said.append(waiting_text(run.waiting))
    text = "; ".join(said)
    return text if len(text) <= WAITING_WIDTH else text[: WAITING_WIDTH - 3] + "..."


def _relative(name: str, run: RunSummary) -> str:
    """A limit's (or a trigger's) name as said on the run's row: ``#1`` for the run's
    workflow's own, without the namespace for one of the run's namespace."""
    own = f"{run.namespace}/{run.workflow}#"
    if name.startswith(own):
        return name[len(own) - 1 :]
    return name.removeprefix(f"{run.namespace}/")


def _key(key: str) -> str:
    return f" key {key!r}" if key else ""


async def cmd_dead_letters_list(client: Client, args: argparse.Namespace) -> int:
    letters = await client.dead_letters(args.reason)
    if output_format(args) == "json":
        for letter in letters:  # one JSON object per line
            print(json.dumps(_plain(letter), separators=(",", ":")))
        return EXIT_OK

    def table() -> None:
        if not letters:
            print("no dead letters" + (f" with reason {args.reason}" if args.reason else ""))
            return
        print_table(
            ["SEQ", "TIME", "REASON", "FROM", "DETAIL"],
            [
                (
                    d.seq,
                    d.time,
                    d.reason,
                    d.subject,
                    d.detail if len(d.detail) <= 80 else d.detail[:77] + "...",
                )
                for d in letters
            ],
        )

    emit(args, letters, table)
    return EXIT_OK


def _plain(value: Any) -> Any:
    from interlock.cli.output import plain

    return plain(value)


async def cmd_dead_letters_show(client: Client, args: argparse.Namespace) -> int:
    letter = await client.dead_letter(args.seq)  # UnknownDeadLetter: exit 1 (with_client)
    emit(args, letter, lambda: print_json(letter))
    return EXIT_OK


async def cmd_dead_letters_redrive(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownDeadLetter

    if args.reason and not args.all:
        raise CliError("--reason goes with --all (name sequences, or --all --reason R)")
    seqs = [d.seq for d in await client.dead_letters(args.reason)] if args.all else args.seq
    failed = 0
    for seq in seqs:
        try:
            letter = await client.dead_letter(seq)
            stored = await client.redrive(seq)
        except (UnknownDeadLetter, ValueError) as exc:
            failed += 1
            print(f"dead letter {seq}: {exc}", file=sys.stderr)
            continue
        if args.json:
            print(json.dumps({"seq": seq, "subject": letter.subject, "stored_seq": stored}))
        else:
            print(f"redrove {seq} ({letter.reason}) to {letter.subject}")
    if not seqs and not args.json:
        print("no dead letters to redrive")
    return EXIT_FAILED if failed else EXIT_OK


async def cmd_dead_letters_discard(client: Client, args: argparse.Namespace) -> int:
    from datetime import datetime

    from interlock.client import UnknownDeadLetter

    if args.seq and (args.reason or args.older_than):
        raise CliError("name sequences, or --reason and/or --older-than, not both")
    if not args.seq and not (args.reason or args.older_than):
        raise CliError("name sequences, or --reason R and/or --older-than AGE")
    failed = 0
    dropped = []
    if args.seq:
        for seq in args.seq:
            try:
                dropped.append(await client.discard(seq))
            except UnknownDeadLetter as exc:
                failed += 1
                print(f"dead letter {seq}: {exc}", file=sys.stderr)
    else:
        before = since_time(args.older_than, "--older-than") if args.older_than else None
        dropped = await client.discard_dead_letters(
            reason=args.reason,
            before=datetime.fromisoformat(before.replace("Z", "+00:00")) if before else None,
        )
    for letter in dropped:
        if args.json:
            print(json.dumps({"seq": letter.seq, "reason": letter.reason}))
        else:
            print(f"discarded {letter.seq} ({letter.reason}) from {letter.subject}")
    if not dropped and not args.json and not failed:
        print("no dead letters to discard")
    return EXIT_FAILED if failed else EXIT_OK


async def cmd_agents(client: Client, args: argparse.Namespace) -> int:
    agents = await client.agents()

    def table() -> None:
        rows = [
            (a.name, c.name, c.workers, c.description or "") for a in agents for c in a.capabilities
        ]
        print_table(["AGENTDEF", "CAPABILITY", "WORKERS", "DESCRIPTION"], rows)
        seen: set[str] = set()
        for a in agents:
            for w in a.workers:
                if w.instance in seen:
                    continue
                seen.add(w.instance)
                print(
                    f"worker {w.name}/{w.instance} pid={w.pid or '-'} "
                    f"capabilities={','.join(w.capabilities)} in_flight={w.in_flight}"
                )

    emit(args, agents, table)
    return EXIT_OK


async def addressed(client: Client, run_id: str) -> str:
    """What ``emit --ext runid=ID`` adds to ``sent to run ID`` when nothing takes the event:
    no run has that id, or the run has ended (``signal`` checks before it sends; ``emit``
    publishes as an outside system would, and the event was taken silently by nobody)."""
    from interlock.client import UnknownRun

    try:
        status = (await client.state(run_id)).status
    except UnknownRun:
        return ": no run has this id, so nothing takes it"
    if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        return f", which has ended ({status}): nothing takes it"
    return ""


async def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail must be 0 or more, got {args.tail}")
    fmt = output_format(args)
    records = client.logs(
        args.run_id, follow=args.follow, tail=args.tail, since=since_time(args.since)
    )
    if fmt == "yaml":
        from interlock.views import record_view

        sys.stdout.write(dump([record_view(r) async for r in records], "yaml"))
        return EXIT_OK
    async for record in records:
        _print_record(record, fmt == "json")
    return EXIT_OK


def _print_record(record: ev.AnyRecord, as_json: bool) -> None:
    if as_json:
        from interlock.core import events as ev

        sys.stdout.write(ev.encode(record).decode() + "\n")
    else:
        from interlock.cli.timeline import describe

        sys.stdout.write(describe(record) + "\n")
    sys.stdout.flush()


async def cmd_result(client: Client, args: argparse.Namespace) -> int:
    if args.wait:
        timeout = wait_timeout(args.timeout)
        try:
            result = await client.result(args.run_id, wait=True, timeout=timeout)
        except TimeoutError:
            now = await client.result(args.run_id)
            err(f"run {args.run_id} has not finished after {args.timeout:g}s ({where_it_is(now)})")
            return EXIT_NOT_FINISHED
    else:
        result = await client.result(args.run_id)
    return show_result(args, result)


async def cmd_export(client: Client, args: argparse.Namespace) -> int:
    from interlock.cli.exporting import export_lines

    records = await client.records(args.run_id)
    if args.chain:
        return await _export_chain(client, args, records)
    lines, objects = export_lines(records)
    if args.output:
        write_atomically(Path(args.output), lines)
        kept = f" and {objects} payloads kept once each" if objects else ""
        err(f"wrote {len(records)} records{kept} to {args.output}")
    else:
        from interlock.cli.terminal import write_json_lines

        write_json_lines(lines)
    before, after = _chain_links(records)
    if before or after:
        links = ([f"continues run {before}"] if before else []) + (
            [f"continued as new as run {after}"] if after else []
        )
        err(
            f"note: run {args.run_id} {' and '.join(links)}: this file holds its own log "
            f"only (interlock export {args.run_id} --chain -o DIR writes every run of its chain)"
        )
    return EXIT_OK


def _chain_links(records: list[ev.AnyRecord]) -> tuple[str | None, str | None]:
    """The run a log's run continues, and the run it continued as (None: none)."""
    from interlock.core import events as ev

    first, last = records[0], records[-1]
    before = None
    if isinstance(first, ev.RunStarted) and first.data.continued_from is not None:
        before = first.data.continued_from.run_id
    after = last.data.run_id if isinstance(last, ev.RunContinued) else None
    return before, after


async def _export_chain(client: Client, args: argparse.Namespace, records: list[Any]) -> int:
    """Every run of the chain ``args.run_id`` is in, first to newest, a file each in the
    folder ``-o`` names (``<run id>.jsonl``), as ``export -o`` writes one."""
    from interlock.cli.exporting import export_lines

    if not args.output:
        raise CliError("--chain writes a file per run: give the folder, -o DIR", EXIT_USAGE)
    folder = _folder(Path(args.output))
    run_id, before = args.run_id, _chain_links(records)[0]
    while before is not None:  # back to the first run of the chain
        run_id, records = before, await client.records(before)
        before = _chain_links(records)[0]
    logs = [(run_id, records)]
    after = _chain_links(records)[1]
    while after is not None:
        records = await client.records(after)
        logs.append((after, records))
        after = _chain_links(records)[1]
    for run, log in logs:
        write_atomically(folder / f"{run}.jsonl", export_lines(log)[0])
    err(
        f"wrote the {len(logs)} run(s) of the chain to {folder}, first to newest: "
        + ", ".join(f"{run}.jsonl ({len(log)} records)" for run, log in logs)
    )
    return EXIT_OK


def _folder(folder: Path) -> Path:
    """The folder ``--chain -o`` names, made when missing."""
    if folder.exists() and not folder.is_dir():
        raise CliError(f"--chain -o {folder}: not a folder", EXIT_USAGE)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_atomically(target: Path, data: bytes) -> None:
    """Write beside the target, then rename: never a half-written export."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def cmd_replay(args: argparse.Namespace) -> int:
    if args.file:
        return _replay(read_records(args.file), args.json)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)

    async def fetch(client: Client, a: argparse.Namespace) -> int:
        return _replay(await client.records(a.run_id), a.json)

    return with_client(fetch)(args)


def _replay(records: list[ev.AnyRecord], as_json: bool) -> int:
    """Every step of a log that folds exits 0, whatever became of the run (exit 1 is for a
    file that is not a run log)."""
    from interlock.cli.timeline import replay_lines

    for line in replay_lines(records, as_json):
        sys.stdout.write(line + "\n")
    return EXIT_OK


def exit_code(result: RunResult) -> int:
    if result.status == RunStatus.COMPLETED:
        return EXIT_OK
    if result.status in FINISHED:  # failed or cancelled
        return EXIT_FAILED
    return EXIT_NOT_FINISHED


def show_result(args: argparse.Namespace, result: RunResult, *, whole: bool = False) -> int:
    """``whole``: the table form is the whole result too (``start --wait``)."""
    code = exit_code(result)
    if whole or output_format(args) != "table":
        emit(args, result, lambda: print_json(result))
        return code
    if result.chain:
        err(f"continued as new: {' -> '.join(result.chain)}")
    if result.status == RunStatus.COMPLETED:
        print_json(result.outputs or {})
    elif result.status in FINISHED:  # failed or cancelled
        if result.outputs:  # a terminal state that fails may still return outputs
            print_json(result.outputs)
        if result.error is not None:
            why = f": {result.error.error_class}: {result.error.message}"
        elif result.reason:
            why = f": {result.reason}"
        else:
            why = ""
        err(f"run {result.run_id} {result.status}{why}")
    else:
        err(f"run {result.run_id} is {result.status} ({where_it_is(result)})")
    return code


def where_it_is(result: RunResult) -> str:
    """Where a running run is, for ``result`` and ``start --wait``: its state, or that it
    is queued before its first state (for its slots, its trigger's rate, its workflow's
    pause), which ``describe run`` details."""
    if result.state:
        return f"in state {result.state}"
    return f"queued, in no state yet: interlock describe run {result.run_id} says for what"


def wait_timeout(value: float | None) -> float | None:
    if value is not None and value < 0:
        raise CliError(f"--timeout must be 0 or more, got {value:g}")
    return value if value else None


DEFAULT_WAIT_TIMEOUT = 300.0
"""Seconds ``start --wait`` and ``result --wait`` wait by default (``--timeout 0``: no
limit)."""
