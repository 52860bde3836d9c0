"""Waiting for a run that is not there yet: no map read per run on an installation of one
layout, and a run placed by a layout set elsewhere after the map was read is still found."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlock.runtime.client import InterlockClient
from interlock.runtime.partitioning import set_partitions
from interlock.transport import partitions as partitions_module
from interlock.transport.partitions import partition_of
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, WAITER, connect


async def _client(url: str, subjects: Subjects) -> InterlockClient:
    client = InterlockClient(await connect(url), subjects)
    await client.ensure_provisioned()
    return client


async def _start(client: InterlockClient, run_id: str) -> None:
    definition, version = await client.registry.latest("waiter")
    created, _ = await client.runs.start(definition, version, run_id, {})
    assert created


def _map_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every read of the partition map in this process (the real read, counted)."""
    reads: list[int] = []
    read = partitions_module.read_map

    async def counted(*args: Any) -> Any:
        reads.append(1)
        return await read(*args)

    monkeypatch.setattr(partitions_module, "read_map", counted)
    return reads


async def test_waiting_for_runs_not_started_yet_reads_no_map_per_run(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    starter, waiter = await _client(nats_url, subjects), await _client(nats_url, subjects)
    try:
        applied = await starter.apply([("waiter", WAITER)])
        assert applied.compiled.ok
        await waiter.watcher.start()  # reads the map once
        reads = _map_reads(monkeypatch)
        for i in range(10):
            run_id = f"miss-{i}"
            waiting = asyncio.create_task(waiter.watcher.exists(run_id, TIMEOUT))
            await asyncio.sleep(0)  # its first look finds nothing
            await _start(starter, run_id)
            assert await waiting
        # One partition, one layout: at most one read a second (the map's copy ages).
        assert len(reads) <= 2, reads
    finally:
        await starter.nc.close()
        await waiter.nc.close()


async def test_a_run_placed_by_a_layout_set_elsewhere_after_the_map_was_read_is_found(
    nats_url: str, subjects: Subjects
) -> None:
    setter = await _client(nats_url, subjects)
    waiter, quick = await _client(nats_url, subjects), await _client(nats_url, subjects)
    try:
        applied = await setter.apply([("waiter", WAITER)])
        assert applied.compiled.ok
        for client in (waiter, quick):
            await client.watcher.start()  # one layout of one partition, read now
            assert client.log.placement.lately_single()
        await set_partitions(setter.nc, subjects, 4)
        moved = [f"moved-{i}" for i in range(40) if partition_of(f"moved-{i}", 4)][:2]
        # Started by a process that read the new layout, before the wait: found even by a
        # wait whose time ends at its first look.
        await _start(setter, moved[0])
        assert await quick.watcher.exists(moved[0], 0.05)
        # Started after the wait began: its append is the hint to look again.
        waiting = asyncio.create_task(waiter.watcher.exists(moved[1], TIMEOUT))
        await asyncio.sleep(0)
        await _start(setter, moved[1])
        assert await waiting
        for run_id in moved:
            for client in (waiter, quick):
                stream, _ = await client.log.where(run_id)
                assert stream == subjects.runs_stream_of(partition_of(run_id, 4))
                assert await client.read(run_id)
        assert not await waiter.watcher.exists("never-started", 0.05)
    finally:
        for client in (setter, waiter, quick):
            await client.nc.close()
