"""Commands that talk to a NATS server: apply, start, emit, signal, runs, agents, logs,
result, cancel, export, replay, dead-letters. (The long-running processes, serve, agent
run and dev: :mod:`interlock.cli.process_cmds`.)

Building the parser imports nothing heavy (``--help`` and shell completion run it): each
command imports what it needs when it runs. Commands that only read never create streams
or buckets; ``apply`` (and ``serve``) do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.cli import dialect_cmds
from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    err,
    load_json_arg,
    read_sources,
)
from interlock.cli.output import add_output_flags, dump, emit, output_format, print_table
from interlock.core.ids import InvalidRunId, check_run_id
from interlock.core.vocabulary import RECORDED

if TYPE_CHECKING:
    from interlock.client import Client
    from interlock.core import events as ev
    from interlock.transport.connection import ConnectOptions
    from interlock.views import RunResult

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_WAIT_TIMEOUT = 300.0
"""Seconds ``start --wait`` and ``result --wait`` wait by default (``--timeout 0``: no
limit)."""
NO_ORCHESTRATOR_AFTER_S = 2.0
"""How long ``start --wait`` waits before it checks that an orchestrator takes the run."""


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection (flags override INTERLOCK_* variables)")
    g.add_argument("--server", "-s", help="NATS URL(s) (env INTERLOCK_URL; nats://127.0.0.1:4222)")
    g.add_argument("--creds", dest="creds_file", help="NATS credentials file")
    g.add_argument("--nkey", dest="nkey_seed_file", help="NKey seed file")
    g.add_argument("--user", help="user name")
    g.add_argument("--password", help="password")
    g.add_argument("--token", help="auth token")
    g.add_argument("--tls-ca", dest="tls_ca", help="CA certificate (PEM)")
    g.add_argument("--tls-cert", dest="tls_cert", help="client certificate (PEM)")
    g.add_argument("--tls-key", dest="tls_key", help="client key (PEM)")
    g.add_argument("--prefix", help="subject prefix (env INTERLOCK_PREFIX; default il)")


def options(args: argparse.Namespace, *, operator: bool = True) -> ConnectOptions:
    """Connection options from the flags and environment. For the operator's commands
    (``operator``), with no credentials given, the ones ``interlock dev`` wrote under
    ``.interlock/creds/`` in this directory."""
    creds_file = args.creds_file
    if operator and not (
        creds_file
        or args.nkey_seed_file
        or args.user
        or args.token
        or any(
            os.environ.get(v)
            for v in ("INTERLOCK_CREDS", "INTERLOCK_NKEY", "INTERLOCK_USER", "INTERLOCK_TOKEN")
        )
    ):
        from interlock.auth.dev import default_operator_creds

        creds_file = default_operator_creds()
    from interlock.transport.connection import ConnectOptions

    return ConnectOptions.resolve(
        args.server,
        creds_file=creds_file,
        nkey_seed_file=args.nkey_seed_file,
        user=args.user,
        password=args.password,
        token=args.token,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        prefix=args.prefix,
    )


def with_client(
    body: Callable[[Any, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    """Run ``body(client, args)`` with a connected :class:`interlock.Client`; connection
    problems exit 2 with the reason, a missing run, workflow or agent exits 1."""

    def run(args: argparse.Namespace) -> int:
        from nats.errors import MaxPayloadError

        from interlock.client import (
            Client,
            InvalidInputs,
            RunExists,
            UnknownAgent,
            UnknownRun,
            UnknownWorkflow,
        )
        from interlock.transport.connection import connect
        from interlock.transport.errors import ConnectionFailed

        async def go() -> int:
            opts = options(args)
            try:
                nc = await connect(opts)
            except ConnectionFailed as exc:
                raise CliError(str(exc)) from exc
            client = Client(nc, opts.subjects, owns_connection=True)
            try:
                return await body(client, args)
            finally:
                with contextlib.suppress(Exception):
                    await client.close()

        try:
            return asyncio.run(go())
        except UnknownRun as exc:
            raise CliError(f"no run {exc.args[0]!r}", EXIT_FAILED) from exc
        except (UnknownWorkflow, UnknownAgent, InvalidInputs, RunExists) as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        except InvalidRunId as exc:
            raise CliError(str(exc)) from exc
        except MaxPayloadError as exc:
            raise CliError(
                f"a message is larger than the server accepts ({exc or 'max_payload'})",
                EXIT_FAILED,
            ) from exc

    return run


def run_id_arg(value: str) -> str:
    """A RUN_ID argument: refused before anything connects when it is no run id."""
    try:
        return check_run_id(value)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    p.add_argument("--limit", "-n", type=int, default=None, help="at most this many")
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_runs))

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
        help="only records from WHEN on: an RFC 3339 time, or an age such as 30s, 5m, 2h",
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
    p.add_argument("-o", "--output", help="file (default stdout)")
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


# -- commands ---------------------------------------------------------------------------


async def cmd_apply(client: Client, args: argparse.Namespace) -> int:
    from interlock.dialects import prepare

    # The same replica count as `serve`: provisioning with fewer would scale an R3
    # installation's streams down.
    await client.provision(replicas=_env_int(None, "INTERLOCK_REPLICAS", 1))
    prepared = prepare(read_sources(args.files), dialect_cmds.dialect_of(args))
    result = await client.ops.apply(
        prepared.sources,
        documents=prepared.documents,
        implied_agents=prepared.agents,
        diagnostics=prepared.diagnostics,
    )
    for d in result.compiled.diagnostics:
        err(str(d))
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


def print_json(value: Any) -> None:
    sys.stdout.write(dump(value, "json"))


def _json_option(value: str | None, what: str) -> Any:
    """``--input`` / ``--data``: text that is not JSON is invalid input (exit 1, as inputs
    that break the workflow's types are); an unreadable ``@file`` stays a usage error."""
    try:
        return load_json_arg(value, what)
    except CliError as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError):
            raise CliError(str(exc), EXIT_FAILED) from exc.__cause__
        raise


def _timeout(value: float | None) -> float | None:
    if value is not None and value < 0:
        raise CliError(f"--timeout must be 0 or more, got {value:g}")
    return value if value else None


async def cmd_start(client: Client, args: argparse.Namespace) -> int:
    inputs = _json_option(args.input, "--input")
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise CliError("--input must be a JSON object", EXIT_FAILED)
    timeout = _timeout(args.timeout)
    run_id = await client.start(args.workflow, inputs, run_id=args.run_id)
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
        err(f"run {run_id} has not finished after {args.timeout:g}s")
        emit(args, await client.result(run_id), lambda: print_json({"run_id": run_id}))
        return EXIT_NOT_FINISHED
    finally:
        waiting.cancel()
    return _show_result(args, result, whole=True)


def _exit_code(result: RunResult) -> int:
    if result.status == "completed":
        return EXIT_OK
    if result.status in ("failed", "cancelled"):
        return EXIT_FAILED
    return EXIT_NOT_FINISHED


def _show_result(args: argparse.Namespace, result: RunResult, *, whole: bool = False) -> int:
    """``whole``: the table form is the whole result too (``start --wait``)."""
    code = _exit_code(result)
    if whole or output_format(args) != "table":
        emit(args, result, lambda: print_json(result))
        return code
    if result.status == "completed":
        print_json(result.outputs or {})
    elif result.status in ("failed", "cancelled"):
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
        err(f"run {result.run_id} is {result.status} (in state {result.state})")
    return code


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

    def table() -> None:
        dup = " (a duplicate: dropped)" if done.duplicate else ""
        print(f"emitted {done.type} id={done.id}{dup}")
        if done.run_id:
            print(f"sent to run {done.run_id}")
        for s in done.started:
            how = (
                "started before"
                if s.existed
                else "not started yet: no orchestrator took the event"
                if s.pending
                else "started"
            )
            print(f"{how}  {s.run_id}  {s.namespace}/{s.workflow} v{s.version}")
        if not done.matched:
            print(f"no trigger matches {done.type}: no run started")

    emit(args, done, table)
    return EXIT_OK


async def cmd_signal(client: Client, args: argparse.Namespace) -> int:
    data = _json_option(args.data, "--data")
    told = await client.signal(
        args.run_id, args.name, data, source=args.source, id=args.id, wait=max(args.wait, 0.0)
    )
    code = EXIT_OK if told.outcome == "moved" else EXIT_FAILED
    if output_format(args) != "table":
        emit(args, told)
        return code
    run, name = told.run_id, told.type
    if told.outcome == "moved":
        print(f"{name} moved run {run} from {told.state} to {told.to_state}")
    elif told.outcome == "declined":
        err(f"run {run} took {name} in state {told.state}, but no guard was true: it stays")
    elif told.outcome == "finished":
        err(f"run {run} is already {told.status} (in state {told.state}); nothing was sent")
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
    for problem in told.guard_errors:
        err(f"guard failed: {problem}")
    return code


async def cmd_runs(client: Client, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise CliError(f"--limit must be 0 or more, got {args.limit}")
    runs = await client.runs(workflow=args.workflow, status=args.status, limit=args.limit)

    def table() -> None:
        if not runs:
            print("no runs")
            return
        print_table(
            ["RUN", "WORKFLOW", "STATUS", "STATE", "STARTED"],
            [
                (r.run_id, f"{r.namespace}/{r.workflow}", r.status, r.state, r.started_at)
                for r in runs
            ],
        )

    emit(args, runs, table)
    return EXIT_OK


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
    from interlock.client import UnknownDeadLetter

    try:
        letter = await client.dead_letter(args.seq)
    except UnknownDeadLetter as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
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
                    f"worker {w.name}/{w.instance} pid={w.pid} "
                    f"capabilities={','.join(w.capabilities)} in_flight={w.in_flight}"
                )

    emit(args, agents, table)
    return EXIT_OK


def _since(value: str | None) -> str | None:
    """``--since``: an RFC 3339 time as given, or an age (``30s``, ``5m``, ``2h``, ``1d``)
    turned into the time that long ago."""
    if value is None:
        return None
    import re
    from datetime import UTC, datetime, timedelta

    age = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", value.strip())
    if age is None:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise CliError(
                f"--since {value!r}: give an RFC 3339 time (2026-01-02T15:04:05Z) "
                "or an age such as 30s, 5m, 2h, 1d"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
    else:
        unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        moment = datetime.now(UTC) - timedelta(seconds=float(age.group(1)) * unit)
    # Records carry UTC times with milliseconds: compare as text in the same form.
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail must be 0 or more, got {args.tail}")
    fmt = output_format(args)
    records = client.logs(args.run_id, follow=args.follow, tail=args.tail, since=_since(args.since))
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
        timeout = _timeout(args.timeout)
        try:
            result = await client.result(args.run_id, wait=True, timeout=timeout)
        except TimeoutError:
            err(f"run {args.run_id} has not finished after {args.timeout:g}s")
            return EXIT_NOT_FINISHED
    else:
        result = await client.result(args.run_id)
    return _show_result(args, result)


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


async def cmd_export(client: Client, args: argparse.Namespace) -> int:
    from interlock.core import events as ev

    records = await client.records(args.run_id)
    lines = b"".join(ev.encode(record) + b"\n" for record in records)
    if args.output:
        _write_atomically(Path(args.output), lines)
        err(f"wrote {len(records)} records to {args.output}")
    else:
        sys.stdout.buffer.write(lines)
    return EXIT_OK


def _write_atomically(target: Path, data: bytes) -> None:
    """Write beside the target, then rename: never a half-written export."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def cmd_replay(args: argparse.Namespace) -> int:
    from interlock.core import events as ev

    if args.file:
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise CliError(f"{args.file}: cannot read: {exc.strerror}") from exc
        try:
            records = ev.decode_lines(data)
        except Exception as exc:
            raise CliError(f"{args.file}: not a run log: {exc}", EXIT_FAILED) from exc
        return _replay(records, args.json)
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


# -- shared with the process and gateway commands ------------------------------------------


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@contextlib.contextmanager
def _signals(stop: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _env_int(value: int | None, var: str, default: int) -> int:
    """A flag's value, else the environment variable ``var``, else ``default``."""
    if value is not None:
        return value
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise CliError(f"{var} must be a whole number, got {raw!r}", EXIT_USAGE) from None


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
