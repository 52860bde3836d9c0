"""Commands that put something on the bus (apply, start, emit, signal, cancel), and the
parser of every command that talks to a running installation: the reads it names are in
:mod:`interlock.cli.read_cmds`, the connection flags and the connected client in
:mod:`interlock.cli.connecting`. (The long-running processes, serve, agent run and dev:
:mod:`interlock.cli.process_cmds`.)

Building the parser imports nothing heavy (``--help`` and shell completion run it): each
command imports what it needs when it runs. Commands that only read never create streams
or buckets; ``apply`` (and ``serve``) do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from interlock.cli import dialect_cmds
from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    CliError,
    err,
    load_json_arg,
    read_sources,
)
from interlock.cli.connecting import (
    add_connection_flags,
    deadline_arg,
    env_int,
    print_json,
    run_id_arg,
    waiting_arg,
    with_client,
)
from interlock.cli.delete_cmd import cmd_runs_delete
from interlock.cli.output import add_output_flags, emit, output_format
from interlock.cli.read_cmds import (
    DEFAULT_WAIT_TIMEOUT,
    addressed,
    cmd_agents,
    cmd_dead_letters_discard,
    cmd_dead_letters_list,
    cmd_dead_letters_redrive,
    cmd_dead_letters_show,
    cmd_export,
    cmd_logs,
    cmd_result,
    cmd_runs,
    show_result,
    wait_timeout,
    where_it_is,
)
from interlock.core.vocabulary import RECORDED, RunStatus

if TYPE_CHECKING:
    from interlock.client import Client
    from interlock.views import GateView

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

NO_ORCHESTRATOR_AFTER_S = 2.0
"""How long ``start --wait`` waits before it checks that an orchestrator takes the run."""


def add_parsers(sub: Sub) -> None:
    _add_write_parsers(sub)
    _add_read_parsers(sub)
    _add_dead_letter_parsers(sub)


def _add_write_parsers(sub: Sub) -> None:
    """apply, start, emit, signal: the commands that put something on the bus."""
    p = sub.add_parser("apply", help="validate and store Workflows and AgentDefs")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true")
    dialect_cmds.add_dialect_option(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_apply))

    p = sub.add_parser("start", help="start a run of a workflow")
    p.add_argument("workflow", help="NAME or NAMESPACE/NAME")
    p.add_argument("--input", "-i", help="inputs as JSON or @file")
    p.add_argument("--run-id", type=run_id_arg, help="use this run id (default: a new one)")
    p.add_argument(
        "--deadline",
        type=deadline_arg,
        metavar="D",
        help="the run may take D (seconds, or 90s, 2m, 1h), over the workflow's "
        "spec.deadline; then it ends as that says (else failed, timeout). 0: at once",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the run and print its result (the run id goes to stderr at once)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT,
        help=f"seconds to wait with --wait (default {DEFAULT_WAIT_TIMEOUT:g}; 0: no limit)",
    )
    add_output_flags(p, default="json")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_start))

    p = sub.add_parser("emit", help="publish a CloudEvent as an external system would")
    p.add_argument("type", help="the CloudEvent type")
    p.add_argument("--source", required=True, help="the CloudEvent source")
    p.add_argument("--data", help="data as JSON or @file")
    p.add_argument("--id", help="the CloudEvent id (default: a new one)")
    p.add_argument("--subject", help="the CloudEvent subject")
    p.add_argument("--ext", action="append", default=[], metavar="K=V", help="extension attribute")
    p.add_argument(
        "--wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the runs it starts to appear (default 5; 0: do not wait)",
    )
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_emit))

    p = sub.add_parser("signal", help="send a named event to one run (e.g. an approval)")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("name", help="the event type the run waits for, e.g. approval.granted")
    p.add_argument("--data", help="data as JSON or @file")
    p.add_argument("--source", default="interlock://cli", help="the CloudEvent source")
    p.add_argument("--id", help="the CloudEvent id (default: a new one)")
    p.add_argument(
        "--wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the run to take it (default 5)",
    )
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_signal))


def _add_read_parsers(sub: Sub) -> None:
    """runs, agents, logs, result, cancel, export: the commands about runs."""
    p = sub.add_parser("runs", help="list runs, newest first")
    p.add_argument("--workflow", "-w")
    p.add_argument("--status", choices=RECORDED)
    p.add_argument(
        "--waiting",
        type=waiting_arg,
        metavar="KIND[:NAME]",
        help="only running runs waiting for this: approval, event, agent, workflow, timer or "
        "slot, or one by name (agent:review, event:fix.pushed)",
    )
    p.add_argument("--limit", "-n", type=int, default=None, help="at most this many")
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_runs))
    runs_sub = p.add_subparsers(dest="runs_command", metavar="COMMAND")
    q = runs_sub.add_parser(
        "delete", help="delete an ended run's log and index entry (recorded in the audit stream)"
    )
    q.add_argument("run_id", type=run_id_arg)
    archive = q.add_mutually_exclusive_group()
    archive.add_argument(
        "--archive-bucket", metavar="NAME", help="first write its log to this Object Store bucket"
    )
    archive.add_argument("--archive-dir", metavar="DIR", help="first write its log to this folder")
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_runs_delete))

    p = sub.add_parser("agents", help="list AgentDefs and live agent workers")
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_agents))

    p = sub.add_parser("logs", help="a run's timeline")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N records")
    p.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only records from WHEN on: an RFC 3339 time, or an age such as 30s, 5m, 2h, 1d",
    )
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_logs))

    p = sub.add_parser("result", help="a run's outputs")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--wait", action="store_true")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT,
        help=f"seconds to wait with --wait (default {DEFAULT_WAIT_TIMEOUT:g}; 0: no limit)",
    )
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_result))

    p = sub.add_parser("cancel", help="cancel a run")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--reason", default="cancelled by user")
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_cancel))

    p = sub.add_parser("export", help="write a run's log as JSONL CloudEvents")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("-o", "--output", help="file (default stdout); with --chain, a folder")
    p.add_argument(
        "--chain",
        action="store_true",
        help="every run of its chain of runs continued as new, a file each in the -o folder",
    )
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_export))


def _add_dead_letter_parsers(sub: Sub) -> None:
    p = sub.add_parser(
        "dead-letters", help="messages that could not be handled: list, show, redrive"
    )
    dl = p.add_subparsers(dest="dead_letters_command", metavar="COMMAND", required=True)
    q = dl.add_parser("list", help="the dead letters kept, oldest first")
    q.add_argument("--reason", help="only this reason (e.g. processing-failed)")
    add_output_flags(q)
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_dead_letters_list))
    q = dl.add_parser("show", help="one dead letter: why, where from, headers and data")
    q.add_argument("seq", type=int, help="its sequence (from `dead-letters list`)")
    add_output_flags(q, default="json")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_dead_letters_show))
    q = dl.add_parser(
        "redrive", help="publish dead letters again to where they came from, then drop them"
    )
    which = q.add_mutually_exclusive_group(required=True)
    which.add_argument("seq", type=int, nargs="*", default=[], help="sequences to redrive")
    which.add_argument("--all", action="store_true", help="every letter (of --reason)")
    q.add_argument("--reason", help="with --all: only this reason")
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_dead_letters_redrive))
    q = dl.add_parser(
        "discard",
        help="drop dead letters without publishing them: by sequence, reason or age",
        description="Drop the dead letters named by SEQ, or those of --reason and/or kept "
        "longer than --older-than (at least one of the two); nothing is published.",
    )
    q.add_argument("seq", type=int, nargs="*", default=[], help="sequences to discard")
    q.add_argument("--reason", help="every letter of this reason")
    q.add_argument(
        "--older-than", metavar="AGE", help="every letter kept longer than AGE (30s, 5m, 2h, 1d)"
    )
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_dead_letters_discard))


# -- commands ---------------------------------------------------------------------------


async def cmd_apply(client: Client, args: argparse.Namespace) -> int:
    from interlock.dialects import prepare

    # The same replica count as `serve`: provisioning with fewer would scale an R3
    # installation's streams down.
    await client.provision(replicas=env_int(None, "INTERLOCK_REPLICAS", 1))
    prepared = prepare(read_sources(args.files), dialect_cmds.dialect_of(args))
    result = await client.ops.apply(
        prepared.sources,
        documents=prepared.documents,
        implied_agents=prepared.agents,
        diagnostics=prepared.diagnostics,
        lowered=prepared.lowered,
    )
    for d in result.compiled.diagnostics:
        err(str(d))
    dialect_cmds.print_warnings(prepared.warnings)
    if not result.compiled.ok:
        n = len(result.compiled.diagnostics)
        err(f"{n} error{'s' if n != 1 else ''}; nothing was applied")
        return EXIT_FAILED
    if args.json:
        print_json(
            [
                {
                    "kind": a.kind,
                    "namespace": a.namespace,
                    "name": a.name,
                    "version": a.version,
                    "changed": a.changed,
                }
                for a in result.applied
            ]
        )
        return EXIT_OK
    for a in result.applied:
        what = "applied" if a.changed else "unchanged"
        suffix = f" (version {a.version})" if a.kind == "Workflow" else ""
        print(f"{what}  {a.kind.lower()} {a.namespace}/{a.name}{suffix}")
    return EXIT_OK


def _json_option(value: str | None, what: str) -> Any:
    """``--input`` / ``--data``: text that is not JSON is invalid input (exit 1, as inputs
    that break the workflow's types are); an unreadable ``@file`` stays a usage error."""
    try:
        return load_json_arg(value, what)
    except CliError as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError):
            raise CliError(str(exc), EXIT_FAILED) from exc.__cause__
        raise


async def cmd_start(client: Client, args: argparse.Namespace) -> int:
    inputs = _json_option(args.input, "--input")
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise CliError("--input must be a JSON object", EXIT_FAILED)
    timeout = wait_timeout(args.timeout)
    run_id = await client.start(args.workflow, inputs, run_id=args.run_id, deadline=args.deadline)
    if not args.wait:
        if output_format(args) == "table" or not (args.json or args.output):
            print(run_id)
        else:
            emit(args, {"run_id": run_id})
        return EXIT_OK
    # The run id at once: Ctrl-C leaves the run going, and something to look it up by.
    err(f"started {run_id}; waiting for it to end (Ctrl-C stops waiting, not the run)")
    waiting = asyncio.ensure_future(client.result(run_id, wait=True, timeout=timeout))
    try:
        done, _ = await asyncio.wait({waiting}, timeout=NO_ORCHESTRATOR_AFTER_S)
        if not done and await client.orchestrator_seen() is False:
            err(
                f"no orchestrator is taking runs on {args.server or 'this server'} "
                f"(prefix {client.subjects.prefix}): the run stays at its start until one "
                "runs (interlock serve, or interlock dev)"
            )
        result = await waiting
    except TimeoutError:
        now = await client.result(run_id)
        err(f"run {run_id} has not finished after {args.timeout:g}s ({where_it_is(now)})")
        emit(args, now, lambda: print_json({"run_id": run_id}))
        return EXIT_NOT_FINISHED
    finally:
        waiting.cancel()
    return show_result(args, result, whole=True)


async def cmd_emit(client: Client, args: argparse.Namespace) -> int:
    extensions: dict[str, str] = {}
    for item in args.ext:
        if "=" not in item:
            raise CliError(f"--ext {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        extensions[key.strip().lower()] = value
    data = _json_option(args.data, "--data")
    try:
        done = await client.emit(
            type=args.type,
            source=args.source,
            id=args.id,
            subject=args.subject,
            data=data,
            extensions=extensions,
            wait=max(args.wait, 0.0),
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    told = done.run_id and done.unknown is None and output_format(args) == "table"
    ended = await addressed(client, done.run_id) if told and done.run_id else ""

    def table() -> None:
        dup = " (a duplicate: dropped)" if done.duplicate else ""
        if done.unknown is not None:
            print(f"sent {done.type} id={done.id}{dup}")
            print(done.unknown)
            return
        print(f"emitted {done.type} id={done.id}{dup}")
        if done.run_id:
            print(f"sent to run {done.run_id}{ended}")
        for s in done.started:
            how = "started before" if s.existed else "started"
            if s.pending and not s.existed:
                how = "not started yet: no orchestrator took the event"
            print(f"{how}  {s.run_id}  {s.namespace}/{s.workflow} v{s.version}")
        for run in done.reached:
            print(f"reached  {run}  (waiting for it by its correlation key)")
        for workflow in done.parked:
            print(f"kept for {workflow}: no run of its correlation key yet (kept 15 minutes)")
        for window in done.gathered:
            print(f"gathered into the window of {window}: its run starts when it closes")
        for r in done.refused:
            print(f"dead-lettered ({r.reason}) by {r.namespace}/{r.workflow}: {r.detail}")
        if not done.matched and not done.refused:
            print(f"nothing: no trigger or correlation takes {done.type}")

    emit(args, done, table)
    return EXIT_OK


async def cmd_signal(client: Client, args: argparse.Namespace) -> int:
    data = _json_option(args.data, "--data")
    told = await client.signal(
        args.run_id, args.name, data, source=args.source, id=args.id, wait=max(args.wait, 0.0)
    )
    # The decision that took it may also have ended the run: failed (or cancelled) is
    # not what the signal was for.
    ended = told.after in (RunStatus.FAILED, RunStatus.CANCELLED)
    code = EXIT_OK if told.outcome in ("moved", "recorded", "held") and not ended else EXIT_FAILED
    if output_format(args) != "table":
        emit(args, told)
        return code
    run, name = told.run_id, told.type
    if told.addressed:
        print(f"run {told.addressed} continued as new: {name} went to {run}, its newest run")
    if told.outcome == "moved":
        moved = f"{name} moved run {run} from {told.state} to {told.to_state}"
        if ended:
            err(f"{moved} and {told.after}: {told.error or 'no reason given'}")
        elif told.after == RunStatus.COMPLETED:
            print(f"{moved} and completed")
        elif told.continued_to:
            print(f"{moved}, continued as new as run {told.continued_to}")
        else:
            print(moved)
        _print_gates(told.gates)
    elif told.outcome == "recorded":
        print(f"{name} recorded by run {run} (in state {told.state}) as evidence")
        _print_gates(told.gates)
        if not told.gates:
            print("  no gate checked it yet: a gate reads the evidence kept when it is checked")
    elif told.outcome == "held" and told.held_until == "admitted":
        print(f"{name} held by run {run}, queued for its slots: decided on when it is admitted")
    elif told.outcome == "held":
        print(f"{name} held by paused run {run}: decided on when it is resumed")
    elif told.outcome == "declined":
        err(f"run {run} took {name} in state {told.state}, but no guard was true: it stays")
        for why in told.declined:
            err(f"  {why}")
    elif told.outcome == "finished":
        err(f"run {run} is already {told.status} (in state {told.state}); nothing was sent")
    elif told.outcome == "not-waiting" and not told.state:
        err(f"run {run} is queued, in no state yet: it takes no event until it is admitted")
        err(f"(`interlock describe run {run}` says what it waits for); nothing was sent")
    elif told.outcome == "not-waiting":
        waits = ", ".join(told.waiting_for) or "nothing"
        err(
            f"run {run} is in state {told.state}, which does not wait for {name} "
            f"(it waits for: {waits}); nothing was sent"
        )
    else:
        err(
            f"sent {name} to {run}; no orchestrator took it within {args.wait:g}s (is one running?)"
        )
    if told.outcome != "declined":  # declined lists them with the rest
        for problem in told.guard_errors:
            err(f"guard failed: {problem}")
    return code


def _print_gates(gates: list[GateView]) -> None:
    """What each evidence gate checked with a signal found."""
    for gate in gates:
        what = f"step {gate.step}" if gate.step else f"state {gate.state}"
        if gate.subject and gate.subject not in (gate.step, gate.state):
            what += f" ({gate.subject})"
        if gate.proven:
            print(f"  gate of {what}: proven, it goes on")
        else:
            print(f"  gate of {what}: not proven yet, missing {', '.join(gate.missing)}")


async def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    done = await client.cancel(args.run_id, args.reason)
    summary = await client.run(args.run_id)
    if args.json:
        print_json({"run_id": args.run_id, "cancelled": done, "status": summary.status})
    elif done:
        print(f"cancelled {args.run_id}")
    else:
        err(f"run {args.run_id} is already {summary.status}")
    return EXIT_OK if done else EXIT_FAILED


# -- shared with the process and gateway commands ------------------------------------------
