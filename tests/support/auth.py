"""A real nats-server with Interlock's decentralized auth, the orchestrator and the reference
agents on their own credentials, and helpers to attack it with plain nats-py clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js.api import PubAck

from interlock.auth import jwt
from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_user
from interlock.auth.keys import _JETSTREAM, _UNLIMITED, ACCOUNT_NAME, Issued, KeyStore
from interlock.auth.push import push_account
from interlock.auth.roles import JS_API, Role, inbox_prefix, permissions_for
from interlock.cli.dev import secure, start_stack, stop_stack
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects

SUBJECTS = Subjects("il")

# ``held`` is served by nobody: its actions stay awaited, a target for forged answers.
MANIFESTS = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: held
    spec:
      capabilities:
        - name: held
          input_schema: {type: object}
          output_schema: {type: object}
          timeout_seconds: 3600
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: guarded
    spec:
      triggers:
        - event: acme.order.placed
      initial_state: work
      states:
        work:
          actions:
            - capability: held
              input: {}
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
          outputs:
            forged: "{{ true }}"
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: awaiting
    spec:
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - event: acme.order.approved
              goto: done
        done:
          type: terminal
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: echoing
    spec:
      triggers:
        - event: acme.echo.requested
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input:
                said: hello
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
          outputs:
            said: "$.states.work.output.said"
    """
)


@dataclass
class Secured:
    server: EmbeddedNats
    auth: DevAuth
    data: Path
    operator: InterlockClient
    issued: dict[str, Path] = field(default_factory=dict)
    orchestrator: Any = None
    """The orchestrator of the stack (to read what it counted)."""

    @property
    def url(self) -> str:
        return self.server.url

    def issue(self, role: Role, name: str) -> Path:
        """Creds for ``role``, issued while everything runs (no restart): its account
        pushed to the server, as ``interlock creds issue`` does (from a thread of its own,
        so tests call it from the event loop the stack runs on)."""
        text, record = self.auth.keys.issue(role, SUBJECTS, name=name)
        push = push_account(
            ConnectOptions.resolve(self.url), self.auth.keys, self.auth.keys.account_jwts([record])
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, push).result(30)
        path = self.data / f"{name}.creds"
        path.write_text(text)
        self.issued[name] = path
        return path


@pytest.fixture(scope="module")
def secured_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedNats, DevAuth, Path]]:
    data = tmp_path_factory.mktemp("secured")
    auth = secure(data)
    server = EmbeddedNats(data, args=auth.server_args)
    server.start()
    try:
        yield server, auth, data
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(
    secured_server: tuple[EmbeddedNats, DevAuth, Path],
) -> AsyncIterator[Secured]:
    server, auth, data = secured_server
    stack = await start_stack(server.url, auth=auth)
    nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
    client = InterlockClient(nc, SUBJECTS)
    applied = await client.apply([("<security>", MANIFESTS)])
    applied.compiled.raise_for_errors()
    try:
        yield Secured(server=server, auth=auth, data=data, operator=client, orchestrator=stack[0])
    finally:
        await nc.close()
        await stop_stack(*stack)


class Refusals:
    """The errors the server sent one client (permission violations, auth errors)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._new = asyncio.Event()

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc))
        self._new.set()

    async def wait_for(self, *words: str, within: float = 30.0) -> str:
        """The first error mentioning every one of ``words`` (case-insensitive); fails
        the test when none arrives ``within`` seconds."""
        wanted = [w.lower() for w in words]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            for error in self.errors:
                if all(w in error.lower() for w in wanted):
                    return error
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no error mentioning {words}; got {self.errors}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), remaining)


async def plain_client(url: str, creds: Path, refusals: Refusals) -> Client:
    """A plain nats-py client (what an attacker would write) on ``creds``."""
    return await nats.connect(
        url,
        user_credentials=str(creds),
        inbox_prefix=inbox_prefix(creds_user(creds)),
        error_cb=refusals.on_error,
        allow_reconnect=False,
        connect_timeout=5,
    )


async def publisher(secured: Secured, events: str, name: str) -> tuple[Client, Refusals]:
    """A publisher of ``events`` (a subject pattern), its credential issued as ``name`` as
    ``interlock creds issue publisher`` makes it, on a plain nats-py client, and the errors
    the server sends that client."""
    creds = secured.issue(Role("publisher", events=(events,)), name)
    refusals = Refusals()
    return await plain_client(secured.url, creds, refusals), refusals


async def publish_event(
    nc: Client,
    event_id: str,
    event_type: str,
    data: Any,
    *,
    source: str = "https://publisher.example",
    headers: dict[str, str] | None = None,
) -> PubAck:
    """``data`` as a CloudEvent of ``event_type`` in binary mode (JSON, from ``source``),
    published into the events stream as a publisher's own client would, with ``headers``
    besides; the stream's acknowledgement."""
    sent = {
        "ce-specversion": "1.0",
        "ce-id": event_id,
        "ce-source": source,
        "ce-type": event_type,
        "content-type": "application/json",
        **(headers or {}),
    }
    body = json.dumps(data).encode()
    return await nc.jetstream().publish(f"il.events.{event_type}", body, headers=sent)


def shared_account_user(keys: KeyStore, role: Role, name: str, path: Path) -> str:
    """Write at ``path`` a creds file for ``role`` whose user is of the orchestrator's
    account, as every credential was before parties had accounts of their own: the role's
    permissions with the JetStream API under ``$JS.API``. Returns the user JWT."""
    account = jwt.read_key((keys.dir / "account.nk").read_text())
    api = SUBJECTS.party_js_api

    def old(items: tuple[str, ...]) -> list[str]:
        return [s.replace(api, JS_API) for s in items]

    user = jwt.new_key("user")
    perms = permissions_for(role, SUBJECTS, user.public_key)
    extra: list[str] = []
    if role.name == "gateway":
        # Its watch of the run index was an ordered consumer of that account.
        runs = f"KV_{SUBJECTS.runs_bucket}"
        extra = [
            f"{JS_API}.INFO",
            f"{JS_API}.CONSUMER.CREATE.{runs}",
            f"{JS_API}.CONSUMER.CREATE.{runs}.>",
            f"{JS_API}.CONSUMER.INFO.{runs}.*",
            "$JS.FC.>",
        ]
    claims: dict[str, Any] = {
        "type": "user",
        "pub": {
            "allow": [*old(perms.pub_allow), *extra],
            **({"deny": old(perms.pub_deny)} if perms.pub_deny else {}),
        },
        "sub": {"allow": old(perms.sub_allow)},
        "subs": -1,
        "data": -1,
        "payload": -1,
        "tags": [f"role:{role.name}", *(f"capability:{c}" for c in role.capabilities)],
    }
    if perms.responses:
        claims["resp"] = {"max": 1, "ttl": 0}
    token = jwt.encode(account, user.public_key, name, claims)
    jwt.write_creds(path, token, user.seed)
    return token


def old_layout(keys: KeyStore, roles: dict[str, Role], creds_dir: Path) -> dict[str, Path]:
    """Make ``keys`` what an installation of one shared account was: the orchestrator's
    account JWT without exports, and a creds file per ``roles`` entry (agents, publishers
    and gateways included) whose user is signed by that account's key, with the
    permissions those credentials had (:func:`shared_account_user`). Recorded in
    issued.json as they were (no account of their own)."""
    account = jwt.read_key((keys.dir / "account.nk").read_text())
    out: dict[str, Path] = {}
    for file_name, role in roles.items():
        path = creds_dir / f"{file_name}.creds"
        token = shared_account_user(keys, role, file_name, path)
        out[file_name] = path
        keys._record(
            Issued(
                name=file_name,
                role=role.name,
                public_key=str(jwt.decode_claims(token)["sub"]),
                issued_at=int(jwt.decode_claims(token)["iat"]),
                capabilities=role.capabilities,
                events=role.events,
            )
        )
    # The account JWT as it was: JetStream and revocations, no exports.
    nats_claims = {
        "type": "account",
        "limits": {**_UNLIMITED, **_JETSTREAM},
        "default_permissions": {"pub": {}, "sub": {}},
    }
    keys._write_signed(keys.dir / "account.jwt", account.public_key, nats_claims, ACCOUNT_NAME)
    return out
