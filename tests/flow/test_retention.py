"""Retention on a real nats-server, with time on an advanceable clock: a finished run is
deleted once it is older than its workflow's ``retention`` (or the installation's default),
its log archived first; a run that has not ended is never touched; the archive replays;
every deletion is in the audit stream, once, however often it is attempted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from interlock.cli.main import main as interlock_main
from interlock.core.definition import ArchiveDef
from interlock.core.state import fold
from interlock.runtime import retention
from interlock.runtime.errors import RunNotEnded, UnknownRun
from interlock.runtime.retention import Policy, delete_run, retention_timer
from interlock.runtime.service import Orchestrator
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects
from support.flow import WAIT, ClockStack, clock_orchestrator
from support.runtime import eventually

HOUR = 3600.0


def manifest(name: str, spec: str = "") -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: {name}}}
spec:
{spec}  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {{event: go, goto: done}}
        - {{event: renew, goto: waiting, continue_as_new: true}}
    done:
      type: terminal
"""


class Stack(ClockStack):
    orchestrator: Orchestrator

    async def ended(self, workflow: str) -> str:
        """A run of ``workflow`` started and cancelled (an ended run); its id."""
        run_id = await self.client.start(workflow, {})
        assert await self.client.cancel(run_id, "done with it")
        await self.run_until(run_id, lambda s: s.status == "cancelled", "cancelled")
        await self.index_has(run_id, "cancelled")
        return run_id

    async def retention_scheduled(self, run_id: str) -> None:
        await self.run_until(
            run_id, lambda _: self.timers.knows(retention_timer(run_id)), "its deletion scheduled"
        )

    async def gone(self, run_id: str) -> bool:
        try:
            await self.client.read(run_id)
        except UnknownRun:
            return True
        return False

    async def indexed(self, run_id: str) -> bool:
        return run_id in {r["run_id"] for r in await self.client.list_runs()}

    async def index_has(self, run_id: str, status: str) -> None:
        """Wait until the run's index entry (written behind the run) says ``status``."""

        async def has() -> bool:
            return any(
                r["run_id"] == run_id and r["status"] == status
                for r in await self.client.list_runs()
            )

        deadline = asyncio.get_running_loop().time() + WAIT
        while not await has():
            assert asyncio.get_running_loop().time() < deadline, f"{run_id} never indexed"
            await asyncio.sleep(0.02)

    async def audit(self) -> list[dict[str, Any]]:
        js = jetstream(self.client.nc)
        s = self.client.subjects
        info = await js.stream_info(s.audit_stream)
        return [
            json.loads((await js.get_msg(s.audit_stream, seq)).data or b"{}")
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
            if info.state.messages
        ]


async def cli(argv: list[str]) -> int:
    """The CLI as a user runs it (its own event loop, here on a thread)."""
    return await asyncio.to_thread(interlock_main, argv)


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects, tmp_path: Path) -> AsyncIterator[Stack]:
    policy = Policy(retention_s=2 * HOUR, archive=ArchiveDef(bucket=f"{subjects.prefix}_arch"))
    archive = f"  archive: {{directory: {tmp_path}}}\n"
    async with clock_orchestrator(nats_url, subjects, retention=policy) as (client, timers, o):
        applied = await client.apply(
            [
                ("kept.yaml", manifest("kept", f"  retention: 1h\n{archive}")),
                ("defaulted.yaml", manifest("defaulted")),
            ]
        )
        assert applied.compiled.ok, applied.compiled.diagnostics
        stack = Stack(client, timers)
        stack.orchestrator = o
        yield stack


async def test_a_finished_run_is_archived_then_deleted_once_past_its_retention(
    stack: Stack, tmp_path: Path
) -> None:
    finished = await stack.ended("kept")
    running = await stack.client.start("kept", {})
    await stack.retention_scheduled(finished)
    records = await stack.client.read(finished)

    await stack.timers.advance(HOUR - 60)
    assert not await stack.gone(finished), "deleted before its retention ran out"

    await stack.timers.advance(120)
    assert await stack.gone(finished)
    assert not await stack.indexed(finished)
    # The run that has not ended is untouched, whatever its age.
    assert fold(await stack.client.read(running)).status == "running"
    await stack.index_has(running, "running")

    archived = tmp_path / f"{finished}.jsonl"
    assert len(archived.read_text().splitlines()) == len(records)
    assert await cli(["replay", "--file", str(archived), "--json"]) == 0
    [entry] = await stack.audit()
    assert entry["run_id"] == finished
    assert entry["by"] == "retention"
    assert entry["status"] == "cancelled"
    assert entry["archived_to"] == str(archived)


async def test_the_installation_default_applies_where_a_workflow_sets_none(stack: Stack) -> None:
    finished = await stack.ended("defaulted")
    await stack.retention_scheduled(finished)
    records = await stack.client.read(finished)
    await stack.timers.advance(HOUR + 60)
    assert not await stack.gone(finished), "the workflow's own retention is the default's 2h"
    await stack.timers.advance(HOUR)
    assert await stack.gone(finished)
    store = await jetstream(stack.client.nc).object_store(f"{stack.client.subjects.prefix}_arch")
    archived = await store.get(f"{finished}.jsonl")
    assert archived.data is not None
    assert len(archived.data.splitlines()) == len(records)


async def test_a_deletion_cut_short_is_finished_by_the_next_attempt_and_audited_once(
    stack: Stack,
) -> None:
    finished = await stack.ended("kept")
    client = stack.client
    # Cut short after the audit record and the purge, before the index entry went.
    await delete_run(
        client.nc, client.subjects, client.log, finished, by="retention", reason="", archive=None
    )
    await stack.orchestrator.flow.retainer.due(finished)  # type: ignore[union-attr]
    await delete_run(
        client.nc, client.subjects, client.log, finished, by="retention", reason="", archive=None
    )
    assert await stack.gone(finished)
    assert not await stack.indexed(finished)
    assert [e["run_id"] for e in await stack.audit()] == [finished]


async def test_a_chain_is_deleted_only_once_its_last_run_has_ended(
    stack: Stack, tmp_path: Path
) -> None:
    """A run that continued as new gets no deletion of its own: its chain is deleted,
    every run of it archived, once its last run has ended and its retention run out."""
    first = await stack.client.start("kept", {})

    async def signal(run_id: str, name: str, n: int) -> None:
        await stack.emit(
            CloudEvent(
                id=f"{name}-{n}",
                source="https://t.example",
                type=name,
                extensions={"runid": run_id},
            )
        )

    await signal(first, "renew", 1)
    state = await stack.run_until(first, lambda s: s.status == "continued", "continued")
    assert state.chain is not None
    assert state.chain.next is not None
    second = state.chain.next
    await stack.run_until(second, lambda s: s.state == "waiting", "started")
    await stack.timers.advance(2 * HOUR)
    assert not await stack.gone(first), "a run that continued is kept while its chain runs"
    assert not stack.timers.knows(retention_timer(first))
    with pytest.raises(RunNotEnded, match="a chain is deleted once its last run has ended"):
        await stack.client.delete(first, await stack.client.read(first), None)
    # A signal to the first run goes on to the second: the chain ends.
    await signal(first, "go", 2)
    await stack.run_until(second, lambda s: s.status == "completed", "completed")
    await stack.retention_scheduled(second)
    await stack.timers.advance(HOUR + 60)
    assert await stack.gone(second)
    assert await stack.gone(first)
    for run_id in (first, second):
        archived = tmp_path / f"{run_id}.jsonl"
        assert await cli(["replay", "--file", str(archived), "--json"]) == 0
    assert [e["run_id"] for e in await stack.audit()] == [first, second]


async def test_a_run_that_has_not_ended_is_never_deleted(stack: Stack) -> None:
    running = await stack.client.start("kept", {})
    client = stack.client
    with pytest.raises(RunNotEnded, match="only an ended run can be deleted"):
        await delete_run(
            client.nc, client.subjects, client.log, running, by="x", reason="", archive=None
        )
    # A retention timer for it (however it came to be) deletes nothing either.
    assert await stack.orchestrator.flow.retainer.due(running) is None  # type: ignore[union-attr]
    assert fold(await client.read(running)).status == "running"
    assert await stack.audit() == []


async def test_interlock_runs_delete(
    stack: Stack, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finished = await stack.ended("defaulted")
    running = await stack.client.start("defaulted", {})
    flags = ["--server", nats_url, "--prefix", stack.client.subjects.prefix]

    assert await cli(["runs", "delete", running, *flags]) == 1
    assert "only an ended run can be deleted" in capsys.readouterr().err
    assert await cli(["runs", "delete", "no-such-run", *flags]) != 0
    assert "no run 'no-such-run'" in capsys.readouterr().err

    out = tmp_path / "out"
    code = await cli(["runs", "delete", finished, "--archive-dir", str(out), "--json", *flags])
    assert code == 0
    said = json.loads(capsys.readouterr().out)
    assert said["run_id"] == finished
    assert said["status"] == "cancelled"
    assert await stack.gone(finished)
    assert await cli(["replay", "--file", str(out / f"{finished}.jsonl")]) == 0
    [entry] = await stack.audit()
    assert entry["by"] == "operator"
    assert not await stack.gone(running)


async def test_a_workflow_without_retention_schedules_no_deletion(
    nats_url: str, subjects: Subjects
) -> None:
    async with clock_orchestrator(nats_url, subjects) as (client, timers, _):
        applied = await client.apply([("plain.yaml", manifest("plain"))])
        assert applied.compiled.ok
        stack = Stack(client, timers)
        finished = await stack.ended("plain")
        await client.wait(finished, 30)
        assert not timers.knows(retention_timer(finished))
        await timers.advance(1000 * HOUR)
        assert not await stack.gone(finished)


def test_retention_and_archive_are_validated_where_they_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(manifest("bad", "  retention: soon\n  archive: {bucket: a, directory: /tmp}\n"))
    assert interlock_main(["validate", str(bad)]) != 0
    said = capsys.readouterr().err
    assert f"{bad}:5:14: bad-duration: 'soon' is not a duration" in said, said
    assert f"{bad}:6:12: archive: archive names exactly one of 'bucket' or 'directory'" in said


async def test_a_deleted_run_leaves_no_marker_for_good(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its index entry's and its snapshot's deletes leave markers that go (after 15
    minutes; 1 s here): kept for good, every run ever deleted, by retention of runs a
    publisher's events start among them, left two messages behind."""
    monkeypatch.setattr(retention, "MARKER_KEPT_S", 1)
    finished = await stack.ended("kept")
    client = stack.client
    await delete_run(
        client.nc, client.subjects, client.log, finished, by="operator", reason="", archive=None
    )
    assert not await stack.indexed(finished)
    js = jetstream(client.nc)
    buckets = (client.subjects.runs_bucket, client.subjects.snapshots_bucket)

    async def no_markers() -> bool:
        for bucket in buckets:
            try:
                await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{finished}")
            except NotFoundError:
                continue
            return False
        return True

    await eventually(no_markers, within=10, what="the deleted run's markers gone")
