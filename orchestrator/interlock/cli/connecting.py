"""Connecting a command to NATS, and what the commands that run processes share: the
connection flags (each with its ``INTERLOCK_*`` variable), a connected client for one
command, logging and signal handling."""

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
from typing import TYPE_CHECKING, Any, TypeVar

from interlock.cli.common import EXIT_DENIED, EXIT_FAILED, EXIT_USAGE, CliError
from interlock.cli.output import dump
from interlock.core.ids import InvalidRunId, check_run_id
from interlock.core.vocabulary import InterlockError

if TYPE_CHECKING:
    from interlock.transport.connection import ConnectOptions

_Default = TypeVar("_Default", int, None)

NO_JETSTREAM = 10039
"""JetStream's error code for an account that has no JetStream."""


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
    server = args.server
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
        from interlock.auth.dev import operator_defaults

        # In the folder `interlock dev` runs in: its server, on whatever port it took; from
        # any other, what the last `interlock dev` recorded, unless another server is named.
        creds_file, server = operator_defaults(server)
    from interlock.transport.connection import ConnectOptions

    return ConnectOptions.resolve(
        server,
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
    problems exit 2 with the reason, a missing run exits 4, a missing workflow or agent 1, a
    permission the credential lacks exits 5 naming it (at the server's refusal, not after
    the request it refused times out)."""

    def run(args: argparse.Namespace) -> int:
        from nats.errors import MaxPayloadError
        from nats.js.errors import ServiceUnavailableError

        from interlock.client import Client
        from interlock.transport.connection import connect
        from interlock.transport.errors import ConnectionFailed
        from interlock.transport.refusals import parse_refusal, refusable

        async def on_error(exc: Exception) -> None:
            # A refusal ends the command that caused it, with its own message.
            if parse_refusal(str(exc)) is None:
                logging.getLogger("interlock.nats").warning("NATS error: %s", exc)

        async def go() -> int:
            opts = options(args).named("interlock-cli")
            try:
                nc = await connect(opts, error_cb=on_error)
            except ConnectionFailed as exc:
                raise CliError(f"{exc}{_credential_hint(str(exc), opts.creds_file)}") from exc
            client = Client(nc, opts.subjects, owns_connection=True)
            try:
                return await refusable(nc, body(client, args))
            finally:
                with contextlib.suppress(Exception):
                    await client.close()

        try:
            return asyncio.run(go())
        except InterlockError as exc:
            # Only on an error: the table names the fork's errors, which load the engine.
            from interlock.client.error_table import meaning

            found = meaning(exc)
            if found is None or found.exit_code is None:
                raise
            raise CliError(found.detail(exc) + _role_hint(exc, args), found.exit_code) from exc
        except ServiceUnavailableError as exc:
            if exc.err_code != NO_JETSTREAM:
                raise
            # A credential of an account without JetStream (a publisher's, say).
            raise CliError(
                "permission denied: this credential may not use JetStream here (its account "
                f"has none: {exc.description})",
                EXIT_DENIED,
            ) from exc
        except MaxPayloadError as exc:
            raise CliError(
                f"a message is larger than the server accepts ({exc or 'max_payload'})",
                EXIT_FAILED,
            ) from exc

    return run


_ROLE_USE = {
    "publisher": "it publishes its event types and reads nothing",
    "agent": "it serves its capabilities and reads nothing else",
    "gateway": "it is for the HTTP gateway, interlock gateway",
}
"""What a credential of a role other than the operator's is for, said when it is refused."""


def _role_hint(exc: Exception, args: argparse.Namespace) -> str:
    """After a refusal: whose credential this is, when its role explains it."""
    from interlock.transport.refusals import PermissionRefused

    creds = getattr(args, "creds_file", None) or os.environ.get("INTERLOCK_CREDS")
    if not isinstance(exc, PermissionRefused) or not creds:
        return ""
    from interlock.auth.jwt import creds_tags

    try:
        roles = [t.removeprefix("role:") for t in creds_tags(creds) if t.startswith("role:")]
    except (OSError, ValueError):
        return ""
    use = _ROLE_USE.get(roles[0]) if roles else None
    article = "an" if roles[0][0] in "aeiou" else "a"
    return f" ({creds} is {article} {roles[0]}'s credential: {use})" if use else ""


def connect_failure(exc: Exception, args: argparse.Namespace) -> CliError:
    """A long-running process's (serve, agent run, gateway) failed connection, with what
    every command adds: the last ``interlock dev``'s server, why a creds file is refused."""
    creds = getattr(args, "creds_file", None) or os.environ.get("INTERLOCK_CREDS")
    return CliError(f"{exc}{_credential_hint(str(exc), creds)}")


def _credential_hint(failure: str, creds: str | None = None) -> str:
    """What to set when the server refused to connect without (the right) credentials, or
    when none answered where the last ``interlock dev`` does not serve; for a creds file
    it refused, why a server refuses one."""
    from interlock.auth.dev import context_file, recorded_context

    if creds is not None and "refused the credentials" in failure:
        return (
            f"\n  {creds} was refused: it is revoked (interlock creds list says REVOKED), its "
            "account has not reached this server (interlock creds push), or it was issued "
            "from keys this server does not trust"
        )
    if "refused the credentials" not in failure:
        context = recorded_context()
        if context is None or "cannot connect" not in failure or context.url in failure:
            return ""
        return (
            f"\n  the last `interlock dev` serves {context.url}: --server {context.url} "
            f"or export INTERLOCK_URL={context.url}"
        )
    hint = (
        "\n  this server wants a credential: --creds FILE or export INTERLOCK_CREDS=FILE "
        "(`interlock dev` writes DATA_DIR/creds/operator.creds, and records its server "
        f"and that file in {context_file()} for the CLI run from any folder)"
    )
    context = recorded_context()
    if context is not None and context.creds:
        hint += (
            f"\n  the last `interlock dev` serves {context.url} (data in {context.data_dir}): "
            f"export INTERLOCK_URL={context.url} INTERLOCK_CREDS={context.creds}"
        )
    return hint


def run_id_arg(value: str) -> str:
    """A RUN_ID argument: refused before anything connects when it is no run id."""
    try:
        return check_run_id(value)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def waiting_arg(value: str) -> str:
    """A --waiting KIND[:NAME]: refused before anything connects when KIND is no kind a
    run waits for (a typo listed no runs, as if none waited)."""
    from interlock.views.shapes import WAITING_KINDS

    kind, _, name = value.partition(":")
    if kind not in WAITING_KINDS or (":" in value and not name.strip()):
        raise argparse.ArgumentTypeError(
            f"{value!r}: give KIND or KIND:NAME, KIND one of {', '.join(WAITING_KINDS)}"
        )
    return value


def deadline_arg(value: str) -> float:
    """A --deadline: seconds (``120``) or a duration (``90s``, ``2m``, ``1h30m``), 0 and up."""
    from interlock.core.deadline import check_deadline
    from interlock.core.lowering_scope import parse_duration

    text = value.strip()
    try:
        seconds = float(text) if text and text[-1].isdigit() else parse_duration(text)
    except ValueError:
        seconds = None
    if seconds is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a deadline: seconds (120) or a duration (90s, 2m, 1h30m)"
        )
    try:
        return check_deadline(seconds)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def print_json(value: Any) -> None:
    sys.stdout.write(dump(value, "json"))


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(p: argparse.ArgumentParser) -> None:
    """``--log-level`` of a process (a level it does not know is a usage error, not info)."""
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def env_int(value: int | None, var: str, default: _Default) -> int | _Default:
    """A flag's value, else the environment variable ``var`` (unset or blank: not given),
    else ``default`` (``None``: neither was given, for the caller to decide)."""
    if value is not None:
        return value
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise CliError(f"{var} must be a whole number, got {raw!r}", EXIT_USAGE) from None
