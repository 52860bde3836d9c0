"""``interlock gateway`` (the HTTP gateway process) and ``interlock tokens`` (its callers)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    add_object_flags,
    object_limits,
    print_json,
)
from interlock.cli.connecting import (
    add_connection_flags,
    add_log_level,
    connect_failure,
    env_int,
    options,
    setup_logging,
    stop_on_signals,
    with_client,
)
from interlock.cli.output import print_table
from interlock.transport.connection import connect
from interlock.transport.errors import ConnectionFailed

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_HTTP_PORT = 8480


def add_parsers(sub: Sub) -> None:
    p = sub.add_parser(
        "gateway",
        help="serve CloudEvents over HTTP, signed webhooks and the REST API",
        description="The HTTP gateway: a NATS client like any other, run as many as needed.",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help=f"port (env INTERLOCK_HTTP_PORT; default {DEFAULT_HTTP_PORT}; 0: any free port)",
    )
    p.add_argument(
        "--host",
        default="0.0.0.0",  # noqa: S104 - a gateway is reached from outside
        help="address to listen on (default 0.0.0.0)",
    )
    p.add_argument(
        "--open",
        action="store_true",
        help="ask no credentials (development; only with --host 127.0.0.1 or ::1)",
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest request body taken (default 16777216: an event's data over the object "
        "threshold is stored by reference)",
    )
    add_object_flags(p)
    p.add_argument("--no-console", action="store_true", help="do not serve the web console at /ui/")
    p.add_argument(
        "--trace-url",
        default=None,
        metavar="TEMPLATE",
        help="the console's link to a run's trace, with {trace_id} and {run_id} "
        "(env INTERLOCK_TRACE_URL)",
    )
    add_log_level(p)
    add_connection_flags(p)
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("tokens", help="bearer tokens of the HTTP gateway's callers")
    tsub = p.add_subparsers(dest="tokens_command", metavar="COMMAND")
    tsub.required = True
    q = tsub.add_parser("create", help="issue a token (printed once; stored hashed)")
    q.add_argument("name", help="who holds it (letters, digits, '_', '.', '-')")
    q.add_argument("--role", required=True, choices=["operator", "publisher", "reader"])
    q.add_argument(
        "--events",
        action="append",
        default=[],
        metavar="PATTERN",
        help="publisher: event types it may post (NATS wildcards: com.github.*, com.acme.>)",
    )
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_tokens_create))
    q = tsub.add_parser("list", help="tokens by name and role (never the tokens)")
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_tokens_list))
    q = tsub.add_parser("revoke", help="revoke the token of NAME (takes effect within 5 s)")
    q.add_argument("name")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_tokens_revoke))


def _shared_account_gateway(creds_file: str | None) -> bool:
    """Whether ``creds_file`` is a gateway credential Interlock issued in the orchestrator's
    account (no ``js-api:`` tag: its account is not one of its own)."""
    if creds_file is None:
        return False
    from interlock.auth.jwt import creds_tags

    try:
        tags = creds_tags(creds_file)
    except (OSError, ValueError, KeyError):
        return False
    return "role:gateway" in tags and not any(t.startswith("js-api:") for t in tags)


def cmd_gateway(args: argparse.Namespace) -> int:
    from interlock.console import ConsoleConfig
    from interlock.gateway.app import serve_gateway
    from interlock.gateway.service import DEFAULT_MAX_BODY
    from interlock.transport.httpserver import is_loopback

    setup_logging(args.log_level)
    port = env_int(args.http_port, "INTERLOCK_HTTP_PORT", DEFAULT_HTTP_PORT)
    if args.open and not is_loopback(args.host):
        raise CliError(
            f"--open asks no credentials, so it listens on loopback only; add --host 127.0.0.1 "
            f"(not {args.host})"
        )
    opts = options(args)
    opts = opts.named("interlock-gateway")
    if _shared_account_gateway(opts.creds_file):
        sys.stderr.write(
            f"interlock gateway: warning: {opts.creds_file} is a gateway credential of the "
            "orchestrator's account (issued before gateways had accounts of their own): a "
            "reply subject it names can still reach that account's streams and buckets; "
            "replace it (`interlock creds upgrade`, then `interlock creds revoke` the old "
            "one)\n"
        )
    console = None
    if not args.no_console:
        console = ConsoleConfig.from_environment()
        if args.trace_url:
            console = ConsoleConfig(trace_url=args.trace_url)
    limits = object_limits(args)

    async def go() -> None:
        nc = await connect(opts)
        stop = asyncio.Event()
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        try:
            with stop_on_signals(stop.set):
                task = asyncio.create_task(
                    serve_gateway(
                        nc,
                        opts.subjects,
                        host=args.host,
                        port=port,
                        open_mode=args.open,
                        max_body=args.max_body or DEFAULT_MAX_BODY,
                        objects=limits,
                        console=console,
                        stop=stop,
                        started=started,
                    )
                )
                done, _ = await asyncio.wait(
                    [task, started],  # type: ignore[type-var]
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if started in done:
                    print(f"HTTP gateway at {started.result()}", flush=True)
                await task
        finally:
            await nc.close()

    try:
        asyncio.run(go())
    except ConnectionFailed as exc:
        raise connect_failure(exc, args) from exc
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{port}: {exc.strerror or exc}") from exc
    return EXIT_OK


async def cmd_tokens_create(client: Any, args: argparse.Namespace) -> int:
    from interlock.gateway.auth import Tokens

    await client.provision()  # a write: the tokens bucket may not be there yet
    tokens = Tokens(client.ops.js, client.subjects)
    try:
        token = await tokens.issue(args.name, args.role, args.events)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"name": args.name, "role": args.role, "events": args.events, "token": token})
    else:
        print(token)
    return EXIT_OK


async def cmd_tokens_list(client: Any, args: argparse.Namespace) -> int:
    from nats.js.errors import NotFoundError

    from interlock.gateway.auth import Tokens

    try:  # a read: nothing is created, and no bucket yet means no token yet
        found = await Tokens(client.ops.js, client.subjects).list()
    except NotFoundError:
        found = []
    items = [{k: v for k, v in item.items() if k != "key"} for item in found]
    if args.json:
        print_json(items)
        return EXIT_OK
    if not items:
        print("no tokens (interlock tokens create NAME --role ROLE)")
        return EXIT_OK
    print_table(
        ["NAME", "ROLE", "CREATED", "EVENTS"],
        [
            (i["name"], i["role"], _when(i.get("created")), " ".join(i.get("events") or []))
            for i in items
        ],
    )
    return EXIT_OK


def _when(created: object) -> str:
    """A token's creation time (seconds since the epoch) as UTC RFC 3339, ``-`` if none."""
    if not isinstance(created, int | float):
        return "-"
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def cmd_tokens_revoke(client: Any, args: argparse.Namespace) -> int:
    from interlock.gateway.auth import Tokens

    await client.provision()  # a write, like create
    gone = await Tokens(client.ops.js, client.subjects).revoke(args.name)
    if not gone:
        raise CliError(f"no token named {args.name!r}", EXIT_FAILED)
    print(f"revoked {args.name}")
    return EXIT_OK
