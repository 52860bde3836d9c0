"""Commands that talk to a NATS server: apply, start, emit, runs, agents, logs, result,
cancel, export, replay, dead-letters. (The long-running processes, serve, agent run and
dev: :mod:`interlock.cli.process_cmds`.)"""

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
    print_json,
    read_sources,
)
from interlock.cli.timeline import describe, replay_lines
from interlock.core import events as ev
from interlock.core.ids import InvalidRunId, check_run_id
from interlock.core.state import RunState, fold
from interlock.core.vocabulary import FINISHED
from interlock.dialects import prepare
from interlock.runtime.client import RunExists
from interlock.runtime.registry import UnknownWorkflow
from interlock.runtime.runs import InvalidInputs, UnknownRun, utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import ConnectionFailed
from interlock.transport.provision import provision

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


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
    """Run ``body(client, args)`` connected; connection problems exit 2 with the reason."""
    from nats.errors import MaxPayloadError

    from interlock.runtime.client import InterlockClient

    def run(args: argparse.Namespace) -> int:
        async def go() -> int:
            opts = options(args)
            try:
                nc = await connect(opts)
            except ConnectionFailed as exc:
                raise CliError(str(exc)) from exc
            try:
                client = InterlockClient(nc, opts.subjects)
                # The same replica count as `serve`: provisioning with fewer would scale
                # an R3 installation's streams down.
                replicas = _env_int(None, "INTERLOCK_REPLICAS", 1)
                await provision(client.js, opts.subjects, replicas=replicas)
                return await body(client, args)
            finally:
                # Closing: a connection already gone leaves nothing to undo.
                with contextlib.suppress(Exception):
                    await nc.close()

        try:
            return asyncio.run(go())
        except UnknownRun as exc:
            raise CliError(f"no run {exc.args[0]!r}", EXIT_FAILED) from exc
        except UnknownWorkflow as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        except InvalidInputs as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        except RunExists as exc:
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
    p.add_argument("--wait", action="store_true", help="wait for the run and print its result")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait with --wait")
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_start))

    p = sub.add_parser("emit", help="publish a CloudEvent as an external system would")
    p.add_argument("type", help="the CloudEvent type")
    p.add_argument("--source", required=True, help="the CloudEvent source")
    p.add_argument("--data", help="data as JSON or @file")
    p.add_argument("--id", help="the CloudEvent id (default: a new one)")
    p.add_argument("--subject", help="the CloudEvent subject")
    p.add_argument("--ext", action="append", default=[], metavar="K=V", help="extension attribute")
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_emit))

    p = sub.add_parser("signal", help="send a named event to one run (e.g. an approval)")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("name", help="the event type the run waits for, e.g. approval.granted")
    p.add_argument("--data", help="data as JSON or @file")
    p.add_argument("--source", default="interlock://cli", help="the CloudEvent source")
    p.add_argument("--id", help="the CloudEvent id (default: a new one)")
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_signal))


def _add_read_parsers(sub: Sub) -> None:
    """runs, agents, logs, result, cancel, export: the commands about runs."""
    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--workflow", "-w")
    p.add_argument("--status", choices=["running", "completed", "failed", "cancelled"])
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_runs))

    p = sub.add_parser("agents", help="list AgentDefs and live agent workers")
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_agents))

    p = sub.add_parser("logs", help="a run's timeline")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--json", action="store_true", help="JSONL CloudEvents")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_logs))

    p = sub.add_parser("result", help="a run's outputs")
    p.add_argument("run_id", type=run_id_arg)
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--json", action="store_true", help="the whole result as JSON")
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
    q.add_argument("--json", action="store_true", help="one JSON object per letter")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_dead_letters_list))
    q = dl.add_parser("show", help="one dead letter: why, where from, headers and data")
    q.add_argument("seq", type=int, help="its sequence (from `dead-letters list`)")
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


async def cmd_apply(client: Any, args: argparse.Namespace) -> int:
    prepared = prepare(read_sources(args.files), dialect_cmds.dialect_of(args))
    result = await client.apply(
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


def _json_option(value: str | None, what: str) -> Any:
    """``--input`` / ``--data``: text that is not JSON is invalid input (exit 1, as inputs
    that break the workflow's types are); an unreadable ``@file`` stays a usage error."""
    try:
        return load_json_arg(value, what)
    except CliError as exc:
        if isinstance(exc.__cause__, json.JSONDecodeError):
            raise CliError(str(exc), EXIT_FAILED) from exc.__cause__
        raise


async def cmd_start(client: Any, args: argparse.Namespace) -> int:
    inputs = _json_option(args.input, "--input")
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise CliError("--input must be a JSON object", EXIT_FAILED)
    run_id = await client.start(args.workflow, inputs, args.run_id)
    if not args.wait:
        if args.json:
            print_json({"run_id": run_id})
        else:
            print(run_id)
        return EXIT_OK
    try:
        state = await client.wait(run_id, args.timeout)
    except TimeoutError:
        err(f"run {run_id} has not finished after {args.timeout}s")
        print(run_id)
        return EXIT_NOT_FINISHED
    return _print_result(state, args.json, with_id=True)


def _print_result(state: RunState, as_json: bool, with_id: bool = False) -> int:
    code = EXIT_OK if state.status == "completed" else EXIT_FAILED
    if state.status not in FINISHED:
        code = EXIT_NOT_FINISHED
    if as_json or with_id:
        body: dict[str, Any] = {
            "run_id": state.run_id,
            "status": state.status,
            "outputs": state.outputs,
        }
        if state.error is not None:
            body["error"] = {"class": state.error.error_class, "message": state.error.message}
        print_json(body)
        return code
    if state.status == "completed":
        print_json(state.outputs or {})
    elif state.status in ("failed", "cancelled"):
        if state.outputs:  # a terminal state that fails may still return outputs
            print_json(state.outputs)
        why = f": {state.error.error_class}: {state.error.message}" if state.error else ""
        err(f"run {state.run_id} {state.status}{why}")
    else:
        err(f"run {state.run_id} is {state.status} (in state {state.state})")
    return code


async def cmd_emit(client: Any, args: argparse.Namespace) -> int:
    import secrets

    extensions: dict[str, str] = {}
    for item in args.ext:
        if "=" not in item:
            raise CliError(f"--ext {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        extensions[key.strip().lower()] = value
    data = _json_option(args.data, "--data")
    event = CloudEvent(
        id=args.id or secrets.token_hex(8),
        source=args.source,
        type=args.type,
        subject=args.subject,
        time=utc_now(),
        datacontenttype="application/json" if data is not None else None,
        data=data,
        extensions=extensions,
    )
    try:
        seq = await client.emit(event)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        print_json({"id": event.id, "type": event.type, "source": event.source, "seq": seq})
    else:
        print(f"emitted {event.type} id={event.id}")
    return EXIT_OK


async def cmd_signal(client: Any, args: argparse.Namespace) -> int:
    import secrets

    state = await client.state(args.run_id)
    if state.finished:
        raise CliError(f"run {args.run_id} is already {state.status}", EXIT_FAILED)
    data = load_json_arg(args.data, "--data")
    event = CloudEvent(
        id=args.id or secrets.token_hex(8),
        source=args.source,
        type=args.name,
        time=utc_now(),
        datacontenttype="application/json" if data is not None else None,
        data=data,
        extensions={"runid": args.run_id},
    )
    try:
        await client.emit(event)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        print_json({"run_id": args.run_id, "type": event.type, "id": event.id})
    else:
        print(f"sent {event.type} to {args.run_id} (in state {state.state})")
    return EXIT_OK


async def cmd_runs(client: Any, args: argparse.Namespace) -> int:
    runs = await client.list_runs(args.workflow, args.status)
    if args.json:
        print_json(runs)
        return EXIT_OK
    if not runs:
        print("no runs")
        return EXIT_OK
    print(f"{'RUN':26} {'WORKFLOW':28} {'STATUS':10} {'STATE':18} STARTED")
    for r in runs:
        name = f"{r.get('namespace', 'default')}/{r.get('workflow', '?')}"
        print(
            f"{r.get('run_id', ''):26} {name:28} {r.get('status', '?'):10} "
            f"{r.get('state', ''):18} {r.get('started_at', '')}"
        )
    return EXIT_OK


async def cmd_dead_letters_list(client: Any, args: argparse.Namespace) -> int:
    letters = await client.dead_letters(args.reason)
    if args.json:
        for letter in letters:
            print(json.dumps(letter.to_json(), separators=(",", ":")))
        return EXIT_OK
    if not letters:
        print("no dead letters" + (f" with reason {args.reason}" if args.reason else ""))
        return EXIT_OK
    print(f"{'SEQ':>6} {'TIME':24} {'REASON':22} {'FROM':36} DETAIL")
    for d in letters:
        detail = d.detail if len(d.detail) <= 80 else d.detail[:77] + "..."
        print(f"{d.seq:>6} {d.time:24} {d.reason:22} {d.subject:36} {detail}")
    return EXIT_OK


async def cmd_dead_letters_show(client: Any, args: argparse.Namespace) -> int:
    from interlock.runtime.client import UnknownDeadLetter

    try:
        letter = await client.dead_letter(args.seq)
    except UnknownDeadLetter as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    print_json(letter.to_json())
    return EXIT_OK


async def cmd_dead_letters_redrive(client: Any, args: argparse.Namespace) -> int:
    from interlock.runtime.client import UnknownDeadLetter

    if args.reason and not args.all:
        raise CliError("--reason goes with --all (name sequences, or --all --reason R)")
    seqs = [d.seq for d in await client.dead_letters(args.reason)] if args.all else args.seq
    failed = 0
    for seq in seqs:
        try:
            letter, stored = await client.redrive(seq)
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


async def cmd_agents(client: Any, args: argparse.Namespace) -> int:
    found = await client.agents()
    if args.json:
        print_json(found)
        return EXIT_OK
    live: dict[str, int] = {}
    for w in found["workers"]:
        for cap in w.get("capabilities", []):
            live[cap] = live.get(cap, 0) + 1
    print(f"{'AGENTDEF':24} {'CAPABILITY':24} WORKERS")
    for name, spec in sorted(found["agentdefs"].items()):
        for cap in spec.get("capabilities", []):
            print(f"{name:24} {cap.get('name', ''):24} {live.get(cap.get('name'), 0)}")
    for w in found["workers"]:
        print(
            f"worker {w.get('name')}/{w.get('instance')} pid={w.get('pid')} "
            f"capabilities={','.join(w.get('capabilities', []))} in_flight={w.get('in_flight')}"
        )
    return EXIT_OK


async def cmd_logs(client: Any, args: argparse.Namespace) -> int:
    if args.follow:
        await client.read(args.run_id)  # no such run: say so rather than wait forever
        async for record in client.follow(args.run_id):
            _print_record(record, args.json)
        return EXIT_OK
    for record in await client.read(args.run_id):
        _print_record(record, args.json)
    return EXIT_OK


def _print_record(record: ev.AnyRecord, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(ev.encode(record).decode() + "\n")
    else:
        sys.stdout.write(describe(record) + "\n")
    sys.stdout.flush()


async def cmd_result(client: Any, args: argparse.Namespace) -> int:
    if args.wait:
        await client.read(args.run_id)  # no such run: say so rather than wait forever
        try:
            state = await client.wait(args.run_id, args.timeout)
        except TimeoutError:
            err(f"run {args.run_id} has not finished after {args.timeout}s")
            return EXIT_NOT_FINISHED
    else:
        state = await client.state(args.run_id)
    return _print_result(state, args.json)


async def cmd_cancel(client: Any, args: argparse.Namespace) -> int:
    done = await client.cancel(args.run_id, args.reason)
    state = await client.state(args.run_id)
    if args.json:
        print_json({"run_id": args.run_id, "cancelled": done, "status": state.status})
    elif done:
        print(f"cancelled {args.run_id}")
    else:
        err(f"run {args.run_id} is already {state.status}")
    return EXIT_OK if done else EXIT_FAILED


async def cmd_export(client: Any, args: argparse.Namespace) -> int:
    records = await client.read(args.run_id)
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

    async def fetch(client: Any, a: argparse.Namespace) -> int:
        return _replay(await client.read(a.run_id), a.json)

    return with_client(fetch)(args)


def _replay(records: list[ev.AnyRecord], as_json: bool) -> int:
    for line in replay_lines(records, as_json):
        sys.stdout.write(line + "\n")
    state = fold(records)
    return EXIT_OK if state.status in ("completed", "running") else EXIT_FAILED


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
