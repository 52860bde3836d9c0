"""Snapshots on a real nats-server: a long run is read from its snapshot and the records
after it, and a snapshot that does not match the log (wrong, stale, lost, undecodable, or
a log that lost a message before it) is ignored: it changes no state read and no decision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client as NatsClient

from interlock.core import events as ev
from interlock.core.state import fold
from interlock.runtime.client import InterlockClient
from interlock.runtime.runs import Runs
from interlock.runtime.service import Orchestrator
from interlock.runtime.snapshots import EVERY, Snapshot, Snapshots, read_state
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.jetstream import jetstream
from interlock.transport.logmac import MAC_HEADER
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
        - {event: stop, guard: "context.n == 7", goto: done}
    done:
      type: terminal
      outputs: {n: "{{ context.n }}"}
"""


class Stack:
    def __init__(self, nc: NatsClient, client: InterlockClient, subjects: Subjects) -> None:
        self.nc = nc
        self.client = client
        self.subjects = subjects
        self.snapshots = Snapshots(nc, subjects, write=True, key=client.log.key)
        self.runs = Runs(client.log, client.registry, cache_size=100, snapshots=self.snapshots)

    async def ticked(self, ticks: int) -> str:
        """A run of ``ticker`` that took ``ticks`` tick events (appended as the
        orchestrator decides them, snapshots written as it writes them)."""
        from interlock.core.engine import decided
        from interlock.core.incoming import Incoming

        run_id = await self.client.start("ticker", {})
        for n in range(ticks):
            event = Incoming(type="tick", source="t", id=f"tick-{n}", data={"n": n})
            now = self.runs.clock()
            await self.runs.apply(run_id, lambda d, s, e=event, t=now: decided(d, s, e, t)[0])
        await self.snapshots_written()
        return run_id

    async def snapshots_written(self) -> None:
        import asyncio

        while self.snapshots._writes:
            await asyncio.gather(*self.snapshots._writes)

    async def stored(self, run_id: str) -> Snapshot:
        snapshot = await self.snapshots.get(run_id)
        assert snapshot is not None
        return snapshot

    async def overwrite(self, run_id: str, data: bytes, *, signed: bool = True) -> None:
        """Put ``data`` as the run's snapshot: with the record MAC the orchestrator's carry
        when ``signed`` (so what is checked is the rest), else as anyone else would."""
        subject = f"$KV.{self.subjects.snapshots_bucket}.{run_id}"
        key = await self.client.log.key()
        headers = {MAC_HEADER: key.mac(subject, data)} if signed else None
        await jetstream(self.nc).publish(subject, data, headers=headers)


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    nc = await nats.connect(nats_url)
    client = InterlockClient(nc, subjects)
    await client.ensure_provisioned()
    (tmp_path / "ticker.yaml").write_text(TICKER)
    applied = await client.apply([("ticker.yaml", TICKER)])
    assert applied.compiled.ok, applied.compiled.diagnostics
    try:
        yield Stack(nc, client, subjects)
    finally:
        await nc.close()


async def test_a_long_run_is_read_from_its_snapshot_and_the_records_after_it(
    stack: Stack,
) -> None:
    run_id = await stack.ticked(EVERY + 40)
    snapshot = await stack.stored(run_id)
    whole = fold(await stack.client.read(run_id))
    assert EVERY <= snapshot.state.seq < whole.seq

    read = await read_state(stack.client.log, stack.client.snapshots, run_id)
    assert read is not None
    assert read.covered == snapshot.state.seq
    assert len(read.records) == whole.seq - snapshot.state.seq
    assert read.state == whole
    assert await stack.client.state(run_id) == whole


async def test_a_snapshot_round_trips_to_the_state_it_was_folded_to(stack: Stack) -> None:
    run_id = await stack.ticked(EVERY + 3)
    snapshot = await stack.stored(run_id)
    records = await stack.client.read(run_id)
    assert snapshot.state == fold(records[: snapshot.state.seq])


def _tampered(snapshot: Snapshot, **changes: object) -> bytes:
    return msgspec.json.encode(msgspec.structs.replace(snapshot, **changes))


@pytest.mark.parametrize(
    "damage",
    ["garbage", "digest", "seq of another message", "count", "lost", "no record MAC"],
)
async def test_a_snapshot_that_does_not_match_the_log_is_ignored(stack: Stack, damage: str) -> None:
    run_id = await stack.ticked(EVERY + 10)
    snapshot = await stack.stored(run_id)
    whole = fold(await stack.client.read(run_id))
    if damage == "garbage":
        await stack.overwrite(run_id, b"\x00 not a snapshot")
    elif damage == "digest":
        await stack.overwrite(run_id, _tampered(snapshot, digest="0" * 64))
    elif damage == "seq of another message":
        await stack.overwrite(run_id, _tampered(snapshot, seq=snapshot.seq - 1))
    elif damage == "count":
        await stack.overwrite(run_id, _tampered(snapshot, messages=snapshot.messages - 1))
    elif damage == "no record MAC":
        # All it says of the log is true, its state is not, and it was not written by
        # Interlock: a lie about the run only the log key could have made.
        lie = msgspec.structs.replace(snapshot.state, context={"n": 7})
        await stack.overwrite(run_id, _tampered(snapshot, state=lie), signed=False)
    else:
        await stack.snapshots.delete(run_id)
    rejected = stack.client.snapshots.rejected

    read = await read_state(stack.client.log, stack.client.snapshots, run_id)
    assert read is not None
    assert read.covered == 0, "the snapshot was used"
    assert read.state == whole
    assert stack.client.snapshots.rejected == rejected + (damage != "lost")


async def test_a_log_that_lost_a_message_before_its_snapshot_is_read_whole(
    stack: Stack,
) -> None:
    run_id = await stack.ticked(EVERY + 10)
    snapshot = await stack.stored(run_id)
    js = jetstream(stack.nc)
    raw = await stack.client.log.read_raw(run_id)
    await js.delete_msg(stack.subjects.runs_stream, raw[3][0])

    read = await read_state(stack.client.log, stack.client.snapshots, run_id)
    assert read is not None
    assert read.covered == 0
    assert read.state == fold(await stack.client.read(run_id))
    assert snapshot.state.seq > 0


async def test_a_wrong_snapshot_changes_no_decision_of_an_orchestrator_just_started(
    stack: Stack, nats_url: str, subjects: Subjects
) -> None:
    """A snapshot whose state says the count is 7 (so stop would end the run) but whose
    digest does not match: the orchestrator, with nothing cached, reads the log (the count
    is past 7), declines the first stop, and ends the run only after a tick of 7."""
    run_id = await stack.ticked(EVERY + 1)
    snapshot = await stack.stored(run_id)
    lie = msgspec.structs.replace(snapshot.state, context={"n": 7})
    await stack.overwrite(run_id, _tampered(snapshot, state=lie, digest="f" * 64))

    nc = await nats.connect(nats_url)
    orchestrator = Orchestrator(nc, subjects)
    await orchestrator.start()
    try:
        for type_, data, id_ in (("stop", {}, "stop-1"), ("tick", {"n": 7}, "seven")):
            await stack.client.emit(_addressed(run_id, type_, data, id_))
        await stack.client.emit(_addressed(run_id, "stop", {}, "stop-2"))
        final = await stack.client.wait(run_id, 30)
        assert final.status == "completed"
        assert final.outputs == {"n": 7}
        assert _has(await stack.client.read(run_id), "seven"), "it ended at the first stop"
    finally:
        await orchestrator.stop()
        await nc.close()


def _addressed(run_id: str, type_: str, data: object, id_: str) -> CloudEvent:
    return CloudEvent(
        type=type_,
        source="test",
        id=id_,
        data=data,
        extensions={"runid": run_id},
    )


def _has(records: list[ev.AnyRecord], event_id: str) -> bool:
    """Whether a record of the log names the event ``event_id``."""
    return any(f'"{event_id}"' in ev.encode(r).decode() for r in records)
