"""A real nats-server with Interlock's decentralized auth, the orchestrator and the reference
agents on their own credentials, and helpers to attack it with plain nats-py clients."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client

from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_user
from interlock.auth.roles import Role, inbox_prefix
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

    @property
    def url(self) -> str:
        return self.server.url

    def issue(self, role: Role, name: str) -> Path:
        """Creds for ``role``, issued while everything runs (no restart)."""
        text, _ = self.auth.keys.issue(role, SUBJECTS, name=name)
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
        yield Secured(server=server, auth=auth, data=data, operator=client)
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

    async def wait_for(self, *words: str, within: float = 5.0) -> str:
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
