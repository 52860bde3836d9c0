"""A real stack (nats-server, orchestrator, test worker) with the HTTP gateway served by
uvicorn on a real socket, and callers holding a token of each role."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import httpx

from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.cluster_metrics import ClusterMetrics
from interlock.transport.connection import ConnectOptions
from interlock.transport.connection import connect as connect_with
from interlock.transport.httpserver import HttpServer
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects
from support.accounts import gateway_creds
from support.runtime import HELLO, PARKED, TIMEOUT, Stack, connect, running_stack, yaml

__all__ = [
    "HELLO",
    "HOOK",
    "IDLE_AGENT",
    "PARKED",
    "REVIEW",
    "REVIEW_V2",
    "TIMEOUT",
    "UNSERVED",
    "WAITING",
    "GatewayStack",
    "concurrency_gauges",
    "gateway_stack",
    "wait_status",
    "yaml",
]

WAITING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: waiting
    spec:
      initial_state: wait
      states:
        wait:
          type: human_in_the_loop
          on:
            - {event: go, goto: done}
        done:
          type: terminal
    """
)
"""A run that waits in ``wait`` until a ``go`` signal ends it."""

REVIEW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: review
    spec:
      description: A score above 7 merges at once; anything else waits for a person.
      inputs:
        score: {type: integer, required: true}
      initial_state: scoring
      states:
        scoring:
          actions:
            - capability: echo
              input: {score: "{{ inputs.score }}"}
          on:
            - {event: task.completed, guard: "result.score > 7", goto: merged}
            - {event: task.completed, goto: approval}
        approval:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: merged}
            - {event: approval.denied, goto: rejected}
        merged:
          type: terminal
          outputs: {merged: true}
        rejected:
          type: terminal
          outputs: {merged: false}
    """
)
"""A score over 7 merges at once; any other waits in ``approval`` for a person."""
REVIEW_V2 = REVIEW.replace("result.score > 7", "result.score >= 7")
"""Version 2 of ``review``: only the guard differs (a score of 7 now merges)."""
IDLE_AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: idle
    spec:
      capabilities:
        - name: nobody
    """
)
"""An AgentDef whose capability no worker serves."""
UNSERVED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: unserved
    spec:
      initial_state: ask
      states:
        ask:
          actions:
            - capability: nobody
          timeout: {after: 1h, goto: gave-up}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
        gave-up:
          type: terminal
    """
)
"""A run that waits for ``nobody`` (no worker serves it), for an hour at most."""
HOOK = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: hook
    spec:
      initial_state: deploying
      states:
        deploying:
          on:
            - {event: deploy.finished, goto: done}
        done:
          type: terminal
    """
)
"""A run that waits for the event ``deploy.finished``."""
BROKEN = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: broken
    spec:
      initial_state: ask
      states:
        ask:
          actions:
            - capability: liar
              input: {}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)
"""Asks ``liar``, whose answer breaks its declared output schema: one failed attempt."""


@dataclass
class GatewayStack:
    stack: Stack
    gateway: Gateway
    url: str
    tokens: dict[str, str] = field(default_factory=dict)

    def http(self, role: str | None = "operator") -> httpx.AsyncClient:
        """A client holding the token of ``role`` (None: no credentials)."""
        headers = {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=TIMEOUT)

    async def stored_events(self) -> int:
        info = await self.stack.js.stream_info(self.stack.subjects.events_stream)
        return int(info.state.messages)


@contextlib.asynccontextmanager
async def gateway_stack(
    url: str,
    subjects: Subjects,
    manifests: Iterable[str] = (),
    *,
    max_body: int = 64 * 1024,
) -> AsyncIterator[GatewayStack]:
    async with running_stack(url, subjects, manifests) as stack:
        # On a server with authentication (support.accounts), the gateway's own credential
        # for this prefix, in an account of its own, as `interlock creds issue` makes it.
        creds = await gateway_creds(url, subjects)
        if creds is None:
            nc = await connect(url)
        else:
            opts = ConnectOptions.resolve(url, creds_file=str(creds), name="interlock-gateway")
            nc = await connect_with(opts)
            # Its client takes the JetStream API prefix from the credential's js-api: tag.
            assert js_api(nc) == subjects.party_js_api, js_api(nc)
        gateway = Gateway(nc, subjects, max_body=max_body)
        await gateway.start()
        server = HttpServer(build_app(gateway), 0)
        await server.start()
        try:
            gs = GatewayStack(stack, gateway, server.url)
            # The operator issues tokens (the gateway only reads them).
            tokens = Tokens(stack.js, subjects)
            gs.tokens["operator"] = await tokens.issue("ops", "operator")
            gs.tokens["reader"] = await tokens.issue("dash", "reader")
            gs.tokens["publisher"] = await tokens.issue("ci", "publisher", ["com.example.*"])
            yield gs
        finally:
            await server.stop()
            await gateway.stop()
            await nc.close()


async def wait_status(gs: GatewayStack, run_id: str, want: str, state: str | None = None) -> None:
    """Until the run has status ``want`` (and is in ``state``, when given)."""
    async with gs.http() as http:
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while True:
            got = (await http.get(f"/runs/{run_id}")).json()
            if got["status"] == want and (state is None or got["state"] == state):
                return
            assert asyncio.get_running_loop().time() < deadline, got
            await asyncio.sleep(0.05)


def concurrency_gauges(metrics: ClusterMetrics) -> dict[tuple[str, str | None], float]:
    """The ``interlock_concurrency_*`` samples ``metrics`` collects (polled first), by family
    name and ``limit`` label."""
    return {
        (family.name, sample.labels.get("limit")): sample.value
        for family in metrics.collect()
        for sample in family.samples
        if family.name.startswith("interlock_concurrency")
    }
