"""``interlock creds``: the installation's keys, credentials per role, and revocation."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_OK, CliError, print_json
from interlock.cli.output import print_table

if TYPE_CHECKING:
    from interlock.auth.keys import KeyStore

KEYS_ENV = "INTERLOCK_KEYS"
DEFAULT_KEYS = os.path.join(".interlock", "keys")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "creds",
        help="keys, credentials per role, revocation (NATS decentralized auth)",
        description="Issue and revoke credentials for the orchestrator, operators, agents "
        "and event publishers. Keys live in --keys (env INTERLOCK_KEYS; default "
        ".interlock/keys, where `interlock dev` makes them).",
    )
    creds_sub = p.add_subparsers(dest="creds_command", metavar="COMMAND")
    creds_sub.required = True
    _add_setup(creds_sub)
    _add_issue(creds_sub)
    _add_revocation(creds_sub)
    q = creds_sub.add_parser("list", help="credentials issued from these keys")
    q.add_argument("--json", action="store_true")
    _keys_flag(q)
    q.set_defaults(func=cmd_list)


def _keys_flag(q: argparse.ArgumentParser) -> None:
    q.add_argument("--keys", help=f"keys directory (env {KEYS_ENV}; default {DEFAULT_KEYS})")


def _add_setup(creds_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``init`` and ``server-config``."""
    q = creds_sub.add_parser("init", help="make the operator, account and system keys")
    _keys_flag(q)
    q.set_defaults(func=cmd_init)

    q = creds_sub.add_parser(
        "server-config", help="print the nats-server configuration that trusts these keys"
    )
    _keys_flag(q)
    q.add_argument(
        "--resolver-dir",
        default="/data/jwt",
        help="where the server keeps account JWTs (default /data/jwt)",
    )
    q.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    q.set_defaults(func=cmd_server_config)


def _add_issue(creds_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = creds_sub.add_parser(
        "issue",
        help="credentials for a role",
        description="Write a creds file for ROLE. An agent or a publisher gets a NATS "
        "account of its own, importing only its subjects, which is pushed to the server "
        "(--server, env INTERLOCK_URL): the credential works at once on a running "
        "installation.",
    )
    q.add_argument("role", choices=["orchestrator", "operator", "gateway", "agent", "publisher"])
    q.add_argument(
        "--capability",
        action="append",
        default=[],
        metavar="NAME",
        help="agent: a capability it serves (repeat for several)",
    )
    q.add_argument(
        "--events",
        action="append",
        default=[],
        metavar="PATTERN",
        help="publisher: event types it may publish, '*' one word, '>' the rest "
        "(repeat for several), e.g. 'acme.>'",
    )
    q.add_argument(
        "--upload-limit",
        metavar="SIZE",
        help="agent, publisher: the bytes its own object bucket holds at most (large "
        "answers and events), e.g. 4GiB (default 1GiB); a put past it is refused",
    )
    q.add_argument("--name", help="a name to list and revoke it by (default from the role)")
    q.add_argument("--prefix", help="subject prefix (env INTERLOCK_PREFIX; default il)")
    q.add_argument("-o", "--output", metavar="FILE", required=True, help="the creds file")
    q.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    _push_flags(q)
    _keys_flag(q)
    q.set_defaults(func=cmd_issue)

    q = creds_sub.add_parser(
        "upgrade",
        help="give agent and publisher credentials of the shared account accounts of their own",
        description="Credentials issued before each agent and publisher had an account of "
        "its own are users of the orchestrator's account. This re-signs the orchestrator's "
        "account with its exports, issues each such credential again (same name, role, "
        "capabilities or event types) into DIR/<name>.creds in an account of its own, and "
        "pushes the accounts. The old credentials keep working until revoked: hand each "
        "party its new file, then revoke the old ones (--revoke-old does it at once).",
    )
    q.add_argument("-o", "--output", metavar="DIR", required=True, help="where to write them")
    q.add_argument("--prefix", help="subject prefix (env INTERLOCK_PREFIX; default il)")
    q.add_argument("--revoke-old", action="store_true", help="revoke the old credentials at once")
    _push_flags(q)
    _keys_flag(q)
    q.set_defaults(func=cmd_upgrade)


def _push_flags(q: argparse.ArgumentParser) -> None:
    q.add_argument("--server", "-s", help="NATS URL(s) to push to (env INTERLOCK_URL)")
    q.add_argument(
        "--no-push",
        action="store_true",
        help="do not push the account JWTs (`interlock creds push` later; "
        "`interlock creds server-config` preloads them)",
    )


def _add_revocation(creds_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``revoke`` and ``push``."""
    q = creds_sub.add_parser(
        "revoke",
        help="revoke credentials; servers refuse and disconnect them at once",
        description="Revoke credentials (by name, user public key or creds file): the "
        "account JWT is re-signed with them revoked and pushed to the server, which "
        "disconnects their clients and refuses them from then on.",
    )
    q.add_argument("who", nargs="+", help="a name, a user public key (U...) or a creds file")
    _push_flags(q)
    _keys_flag(q)
    q.set_defaults(func=cmd_revoke)

    q = creds_sub.add_parser("push", help="push every account JWT to the server again")
    q.add_argument("--server", "-s", help="NATS URL(s) (env INTERLOCK_URL)")
    _keys_flag(q)
    q.set_defaults(func=cmd_push)


def _store(args: argparse.Namespace, *, create: bool = False) -> KeyStore:
    from interlock.auth.keys import KeyStore

    store = KeyStore(args.keys or os.environ.get(KEYS_ENV) or DEFAULT_KEYS)
    if not create and not store.exists:
        raise CliError(
            f"no keys in {store.dir}: name the folder `interlock creds init` made them in "
            f"with --keys DIR or {KEYS_ENV}=DIR, or make them here (`interlock dev` once, or "
            f"`interlock creds init --keys {store.dir}`){_dev_keys(store.dir)}"
        )
    return store


def _dev_keys(missing: Path) -> str:
    """Where the last ``interlock dev`` keeps its keys, when it is another folder: the
    other commands run from any folder use its server and credential, these need its keys."""
    from interlock.auth.dev import recorded_context
    from interlock.auth.keys import KeyStore

    context = recorded_context()
    keys = Path(context.data_dir) / "keys" if context is not None else None
    if keys is None or not KeyStore(keys).exists or keys.resolve() == missing.resolve():
        return ""
    return f"; the last `interlock dev` keeps its keys in {keys}: --keys {keys}"


def cmd_init(args: argparse.Namespace) -> int:
    store = _store(args, create=True)
    existed = store.exists
    store.ensure()
    what = "keys already in" if existed else "made operator, account and system keys in"
    print(f"{what} {store.dir}")
    print(f"account {store.account_public_key}")
    return EXIT_OK


def cmd_server_config(args: argparse.Namespace) -> int:
    from interlock.auth.jwt import write_secret

    text = _store(args).server_config(args.resolver_dir)
    if args.output:
        write_secret(args.output, text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_issue(args: argparse.Namespace) -> int:
    from interlock.auth.jwt import write_secret
    from interlock.auth.roles import Role
    from interlock.transport.subjects import DEFAULT_PREFIX, Subjects

    if args.role == "agent" and not args.capability:
        raise CliError("an agent credential needs at least one --capability")
    if args.role != "agent" and args.capability:
        raise CliError("--capability is for agent credentials")
    if args.role == "publisher" and not args.events:
        raise CliError("a publisher credential needs at least one --events pattern")
    if args.role != "publisher" and args.events:
        raise CliError("--events is for publisher credentials")
    if args.upload_limit is not None and args.role not in ("agent", "publisher"):
        raise CliError("--upload-limit is for agent and publisher credentials")
    limit = _upload_limit(args.upload_limit)
    if os.path.exists(args.output) and not args.force:
        raise CliError(f"{args.output} exists (--force replaces it)")
    store = _store(args)
    role = Role(args.role, capabilities=tuple(args.capability), events=tuple(args.events))
    prefix = args.prefix or os.environ.get("INTERLOCK_PREFIX") or DEFAULT_PREFIX
    try:
        text, record = store.issue(role, Subjects(prefix), name=args.name)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if limit is not None and record.account is not None:
        from interlock.auth.buckets import set_upload_limit

        set_upload_limit(store, record.account, limit)
    try:
        write_secret(args.output, text)
    except OSError as exc:
        raise CliError(f"{args.output}: cannot write: {exc.strerror or exc}") from exc
    where = f"account {record.account}" if record.account else "the orchestrator's account"
    print(f"{role.describe()}: {record.name} ({record.public_key}, {where}) -> {args.output}")
    try:
        return _push_or_say(args, store, store.account_jwts([record]))
    except CliError as exc:
        raise CliError(
            f"{args.output} is written, but works only once its account reaches the servers: {exc}"
        ) from exc


def _upload_limit(text: str | None) -> int | None:
    """``--upload-limit`` as bytes (None: not given), checked before anything is made."""
    if text is None:
        return None
    from interlock.transport.objects import parse_bytes

    try:
        limit = parse_bytes(text)
    except ValueError as exc:
        raise CliError(f"--upload-limit: {exc}") from exc
    if limit < 1 << 20:
        raise CliError(f"--upload-limit {text}: at least 1MiB")
    return limit


def cmd_upgrade(args: argparse.Namespace) -> int:
    from interlock.auth.jwt import write_secret
    from interlock.auth.roles import Role
    from interlock.transport.subjects import DEFAULT_PREFIX, Subjects

    store = _store(args)
    prefix = args.prefix or os.environ.get("INTERLOCK_PREFIX") or DEFAULT_PREFIX
    old = [i for i in store.issued() if i.old_layout and i.revoked_at is None]
    os.makedirs(args.output, mode=0o700, exist_ok=True)
    issued = []
    for record in old:
        role = Role(record.role, capabilities=record.capabilities, events=record.events)
        path = os.path.join(args.output, f"{record.name}.creds")
        try:
            text, new = store.issue(role, Subjects(prefix), name=record.name)
            write_secret(path, text)
        except (OSError, ValueError) as exc:
            raise CliError(f"{record.name}: {exc}") from exc
        issued.append(new)
        print(f"{role.describe()}: {new.name} ({new.public_key}, account {new.account}) -> {path}")
    tokens = store.account_jwts(issued)
    if args.revoke_old and old:
        tokens = list(dict.fromkeys([*store.revoke([i.public_key for i in old]), *tokens]))
        print(f"revoked the {len(old)} old credential(s)")
    elif old:
        keys = " ".join(i.public_key for i in old)
        print(f"the old credentials still work: once replaced, `interlock creds revoke {keys}`")
    else:
        print("no credential of the shared account to upgrade")
    return _push_or_say(args, store, tokens)


def _push_or_say(args: argparse.Namespace, store: KeyStore, tokens: list[str]) -> int:
    if args.no_push:
        print("not pushed: `interlock creds push` tells the servers")
        return EXIT_OK
    return _push(args, store, tokens)


def cmd_revoke(args: argparse.Namespace) -> int:
    store = _store(args)
    keys: list[str] = []
    for who in args.who:
        if who.startswith("U") and len(who) == 56 and not os.path.exists(who):
            keys.append(who)
            continue
        try:
            found = store.find(who)
        except (OSError, ValueError) as exc:
            raise CliError(f"{who}: {exc}") from exc
        if not found:
            raise CliError(f"{who}: no credential issued from {store.dir} has this name or key")
        live = [i for i in found if i.revoked_at is None]
        if len(live) > 1 and not os.path.isfile(who):
            # A name given twice (a rotation under the default name): revoking the old
            # credential by it would revoke the new one too.
            raise CliError(
                f"{who} names {len(live)} credentials not revoked: "
                + ", ".join(f"{i.public_key} (issued {_when(i.issued_at)})" for i in live)
                + "; name the one to revoke by its user key or creds file"
            )
        keys += [i.public_key for i in live or found]
    try:
        tokens = store.revoke(keys)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(f"revoked {len(keys)} user(s) in {store.dir}")
    return _push_or_say(args, store, tokens)


def cmd_push(args: argparse.Namespace) -> int:
    return _push(args, _store(args))


def _push(args: argparse.Namespace, store: KeyStore, tokens: list[str] | None = None) -> int:
    from interlock.auth.dev import recorded_server
    from interlock.auth.push import PushFailed, push_account
    from interlock.transport.connection import ConnectionFailed, ConnectOptions

    server = args.server or os.environ.get("INTERLOCK_URL") or recorded_server(store.dir)
    opts = ConnectOptions.resolve(server)
    try:
        message = asyncio.run(push_account(opts, store, tokens))
    except (PushFailed, ConnectionFailed) as exc:
        raise CliError(
            f"{exc} (everything is saved in {store.dir}; `interlock creds push` retries)"
        ) from exc
    print(f"pushed to {opts.display_servers()}: {message}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    issued = _store(args).issued()
    if args.json:
        print_json([i.as_json() for i in issued])
        return EXIT_OK
    if not issued:
        print("no credentials issued from these keys (interlock creds issue ROLE)")
        return EXIT_OK
    rows = []
    for i in issued:
        when = _when(i.issued_at)
        state = "REVOKED" if i.revoked_at is not None else "-"
        if i.old_layout and i.revoked_at is None:
            state = "SHARED-ACCOUNT (interlock creds upgrade)"
        scope = ", ".join(i.capabilities or i.events) or "-"
        rows.append((i.name, i.role, i.public_key, when, state, scope))
    print_table(["NAME", "ROLE", "USER", "ISSUED", "STATE", "SCOPE"], rows)
    return EXIT_OK


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
