"""Group commit of run-log appends on a real server: batches form only when appends queue,
each append keeps its own expected-sequence check, and a refused batch costs only the
append that lost."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.core import events as ev
from interlock.runtime.groupcommit import GroupCommit
from interlock.runtime.logstore import RunLog
from interlock.transport.errors import AppendConflict
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


def entered(run_id: str, n: int) -> ev.StateEntered:
    return ev.StateEntered(
        specversion="1.0",
        id=f"{run_id}:{n}",
        source=ev.SOURCE,
        subject=run_id,
        time="2026-11-01T00:00:00.000Z",
        datacontenttype="application/json",
        data=ev.StateEnteredData(state=f"s{n}"),
    )


@pytest.fixture
async def grouped(nc: Client, js: JetStreamContext, subjects: Subjects) -> RunLog:
    await provision(js, subjects)
    log = RunLog(nc, subjects, group_commit=4)
    await log.key()  # as the orchestrator does when it starts: appends do not wait for it
    return log


def stats(log: RunLog) -> GroupCommit:
    assert log.group is not None
    return log.group


async def test_one_append_at_a_time_never_waits_for_a_batch(grouped: RunLog) -> None:
    last = 0
    for n in range(1, 6):
        last = await grouped.append("g-alone", [entered("g-alone", n)], last)
    assert stats(grouped).stats.batches == 0
    assert stats(grouped).stats.singles == 5
    records, seq = await grouped.read("g-alone")
    assert [r.id for r in records] == [f"g-alone:{n}" for n in range(1, 6)]
    assert seq == last


async def test_appends_that_queue_go_as_one_batch_each_with_its_own_sequence(
    grouped: RunLog,
) -> None:
    runs = [f"g-many-{i}" for i in range(40)]
    seqs = await asyncio.gather(*(grouped.append(r, [entered(r, 1)], 0) for r in runs))
    group = stats(grouped)
    # Four go one by one at once; the 36 that queued behind them go as one batch.
    assert group.stats.singles == 4
    assert group.stats.batches == 1
    assert group.stats.batched == 36
    for run_id, seq in zip(runs, seqs, strict=True):
        assert await grouped.last_seq(run_id) == seq
        records, _ = await grouped.read(run_id)
        assert [r.id for r in records] == [f"{run_id}:1"]
    assert len(set(seqs)) == len(seqs)


async def test_a_check_that_fails_in_a_batch_fails_only_its_own_append(grouped: RunLog) -> None:
    first = await grouped.append("g-moved", [entered("g-moved", 1)], 0)
    runs = [f"g-other-{i}" for i in range(12)]
    outcomes = await asyncio.gather(
        *(grouped.append(r, [entered(r, 1)], 0) for r in runs),
        # Expects the run to be empty: it is not, so this append loses, in the batch.
        grouped.append("g-moved", [entered("g-moved", 2)], 0),
        return_exceptions=True,
    )
    *stored, lost = outcomes
    assert isinstance(lost, AppendConflict)
    assert all(isinstance(seq, int) for seq in stored)
    group = stats(grouped)
    assert group.stats.retried == 9  # the batch of 9 was refused whole, then sent one by one
    for run_id, seq in zip(runs, stored, strict=True):
        assert await grouped.last_seq(run_id) == seq
    records, seq = await grouped.read("g-moved")
    assert [r.id for r in records] == ["g-moved:1"]
    assert seq == first


async def test_two_appends_to_one_run_that_queue_together_one_wins(grouped: RunLog) -> None:
    fillers = [grouped.append(f"g-fill-{i}", [entered(f"g-fill-{i}", 1)], 0) for i in range(12)]
    twins = [grouped.append("g-twin", [entered("g-twin", n)], 0) for n in (1, 2)]
    outcomes = await asyncio.gather(*fillers, *twins, return_exceptions=True)
    assert all(isinstance(o, int) for o in outcomes[:12])
    won = [o for o in outcomes[12:] if isinstance(o, int)]
    lost = [o for o in outcomes[12:] if isinstance(o, AppendConflict)]
    assert len(won) == 1
    assert len(lost) == 1
    # The second was kept out of the first's batch (the server would refuse the batch).
    assert stats(grouped).stats.retried == 0
    records, seq = await grouped.read("g-twin")
    assert len(records) == 1
    assert seq == won[0]


def test_a_group_of_one_is_refused(nc: Client) -> None:
    async def never(subject: str, headers: dict[str, str], data: bytes, expected: int) -> int:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="at least 2"):
        GroupCommit(nc, never, 1)
