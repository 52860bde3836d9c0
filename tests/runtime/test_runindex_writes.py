"""Run-index writes sent at once (no read first, awaited later) write what ``update``
writes, and a lost compare-and-set still ends in the right entry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client

from interlock.core import events as ev
from interlock.runtime.runindex import RunIndex
from interlock.runtime.runlisting import RunPages, backfill
from interlock.transport.appends import append_soon
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import AppendConflict, JetStreamAPIError
from interlock.transport.jetstream import jetstream
from interlock.transport.kvread import bucket_values
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

T0 = "2026-01-01T00:00:00.000Z"


def record(cls: type[Any], run_id: str, seq: int, data: Any) -> Any:
    """A record of run ``run_id`` at position ``seq``, dated T0."""
    return cls(
        specversion="1.0",
        id=f"{run_id}:{seq}",
        source=ev.SOURCE,
        subject=run_id,
        time=T0,
        datacontenttype="application/json",
        data=data,
    )


@pytest.fixture
async def fast(nats_url: str, subjects: Subjects) -> AsyncIterator[Client]:
    """Interlock's client, with the streams and buckets provisioned."""
    client = await connect(ConnectOptions.resolve(nats_url))
    try:
        await provision(jetstream(client), subjects)
        yield client
    finally:
        await client.close()


async def test_an_append_sent_at_once_is_checked_as_append_batch_checks(
    fast: Client, subjects: Subjects
) -> None:
    subject = subjects.run("soon")
    assert append_soon(fast, subject, b"x", 0) is None  # no reply subscription yet
    await jetstream(fast).publish(subjects.run("other"), b"-")  # makes it
    first = append_soon(fast, subject, b"a", 0)
    assert first is not None
    seq = await first()
    again = append_soon(fast, subject, b"b", 0)
    assert again is not None
    with pytest.raises(AppendConflict):
        await again()
    nxt = append_soon(fast, subject, b"b", seq)
    assert nxt is not None
    assert await nxt() > seq
    nowhere = append_soon(fast, f"{subjects.prefix}.nowhere", b"x", 0)
    assert nowhere is not None
    with pytest.raises(JetStreamAPIError, match="none stores this subject, or its stream has no"):
        await nowhere()


async def _entry(fast: Client, subjects: Subjects, run_id: str) -> dict[str, Any]:
    kv = await jetstream(fast).key_value(subjects.runs_bucket)
    entry = await kv.get(run_id)
    return dict(json.loads(entry.value or b"{}"))


async def test_index_writes_sent_at_once_move_the_entry_forward(
    fast: Client, subjects: Subjects
) -> None:
    index = RunIndex(fast, subjects)
    await index.start()
    await jetstream(fast).publish(subjects.run("warm"), b"-")  # the reply subscription
    run_id = "r1"
    started = record(ev.RunStarted, run_id, 1, ev.RunStartedData(workflow="wf", spec_hash="h"))
    entered = record(ev.StateEntered, run_id, 2, ev.StateEnteredData(state="a"))
    done = record(ev.RunCompleted, run_id, 3, ev.RunCompletedData(state="a"))

    write = index.update_soon(run_id, [started])  # a new run: created, no read
    assert write is not None
    assert write[1]
    await write[0]
    write = index.update_soon(run_id, [entered])  # its revision known: no read
    assert write is not None
    assert write[1]
    await write[0]
    assert (await _entry(fast, subjects, run_id))["state"] == "a"
    assert index.update_soon(run_id, [started, entered]) is None  # written already

    # Someone else writes the entry meanwhile: the compare-and-set loses, and the
    # write is made again from what is stored.
    kv = await jetstream(fast).key_value(subjects.runs_bucket)
    stored = await kv.get(run_id)
    await kv.update(run_id, stored.value or b"", last=stored.revision)
    write = index.update_soon(run_id, [done])
    assert write is not None
    await write[0]
    assert (await _entry(fast, subjects, run_id))["status"] == "completed"

    # A run whose earlier records were written elsewhere: read first (no write at once).
    other = "r2"
    await index.update(
        other, [record(ev.RunStarted, other, 1, ev.RunStartedData(workflow="wf", spec_hash="h"))]
    )
    fresh = RunIndex(fast, subjects)
    await fresh.start()
    write = fresh.update_soon(
        other, [record(ev.StateEntered, other, 2, ev.StateEnteredData(state="b"))]
    )
    assert write is not None
    assert not write[1]
    await write[0]
    assert (await _entry(fast, subjects, other))["state"] == "b"


async def _listed(fast: Client, subjects: Subjects, run_id: str) -> list[str]:
    """The listing keys of ``run_id`` stored in the run index."""
    kv = await jetstream(fast).key_value(subjects.runs_bucket)
    return sorted(k for k in await bucket_values(kv, "L.>") if k.endswith(f".{run_id}"))


async def test_a_run_has_one_listing_key_which_moves_with_its_status(
    fast: Client, subjects: Subjects
) -> None:
    index = RunIndex(fast, subjects)
    await index.start()
    await jetstream(fast).publish(subjects.run("warm"), b"-")  # the reply subscription
    pages = RunPages(fast, subjects)
    for run_id, soon in (("rsoon", True), ("rread", False)):
        started = record(ev.RunStarted, run_id, 1, ev.RunStartedData(workflow="wf", spec_hash="h"))
        done = record(
            ev.RunFailed,
            run_id,
            2,
            ev.RunFailedData(error=ev.ErrorInfo(error_class="x", message="y")),
        )
        if soon:
            write = index.update_soon(run_id, [started])
            assert write is not None
            await write[0]
        else:
            await index.update(run_id, [started])
        assert await _listed(fast, subjects, run_id) == [f"L.running.default.wf.{run_id}"]
        running, _ = await pages.page(status="running", workflow="default/wf")
        assert run_id in [r["run_id"] for r in running]
        if soon:
            write = index.update_soon(run_id, [done])
            assert write is not None
            await write[0]
        else:
            fresh = RunIndex(fast, subjects)  # knows nothing: reads the entry first
            await fresh.start()
            await fresh.update(run_id, [done])
        # Moved: the running key purged (no marker left), the failed one written.
        assert await _listed(fast, subjects, run_id) == [f"L.failed.default.wf.{run_id}"]
        running, _ = await pages.page(status="running")
        assert run_id not in [r["run_id"] for r in running]
        failed, _ = await pages.page(status="failed", workflow="wf")
        assert failed[0]["run_id"] == run_id


async def test_an_index_written_before_listing_keys_is_backfilled_once(
    fast: Client, subjects: Subjects
) -> None:
    kv = await jetstream(fast).key_value(subjects.runs_bucket)
    for i in range(300):
        entry = {"run_id": f"rold{i}", "workflow": "wf", "namespace": "default", "version": 1}
        await kv.put(f"rold{i}", json.dumps({**entry, "status": "completed"}).encode())
    await kv.put("rodd", b"not an entry")  # reported, not listed
    pages = RunPages(fast, subjects)
    assert await pages.page() == ([], False)
    assert await backfill(fast, subjects) == 300
    found, more = await pages.page(limit=300)
    assert sorted(r["run_id"] for r in found) == sorted(f"rold{i}" for i in range(300))
    assert not more
    assert await backfill(fast, subjects) == 0  # marked: read nothing again
    assert await pages.count(status="completed") == 300
