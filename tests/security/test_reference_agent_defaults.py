"""The reference agents with their defaults, steered by a publisher: a workflow passes an
event's data to ``command.run`` and ``http.fetch`` (as workflows do), and the publisher of
that event chooses the arguments and the URL. Whatever the agents return lands in run
outputs, which every reader sees; with their defaults they read none of the agent's files
and reach none of its machine's or network's private services. Real nats-server, the real
reference workers, the run's whole log searched for what must not leak."""

from __future__ import annotations

import asyncio
import http.server
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import interlock_agents
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from interlock_agents import command, http_fetch
from support.runtime import TIMEOUT, Stack, connect, eventually, running_stack, yaml

pytestmark = pytest.mark.asyncio

SEED = "SAAJ-THE-ACCOUNT-SIGNING-SEED-MARKER"
INTERNAL = "internal service: admin console marker"

STEERED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: build
    spec:
      triggers:
        - event: com.acme.build
          input: {argv: "{{ data.argv }}"}
      inputs:
        argv: {type: "list[string]", required: true}
      initial_state: run
      states:
        run:
          actions:
            - capability: command.run
              input: {command: "{{ inputs.argv }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs: {out: "$.states.run.output"}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: hook
    spec:
      triggers:
        - event: com.acme.hook
          input: {url: "{{ data.url }}"}
      inputs:
        url: {type: string, required: true}
      initial_state: fetch
      states:
        fetch:
          actions:
            - capability: http.fetch
              input: {url: "{{ inputs.url }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs: {page: "$.states.fetch.output"}
    """
)


class _Internal(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = INTERNAL.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def internal_service() -> Iterator[int]:
    """A service on 127.0.0.1, as an admin console or a metadata endpoint would be."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Internal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name in (command.ALLOW_ENV, http_fetch.ALLOW_HOSTS_ENV, http_fetch.ALLOW_PRIVATE_ENV):
        monkeypatch.delenv(name, raising=False)  # the defaults, as `interlock dev` runs them
    agents = [interlock_agents.manifest_text(n) for n in ("command", "http-fetch")]
    async with running_stack(nats_url, subjects, [*agents, STEERED], worker=False) as s:
        nc = await connect(nats_url)
        workers = (command.worker, http_fetch.worker)
        tasks = [asyncio.create_task(w.run(nc, prefix=subjects.prefix)) for w in workers]
        for w in workers:
            await asyncio.wait_for(w.wait_ready(), TIMEOUT)
        try:
            yield s
        finally:
            for w, t in zip(workers, tasks, strict=True):
                await w.stop(force=True)
                await t
            await nc.close()


async def _run_of(stack: Stack, event_type: str, data: dict[str, Any]) -> tuple[Any, bytes]:
    """Publish as the publisher would; the run it starts, ended, and its whole log."""
    before = {r["run_id"] for r in await stack.client.list_runs()}
    await stack.client.emit(
        CloudEvent(id=uuid.uuid4().hex, source="https://ci.acme", type=event_type, data=data)
    )

    async def started() -> list[str]:
        return [r["run_id"] for r in await stack.client.list_runs() if r["run_id"] not in before]

    [run_id] = await eventually(started, within=TIMEOUT, what=f"a run of {event_type}")
    state = await stack.wait(run_id)
    records = await stack.records(run_id)
    return state, b"".join(msgspec.json.encode(r) for r in records)


async def test_a_publisher_cannot_make_the_command_agent_read_its_files(
    stack: Stack, tmp_path: Path
) -> None:
    creds = tmp_path / "operator.creds"
    creds.write_text(f"-----BEGIN USER NKEY SEED-----\n{SEED}\n------END USER NKEY SEED------\n")
    state, log = await _run_of(stack, "com.acme.build", {"argv": ["date", "-f", str(creds)]})
    assert SEED.encode() not in log
    assert state.status == "failed"
    assert b"'date' is not an allowed command" in log
    # What the default allows still runs.
    state, _ = await _run_of(stack, "com.acme.build", {"argv": ["echo", "hi"]})
    assert state.status == "completed"
    assert state.outputs["out"]["stdout"] == "hi\n"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
async def test_a_publisher_cannot_make_http_fetch_reach_a_loopback_service(
    stack: Stack, internal_service: int, host: str
) -> None:
    url = f"http://{host}:{internal_service}/admin"
    state, log = await _run_of(stack, "com.acme.hook", {"url": url})
    assert INTERNAL.encode() not in log
    assert state.status == "failed"
    assert b"which is not a public address" in log
    assert http_fetch.ALLOW_PRIVATE_ENV.encode() in log
