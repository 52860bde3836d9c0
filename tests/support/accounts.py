"""A nats-server with Interlock's decentralized auth, for the tests of the HTTP gateway and
the console: the gateway of each stack runs on a credential of an account of its own for
the stack's prefix, as ``interlock creds issue gateway`` makes it; everything else (the
orchestrator, the test worker, the tests' own reads and the CLI) on one user of the
orchestrator's account that may do anything.

``connect``, ``cli_env`` (support.runtime) and the ``nc`` fixture look the server's URL up
here and use that user's credential; a URL not served here needs none. A test module (or a
conftest.py) imports the fixtures ``secured_nats_url`` and ``pooled_subjects`` to have its
``nats_url`` and ``subjects`` from here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

from interlock.auth import jwt
from interlock.auth.keys import Issued, KeyStore
from interlock.auth.push import push_account
from interlock.auth.roles import Role
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions
from interlock.transport.subjects import Subjects

__all__ = [
    "admin_creds",
    "gateway_creds",
    "issued_creds",
    "kick",
    "pooled_subjects",
    "prefix_for",
    "secured_nats",
    "secured_nats_url",
]


@dataclass
class _Installation:
    keys: KeyStore
    admin: Path
    data: Path
    prefixes: list[str] = field(default_factory=list)
    """Prefixes the orchestrator's account exports already, not handed out yet."""


_CHUNK = 16
"""Prefixes added to the orchestrator's exports at once: each re-signing waits for the
next second (a server keeps the newer of two account JWTs by their issue time)."""


_SERVED: dict[str, _Installation] = {}
"""host:port of each server started here: its keys and its unrestricted user."""


def _where(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.hostname}:{parsed.port}"


def admin_creds(url: str) -> str | None:
    """The creds file of the unrestricted user of the server at ``url`` (None: a server
    without authentication)."""
    found = _SERVED.get(_where(url))
    return str(found.admin) if found is not None else None


def prefix_for(url: str) -> str:
    """A subject prefix of its own for a test on the server at ``url``: on a server started
    here, one the orchestrator's account exports already (recorded a chunk at a time), so
    that issuing its gateway's credential does not re-sign that account."""
    found = _SERVED.get(_where(url))
    if found is None:
        return f"t{uuid.uuid4().hex[:12]}"
    if not found.prefixes:
        found.prefixes = [f"t{uuid.uuid4().hex[:12]}" for _ in range(_CHUNK)]
        for prefix in found.prefixes:
            # Recorded as a credential for that prefix would be: the exports follow.
            key = jwt.new_key("user").public_key
            found.keys._record(Issued(f"exports-{prefix}", "gateway", key, 0, prefix=prefix))
        found.keys._sign_account()
    return found.prefixes.pop()


async def kick(url: str, client_id: int, server_id: str) -> None:
    """Have the server at ``url`` close the connection ``client_id`` (its client then
    reconnects), as a system-account user (``$SYS.REQ.SERVER.<id>.KICK``)."""
    import json

    import nats

    found = _SERVED[_where(url)]
    system = jwt.read_key((found.keys.dir / "system.nk").read_text())
    user = jwt.new_key("user")
    claims = {"type": "user", "subs": -1, "data": -1, "payload": -1}
    path = found.data / "kicker.creds"
    jwt.write_creds(path, jwt.encode(system, user.public_key, "kicker", claims), user.seed)
    nc = await nats.connect(url, user_credentials=str(path), connect_timeout=5)
    try:
        body = json.dumps({"cid": client_id}).encode()
        reply = await nc.request(f"$SYS.REQ.SERVER.{server_id}.KICK", body, timeout=5)
        assert b'"error"' not in reply.data, reply.data
    finally:
        await nc.close()


async def gateway_creds(url: str, subjects: Subjects) -> Path | None:
    """A gateway credential for ``subjects``' prefix, its account pushed to the server at
    ``url`` as ``interlock creds issue`` does (None: a server without authentication)."""
    return await issued_creds(url, subjects, "gateway")


async def issued_creds(url: str, subjects: Subjects, role: str) -> Path | None:
    """A credential of ``role`` for ``subjects``' prefix, its account pushed to the server
    at ``url`` as ``interlock creds issue`` does (None: a server without authentication)."""
    found = _SERVED.get(_where(url))
    if found is None:
        return None
    name = f"{role}-{subjects.prefix}"
    text, record = found.keys.issue(Role(role), subjects, name=name)
    await push_account(ConnectOptions.resolve(url), found.keys, found.keys.account_jwts([record]))
    path = found.data / f"{name}.creds"
    jwt.write_secret(path, text)
    return path


@contextlib.contextmanager
def secured_nats(data: Path) -> Iterator[str]:
    """A nats-server trusting keys made in ``data``, and its URL."""
    keys = KeyStore(data / "keys").ensure()
    account = keys.account_key()
    user = jwt.new_key("user")
    # No pub/sub lists: a user of the orchestrator's account allowed everything.
    claims = {"type": "user", "subs": -1, "data": -1, "payload": -1}
    token = jwt.encode(account, user.public_key, "tests", claims)
    admin = data / "tests.creds"
    jwt.write_creds(admin, token, user.seed)
    resolver = data / "jwt"
    resolver.mkdir()
    config = data / "auth.conf"
    jwt.write_secret(config, keys.server_config(resolver.resolve()))
    server = EmbeddedNats(data, args=["-c", str(config)])
    server.start()
    where = _where(server.url)
    _SERVED[where] = _Installation(keys, admin, data)
    try:
        yield server.url
    finally:
        _SERVED.pop(where, None)
        server.stop()


@pytest.fixture(scope="session", name="nats_url")
def secured_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``nats_url``: a nats-server with authentication, each test's gateway on its own
    account's credential, the rest on one unrestricted user of the orchestrator's account."""
    with secured_nats(tmp_path_factory.mktemp("secured-nats")) as url:
        yield url


@pytest.fixture(name="subjects")
def pooled_subjects(nats_url: str) -> Subjects:
    """``subjects``: names under a prefix unique to this test (one the server's accounts
    know already, see :func:`prefix_for`)."""
    return Subjects(prefix=prefix_for(nats_url))
