"""Shared pieces of the observability tests: a workflow, a minimal agent, an instrumented
orchestrator, a tiny HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from interlock.runtime.client import InterlockClient
from interlock.runtime.health import OrchestratorInstrumentation
from interlock.runtime.service import Orchestrator
from interlock.transport.cloudevents import CloudEvent, decode_message, encode_binary
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from interlock.transport.tracing import make_tracer_provider

TIMEOUT = 30.0
"""Upper bound of any single wait: a hang's, as ``support.runtime.TIMEOUT``."""

AGENT = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: obsagent
    spec:
      capabilities:
        - name: echo
          input_schema: {type: object}
          output_schema: {type: object}
        - name: nobody
    """
)

REVIEW = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: review
    spec:
      inputs:
        score: {type: integer, required: true}
      triggers:
        - event: com.example.review
      initial_state: check
      states:
        check:
          actions:
            - capability: echo
              input: {score: "{{ inputs.score }}"}
          on:
            - event: task.completed
              guard: "result.score / 0 > 1"
              goto: done
            - event: task.completed
              guard: "result.score >= 5"
              goto: second
            - event: task.completed
              goto: rejected
        second:
          actions:
            - capability: echo
              input: {again: true}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            score: "$.states.check.output.score"
        rejected:
          type: terminal
    """
)
"""Two states with an action each; the first transition has a guard that errors (a guard
failure is recorded), the second one fires."""

STUCK = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: stuck
    spec:
      initial_state: wait
      states:
        wait:
          actions:
            - capability: nobody
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)
"""Waits for a capability no worker serves."""


def memory_provider(service: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider(service, processor=SimpleSpanProcessor(exporter), environ={})
    return provider, exporter


async def connect(url: str) -> Client:
    return await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)


@dataclass
class Instrumented:
    client: InterlockClient
    orchestrator: Orchestrator
    telemetry: OrchestratorInstrumentation
    registry: CollectorRegistry
    subjects: Subjects


@contextlib.asynccontextmanager
async def instrumented_stack(
    url: str,
    subjects: Subjects,
    *,
    provider: TracerProvider | None = None,
    port: int | None = None,
) -> AsyncIterator[Instrumented]:
    """Client and instrumented orchestrator (own connections, own metrics registry)."""
    client_nc, orch_nc = await connect(url), await connect(url)
    client = InterlockClient(client_nc, subjects)
    await client.ensure_provisioned()
    result = await client.apply([("<agent>", AGENT), ("<review>", REVIEW), ("<stuck>", STUCK)])
    assert result.compiled.ok, [str(d) for d in result.compiled.diagnostics]
    registry = CollectorRegistry()
    orchestrator = Orchestrator(orch_nc, subjects)
    telemetry = OrchestratorInstrumentation(
        orchestrator, port=port, registry=registry, provider=provider, poll_interval=0.2
    )
    await orchestrator.start()
    await telemetry.start()
    try:
        yield Instrumented(client, orchestrator, telemetry, registry, subjects)
    finally:
        await orchestrator.stop()
        await telemetry.stop()
        for conn in (client_nc, orch_nc):
            await conn.close()


Handler = Callable[[CloudEvent, Msg], Awaitable[None]]
_tokens: dict[tuple[str, str], str] = {}
"""(action id, attempt) -> the Interlock-Token of the request plain_agent received."""


@contextlib.asynccontextmanager
async def plain_agent(
    url: str, subjects: Subjects, capability: str, handle: Handler
) -> AsyncIterator[None]:
    """A bare JetStream reader of one capability's requests (no SDK), through the
    capability's own consumer as the contract names it: ``handle`` answers."""
    nc = await connect(url)
    js = nc.jetstream()
    await provision(js, subjects)
    sub = await js.pull_subscribe(
        subjects.capability(capability),
        durable=f"cap_{capability}",
        stream=subjects.tasks_stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
    )

    async def loop() -> None:
        while True:
            try:
                msgs = await sub.fetch(16, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                request = decode_message(msg.headers, msg.data)
                # Kept for answer(): an answer echoes its request's token.
                _tokens[request.id, request.extensions["attempt"]] = (msg.headers or {}).get(
                    "Interlock-Token", ""
                )
                await handle(request, msg)
                await msg.ack()

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def answer(
    nc: Client, subjects: Subjects, request: CloudEvent, data: Any, *, failed: bool = False
) -> None:
    """Publish a ``task.completed`` (or ``task.failed``) answer to ``request``."""
    ext = {k: request.extensions[k] for k in ("runid", "actionid", "attempt")}
    if failed:
        data = {"error": {"class": "agent_error", "message": "refused"}}
    event = CloudEvent(
        id=f"{request.id}.answer",
        source="test://agent",
        type="task.failed" if failed else "task.completed",
        subject=request.subject,
        datacontenttype="application/json",
        data=data,
        extensions=ext,
    )
    headers, payload = encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    headers["Interlock-Token"] = _tokens.get((request.id, ext["attempt"]), "")
    capability = request.extensions["capability"]
    subject = subjects.result(capability, ext["runid"])
    await nc.jetstream().publish(subject, payload, headers=headers)


async def eventually(probe: Callable[[], Any], what: str, within: float = TIMEOUT) -> Any:
    """Await ``probe()`` (sync) until truthy, bounded: for effects that follow an append."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not (value := probe()):
        if loop.time() > deadline:
            raise AssertionError(f"not reached after {within}s: {what}")
        await asyncio.sleep(0.01)
    return value


async def http_get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on localhost: (status, body)."""
    return await http_request(port, "GET", path)


async def http_request(port: int, method: str, path: str) -> tuple[int, str]:
    """``method path`` on localhost, without a body: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), TIMEOUT)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, body.decode()
