"""What listing the workflows (``Client.workflows``: ``interlock workflows``,
``GET /workflows``) asks of the server, counted on a real nats-server as the client's
connection sends it and record by record as it reads the workflows bucket: the first list
reads the bucket whole; each later one asks once whether anything was applied since; a
version applied or a workflow deleted by another client is read, alone, by the next list."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from interlock import Client
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import Subjects

pytestmark = pytest.mark.asyncio(loop_scope="module")

WORKFLOWS = 10
"""Workflows applied, each in two versions."""


def manifest(name: str, version: int) -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: {name}}}
spec:
  inputs:
    v{version}: {{type: string}}
  initial_state: done
  states:
    done: {{type: terminal}}
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(nats_url: str) -> AsyncIterator[tuple[Client, Client, Subjects]]:
    subjects = Subjects(prefix=f"cr{uuid.uuid4().hex[:10]}")
    lister = await Client.connect(nats_url, prefix=subjects.prefix)
    other = await Client.connect(nats_url, prefix=subjects.prefix)
    await other.ops.ensure_provisioned()
    for version in (1, 2):
        applied = await other.ops.apply(
            [(f"w{n}.yaml", manifest(f"w{n}", version)) for n in range(WORKFLOWS)]
        )
        assert applied.compiled.ok, applied.compiled.diagnostics
    try:
        yield lister, other, subjects
    finally:
        await lister.close()
        await other.close()


async def list_counted(client: Client, subjects: Subjects) -> tuple[dict[str, int], int, int]:
    """The workflows listed (name: version), the workflows bucket's records read, and the
    requests sent about that bucket."""
    nc = client.nc
    assert isinstance(nc, NatsClient)
    before = client.ops.applied.records_read
    nc.sent = []
    try:
        listed = await client.workflows()
        sent = [subject for subject, _ in nc.sent]
    finally:
        nc.sent = None
    about = [s for s in sent if s.endswith(f"KV_{subjects.workflows_bucket}")]
    read = client.ops.applied.records_read - before
    return {w.name: w.version for w in listed}, read, len(about)


async def test_a_list_reads_only_what_was_stored_since_the_last(
    clients: tuple[Client, Client, Subjects],
) -> None:
    lister, other, subjects = clients
    listed, read, _ = await list_counted(lister, subjects)
    assert listed == {f"w{n}": 2 for n in range(WORKFLOWS)}
    assert read >= 2 * 2 * WORKFLOWS  # the whole bucket, once: two bodies, two pointers each

    for _ in range(3):
        again, read, asked = await list_counted(lister, subjects)
        assert (again, read, asked) == (listed, 0, 1)  # is there anything newer: no

    applied = await other.ops.apply([("w0.yaml", manifest("w0", 3))])
    assert applied.compiled.ok, applied.compiled.diagnostics
    listed, read, _ = await list_counted(lister, subjects)
    assert listed["w0"] == 3
    assert 1 <= read <= 3, read  # the new version's body and its pointer

    await other.delete_workflow("w1")
    listed, read, _ = await list_counted(lister, subjects)
    assert "w1" not in listed
    assert read == 1  # the pointer's delete marker
    assert len(listed) == WORKFLOWS - 1
