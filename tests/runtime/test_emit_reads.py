"""What ``Client.emit`` asks of the server, counted on a real nats-server message by
message as the client's connection sends them (``NatsClient.sent``) and record by record
as it reads the workflows bucket: the first emit reads the applied workflows once; each
later one asks once whether anything was applied since (one request, whatever the number
of workflows and versions), publishes, and looks up the run it starts; a workflow applied
or deleted by another client meanwhile is read, alone, by the next emit. The AgentDefs are
not read at all."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from interlock import Client
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import Subjects

pytestmark = pytest.mark.asyncio(loop_scope="module")

OTHERS = 20
"""Workflows on other event types, each applied in two versions."""


def manifest(name: str, event: str, required: str = "message") -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: {name}}}
spec:
  inputs:
    {required}: {{type: string, required: true}}
  triggers:
    - event: {event}
      input: {{{required}: "{{{{ data.{required} }}}}"}}
  initial_state: done
  states:
    done: {{type: terminal}}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(nats_url: str) -> AsyncIterator[tuple[Client, Client, Subjects]]:
    subjects = Subjects(prefix=f"er{uuid.uuid4().hex[:10]}")
    emitter = await Client.connect(nats_url, prefix=subjects.prefix)
    other = await Client.connect(nats_url, prefix=subjects.prefix)
    await other.ops.ensure_provisioned()
    texts = [("greet.yaml", manifest("greet", "acme.greet"))]
    for n in range(OTHERS):
        texts += [(f"w{n}.yaml", manifest(f"w{n}", f"acme.other{n}", "first"))]
    for round_ in ("first", "second"):
        applied = await other.ops.apply(
            [(f, t.replace("first", round_)) for f, t in texts if f != "greet.yaml"] + texts[:1]
        )
        assert applied.compiled.ok, applied.compiled.diagnostics
    try:
        yield emitter, other, subjects
    finally:
        await emitter.close()
        await other.close()


async def emit_counted(client: Client, event_id: str) -> tuple[list[str], int, list[int]]:
    """The subjects ``emit`` sent to, the workflows bucket's records it read, and the
    versions of the runs it says it starts."""
    nc = client.nc
    assert isinstance(nc, NatsClient)
    before = client.ops.applied.records_read
    nc.sent = []
    try:
        done = await client.emit(
            type="acme.greet", source="https://t.example", id=event_id,
            data={"message": "hi"}, wait=0,
        )  # fmt: skip
        sent = [subject for subject, _ in nc.sent]
    finally:
        nc.sent = None
    assert done.unknown is None, done.unknown
    return sent, client.ops.applied.records_read - before, [s.version for s in done.started]


async def test_an_emit_asks_once_whether_anything_was_applied(
    clients: tuple[Client, Client, Subjects],
) -> None:
    emitter, other, subjects = clients
    workflows = f"KV_{subjects.workflows_bucket}"
    _, first, versions = await emit_counted(emitter, "e-1")
    assert first >= 2 * (OTHERS + 1)  # the whole bucket, once
    assert versions == [1]

    for n in range(2, 5):
        sent, read, versions = await emit_counted(emitter, f"e-{n}")
        assert read == 0
        assert versions == [1]
        about_workflows = [s for s in sent if s.endswith(workflows)]
        assert len(about_workflows) == 1, sent  # is there anything newer: no
        assert not [s for s in sent if subjects.agents_bucket in s], sent
        assert [s for s in sent if s.startswith(f"{subjects.prefix}.events.")] == [
            f"{subjects.prefix}.events.acme.greet"
        ]
        # Besides: the run's last message, where its partition says (nothing grows with
        # the workflows applied).
        rest = [s for s in sent if not s.endswith(workflows) and ".events." not in s]
        assert rest, sent
        assert all(subjects.runs_stream in s or "partitions" in s for s in rest), sent
        assert len(rest) <= 2, sent

    # Another client applies a new version: the next emit reads it, and only it.
    applied = await other.ops.apply([("greet.yaml", manifest("greet", "acme.greet", "text"))])
    assert applied.compiled.ok, applied.compiled.diagnostics
    _, read, versions = await emit_counted(emitter, "e-5")
    assert 1 <= read <= 3, read  # the new version's body and its pointer
    assert versions == []  # its trigger's input now reads data.text: refused
    _, read, _ = await emit_counted(emitter, "e-6")
    assert read == 0

    # Deleted by the other client: the next emit knows, reading the one marker.
    await other.delete_workflow("greet")
    sent, read, versions = await emit_counted(emitter, "e-7")
    assert (read, versions) == (1, [])
