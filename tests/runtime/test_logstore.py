"""The run-log port's contract: reads, appends and optimistic conflicts, run against the
JetStream store on a real server and against the in-memory twin alike."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.core import events as ev
from interlock.runtime.logstore import LogStore, MemoryRunLog, RunLog
from interlock.transport.errors import AppendConflict
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


def entered(run_id: str, seq: int, state: str = "s") -> ev.StateEntered:
    return ev.StateEntered(
        specversion="1.0",
        id=f"{run_id}:{seq}",
        source=ev.SOURCE,
        subject=run_id,
        time="2026-11-01T00:00:00.000Z",
        datacontenttype="application/json",
        data=ev.StateEnteredData(state=state),
    )


@pytest.fixture(params=["jetstream", "grouped", "memory"])
async def log(
    request: pytest.FixtureRequest, nc: Client, js: JetStreamContext, subjects: Subjects
) -> LogStore:
    if request.param == "memory":
        return MemoryRunLog()
    await provision(js, subjects)
    # grouped: appends in atomic batches as soon as two await their acknowledgement.
    return RunLog(nc, subjects, group_commit=2 if request.param == "grouped" else 0)


async def test_reading_a_run_that_has_no_records(log: LogStore) -> None:
    assert await log.read("r-nothing") == ([], 0)
    assert await log.read_raw("r-nothing") == []
    assert await log.read("r-nothing", after=41) == ([], 41)


async def test_append_then_read_round_trip(log: LogStore) -> None:
    first = [entered("r1", 1, "a"), entered("r1", 2, "b")]
    last = await log.append("r1", first, 0)
    # Another run's records interleave in the stream and must not show up in r1's log.
    await log.append("r2", [entered("r2", 1)], 0)
    last = await log.append("r1", [entered("r1", 3, "c")], last)

    records, seq = await log.read("r1")
    assert records == [*first, entered("r1", 3, "c")]
    assert seq == last
    # One message per decision (append), holding that decision's records.
    raw = await log.read_raw("r1")
    assert [data for _, data in raw] == [
        ev.encode_batch(first),
        ev.encode_batch([entered("r1", 3, "c")]),
    ]
    assert raw[0][0] < raw[1][0]

    later, seq_after = await log.read("r1", after=raw[0][0])
    assert later == [entered("r1", 3, "c")]
    assert seq_after == last


async def test_stale_expected_sequence_conflicts_and_stores_nothing(log: LogStore) -> None:
    last = await log.append("r1", [entered("r1", 1)], 0)
    await log.append("r1", [entered("r1", 2)], last)

    with pytest.raises(AppendConflict) as raised:
        await log.append("r1", [entered("r1", 2, "lost"), entered("r1", 3, "lost")], last)
    assert raised.value.expected == last
    # A second "first" append of the same run loses too: that is how a duplicate trigger
    # cannot start a run twice.
    with pytest.raises(AppendConflict):
        await log.append("r1", [entered("r1", 1, "again")], 0)

    records, _ = await log.read("r1")
    assert [r.data.state for r in records] == ["s", "s"]  # type: ignore[union-attr]


async def test_a_log_longer_than_one_read_batch_reads_back_in_order(log: LogStore) -> None:
    # One read request returns at most 1000 messages: 2500 decisions take three.
    total = 2500
    last = 0
    for seq in range(1, total + 1):
        last = await log.append("rlong", [entered("rlong", seq, f"s{seq}")], last)
        if seq % 500 == 0:  # other runs interleave: the long run's sequences have gaps
            await log.append(f"rother{seq}", [entered(f"rother{seq}", 1)], 0)

    records, seq = await log.read("rlong")
    assert len(records) == total
    assert [r.id for r in records] == [f"rlong:{n}" for n in range(1, total + 1)]
    assert seq == last

    raw = await log.read_raw("rlong")
    tail, _ = await log.read("rlong", after=raw[1999][0])
    assert [r.id for r in tail] == [f"rlong:{n}" for n in range(2001, total + 1)]


async def test_the_leader_knows_the_last_record_of_a_run(log: LogStore) -> None:
    assert await log.last_seq("nobody") == 0
    first = await log.append("r-last", [entered("r-last", 1)], 0)
    second = await log.append("r-last", [entered("r-last", 2)], first)
    assert await log.last_seq("r-last") == second
    records, last = await log.read("r-last", consistent=True)
    assert last == second
    assert records == [entered("r-last", 1), entered("r-last", 2)]
    assert await log.read("nobody", consistent=True) == ([], 0)
