"""What one signal, describe or result asks of the server does not grow with the run's
history: counted on a real nats-server, message by message as the client's connection
sends them (``NatsClient.sent``), for a run of a few dozen records (no snapshot: the
snapshot's get, then the log from its start) and one of a few thousand (more than one
batch of a whole read: the snapshot's get, then the log from the snapshot's own message
and the run's message count, and nothing else), with an orchestrator deciding."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import pytest
import pytest_asyncio

from interlock import Client
from interlock.core.engine import decided
from interlock.core.incoming import Incoming
from interlock.runtime.runs import Runs
from interlock.runtime.service import Orchestrator
from interlock.runtime.snapshots import Snapshots
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import Subjects

TICKER = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: ticker}
spec:
  budget: {max_transitions: 100000}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: tick, goto: waiting, set: {n: "{{ data.n }}"}}
        - {event: stop, goto: done}
    done:
      type: terminal
"""
pytestmark = pytest.mark.asyncio(loop_scope="module")

SHORT = 20
"""Ticks of the short run (3 records each): no snapshot."""
LONG = 1100
"""Ticks of the long run: more messages than one batched read returns (1,000)."""


@dataclass
class Runs2:
    client: Client
    nc: NatsClient
    subjects: Subjects
    short: str
    long: str


async def _ticked(client: Client, ticks: int) -> str:
    """A run that took ``ticks`` tick events, appended as the orchestrator decides them
    (snapshots written as it writes them)."""
    ops = client.ops
    snapshots = Snapshots(ops.nc, ops.subjects, write=True, key=ops.log.key, where=ops.log.where)
    runs = Runs(ops.log, ops.registry, cache_size=10, snapshots=snapshots)
    run_id = await client.start("ticker", {})
    for n in range(ticks):
        event = Incoming(type="tick", source="t", id=f"tick-{n}", data={"n": n})
        now = runs.clock()
        await runs.apply(run_id, lambda d, s, e=event, t=now: decided(d, s, e, t)[0])
    while snapshots._writes:
        await asyncio.gather(*snapshots._writes)
    return run_id


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two(nats_url: str) -> AsyncIterator[Runs2]:
    subjects = Subjects(prefix=f"rq{uuid.uuid4().hex[:10]}")
    client = await Client.connect(nats_url, prefix=subjects.prefix)
    await client.ops.ensure_provisioned()
    applied = await client.ops.apply([("ticker.yaml", TICKER)])
    assert applied.compiled.ok, applied.compiled.diagnostics
    short, long = await _ticked(client, SHORT), await _ticked(client, LONG)
    onc = await nats.connect(nats_url)
    orchestrator = Orchestrator(onc, subjects)
    await orchestrator.start()
    try:
        nc = client.nc
        assert isinstance(nc, NatsClient)
        for run_id in (short, long):  # the log key, the partition map, the workflow: once
            assert (await client.signal(run_id, "tick", {"n": -1}, wait=30)).outcome == "moved"
        yield Runs2(client, nc, subjects, short, long)
    finally:
        await orchestrator.stop()
        await onc.close()
        await client.close()


def _asked(two: Runs2, sent: list[tuple[str, bytes]]) -> list[str]:
    """Each message sent, named by what it asks: ``snapshot``, ``log from <seq>``, ``last
    message``, ``count``, ``event``, or its subject (the workflow's definition left out)."""
    s = two.subjects
    names = []
    for subject, payload in sent:
        if subject == f"$JS.API.DIRECT.GET.KV_{s.snapshots_bucket}":
            names.append("snapshot")
        elif subject == f"$JS.API.DIRECT.GET.{s.runs_stream}":
            body = json.loads(payload)
            names.append(f"log from {body['seq']}" if "seq" in body else "last message")
        elif subject == f"$JS.API.STREAM.INFO.{s.runs_stream}":
            names.append("count")
        elif subject.startswith(f"{s.prefix}.events."):
            names.append("event")
        elif subject.startswith(f"$JS.API.DIRECT.GET.KV_{s.workflows_bucket}."):
            continue  # the workflow's version, kept a while: not the run's history
        else:
            names.append(subject)
    return names


async def _counted(two: Runs2, run_id: str, what: str) -> tuple[list[str], int, set[int]]:
    """What ``what`` (signal, describe, result) of ``run_id`` sent, the run's last
    sequence before, and the sequences its snapshot was at (before and after)."""
    client = two.client
    last = await client.ops.log.last_seq(run_id)
    before = await client.ops.snapshots.get(run_id)
    two.nc.sent = []
    try:
        if what == "signal":
            assert (await client.signal(run_id, "tick", {"n": 1}, wait=30)).outcome == "moved"
        elif what == "describe":
            await client.describe(run_id)
        else:
            await client.result(run_id)
        sent = two.nc.sent
    finally:
        two.nc.sent = None
    after = await client.ops.snapshots.get(run_id)
    covered = {s.seq for s in (before, after) if s is not None}
    return _asked(two, sent), last, covered


@pytest.mark.parametrize("what", ["signal", "describe", "result"])
async def test_a_read_asks_as_much_of_a_long_run_as_of_a_short_one(two: Runs2, what: str) -> None:
    short, _, covered = await _counted(two, two.short, what)
    assert not covered, "the short run has a snapshot"
    long, last, covered = await _counted(two, two.long, what)
    assert covered, "the long run has no snapshot"

    # Reading the state: the snapshot's get, then the log from its start (short), or
    # from the snapshot's own message with the run's message count beside it (long).
    assert short[:2] == ["snapshot", "log from 1"], short
    assert long[0] == "snapshot", long
    assert sorted(long[1:3]) in [["count", f"log from {seq}"] for seq in covered], long
    if what != "signal":
        assert (short[2:], long[3:]) == ([], []), (short, long)
        return
    # The signal, then its decision read from where the log was: nothing older.
    for rest in (short[2:], long[3:]):
        assert rest[0] == "event", rest
        assert 1 <= len(rest[1:]) <= 4, rest
        assert all(p.startswith("log from ") for p in rest[1:]), rest
    assert all(int(p.removeprefix("log from ")) > last for p in long[4:]), long


async def test_the_gateway_describes_a_long_run_from_its_snapshot_and_keeps_its_state(
    two: Runs2,
) -> None:
    """``GET /runs/{id}`` (the gateway's run logs): a long run's description reads what the
    client's does and keeps the state, not the records; the next reads what was appended.
    A short run's whole log, read for its description, is kept for its log pages."""
    from interlock.gateway.runlogs import RunLogs

    client, logs = two.client, RunLogs(two.client.ops)
    covered = {s.seq for s in [await client.ops.snapshots.get(two.long)] if s is not None}
    two.nc.sent = []
    described = await logs.describe(two.long)
    first, two.nc.sent = _asked(two, two.nc.sent), []
    again = await logs.describe(two.long)
    second, two.nc.sent = _asked(two, two.nc.sent), None

    assert described == again == await client.describe(two.long)
    assert described.records == len(await client.records(two.long))
    assert first[0] == "snapshot"
    assert sorted(first[1:]) in [["count", f"log from {seq}"] for seq in covered], first
    last = await client.ops.log.last_seq(two.long)
    assert second == [f"log from {last + 1}"]
    assert logs.kept_records == 0

    short = await logs.describe(two.short)
    assert short == await client.describe(two.short)
    records = await client.records(two.short)
    assert short.records == len(records) == logs.kept_records


async def test_waiting_for_a_long_runs_result_reads_its_snapshot_not_its_log(two: Runs2) -> None:
    """``result`` with a wait (``interlock result --wait``, ``GET /runs/{id}/result?timeout``):
    the run's last message (it ended), then its state as any read takes it. (Last in this
    module: it ends the long run.)"""
    client = two.client
    assert (await client.signal(two.long, "stop", wait=30)).outcome == "moved"
    covered = {s.seq for s in [await client.ops.snapshots.get(two.long)] if s is not None}
    two.nc.sent = []
    result = await client.result(two.long, wait=True, timeout=30)
    asked = _asked(two, two.nc.sent)
    two.nc.sent = None

    assert result.status == "completed"
    assert asked[:2] == ["last message", "snapshot"], asked
    assert sorted(asked[2:]) in [["count", f"log from {seq}"] for seq in covered], asked
