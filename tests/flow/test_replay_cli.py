"""``interlock fork``, ``migrate``, ``explain``, ``replay --against`` and ``shadow`` as a
user types them, against a real nats-server with an orchestrator and the echo agent.

Forks and migrations must continue and complete runs, and must leave the logs they read
unchanged, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from interlock import Client
from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.service import Orchestrator
from interlock.sdk.runner import load_worker
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects

REPO = Path(__file__).resolve().parents[2]
INTERLOCK = str(Path(sys.executable).with_name("interlock"))
WORKFLOW = REPO / "examples" / "code-review.yaml"
ECHO = REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml"
WAIT = 30.0


def cli(args: list[str], url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INTERLOCK_URL": url, "INTERLOCK_PREFIX": prefix}
    return subprocess.run(
        [INTERLOCK, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def run_cli(
    args: list[str], url: str, subjects: Subjects
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, args, url, subjects.prefix)


@contextlib.asynccontextmanager
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[InterlockClient]:
    """An orchestrator, the echo agent and a client; code-review and echo applied."""
    nc = await nats.connect(nats_url)
    orchestrator = Orchestrator(nc, subjects)
    await orchestrator.start()
    worker = load_worker("echo")
    task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
    client = InterlockClient(await nats.connect(nats_url), subjects)
    try:
        sources = [(str(p), p.read_text()) for p in (WORKFLOW, ECHO)]
        assert (await client.apply(sources)).compiled.ok
        yield client
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await orchestrator.stop()
        await client.nc.close()
        await nc.close()


async def raw(client: InterlockClient, run_id: str) -> list[tuple[int, bytes]]:
    return await client.log.read_raw(run_id)


async def until_state(client: InterlockClient, run_id: str, name: str) -> None:
    async def wait() -> None:
        async for record in client.follow(run_id):
            if isinstance(record, ev.StateEntered) and record.data.state == name:
                return

    await asyncio.wait_for(wait(), WAIT)


def variant(tmp_path: Path, name: str, *changes: tuple[str, str]) -> Path:
    text = WORKFLOW.read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


async def test_a_finished_run_forked_onto_a_fix_completes_and_the_original_is_untouched(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    async with stack(nats_url, subjects) as client:
        # Score 1: three fixes, then rejected.
        origin = await client.start("code-review", {"repository": "acme/app", "pr": 1, "score": 1})
        done = await client.wait(origin, WAIT)
        assert done.outputs is not None
        assert done.outputs["reason"] == "score 7 after 3 fixes"
        before = await raw(client, origin)
        # The fix: one fix is enough to give up.
        fixed = variant(
            tmp_path, "one-fix.yaml", ("guard: context.fixes < 3", "guard: context.fixes < 1")
        )
        forked = await run_cli(
            [
                "fork",
                origin,
                "--at",
                "4",
                "--workflow",
                str(fixed),
                "--run-id",
                "r-forked",
                "--json",
            ],
            nats_url,
            subjects,
        )
        assert forked.returncode == 0, forked.stderr
        report = json.loads(forked.stdout)
        assert report["origin"] == {"run_id": origin, "seq": 4}
        assert report["version"] == 2
        assert report["state"] == "review"
        state = await client.wait("r-forked", WAIT)
        assert state.status == "completed"
        assert state.outputs is not None
        assert state.outputs["reason"] == "score 3 after 1 fixes"
        assert state.version == 2
        records = await client.read("r-forked")
        original = await client.read(origin)
        # Its log begins with the original's first four records, as its own.
        for copy, source in zip(records[:4], original[:4], strict=True):
            assert copy.subject == "r-forked"
            assert copy.time == source.time
            assert ev.record_type(copy) == ev.record_type(source)
        marker = records[4]
        assert isinstance(marker, ev.RunForked)
        assert (marker.data.origin_run_id, marker.data.origin_seq) == (origin, 4)
        # The original: not one byte changed.
        assert await raw(client, origin) == before
        # The relay indexes the fork (behind the run: within about two seconds).
        deadline = asyncio.get_running_loop().time() + WAIT
        while True:
            listed = {r["run_id"]: r for r in await client.list_runs("code-review")}
            if "r-forked" in listed or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        started = original[0].time
        assert listed["r-forked"]["forked_from"] == {
            "run_id": origin,
            "seq": 4,
            "started_at": started,
        }
        # Listed by its own start (when it was forked), its origin's start in describe.
        assert listed["r-forked"]["started_at"] == marker.time > started
        runs = await run_cli(["runs", "--workflow", "code-review"], nats_url, subjects)
        (line,) = [x for x in runs.stdout.splitlines() if x.startswith("r-forked ")]
        assert line.endswith(marker.time), runs.stdout
        got = await run_cli(["get", "run", "r-forked", "-o", "json"], nats_url, subjects)
        assert json.loads(got.stdout)["started_at"] == marker.time
        described = await run_cli(["describe", "run", "r-forked"], nats_url, subjects)
        assert f"started      {marker.time}\n" in described.stdout
        assert f"forked from  {origin} at record 4, which started {started}\n" in described.stdout
        # Forking again onto the same id is refused; so is a cut in mid-decision.
        again = await run_cli(
            ["fork", origin, "--at", "4", "--run-id", "r-forked"], nats_url, subjects
        )
        assert again.returncode == 1
        assert "exists already" in again.stderr
        # A preview without --run-id says the fork it previews gets an id of its own.
        preview = await run_cli(["fork", origin, "--at", "4", "--dry-run"], nats_url, subjects)
        assert preview.returncode == 0, preview.stderr
        assert f"would fork {origin} at record 4 as a new run (r" in preview.stdout
        assert "in this preview; --run-id NEW names it)" in preview.stdout
        middle = await run_cli(["fork", origin, "--at", "6"], nats_url, subjects)
        assert middle.returncode == 1
        assert "middle of a decision" in middle.stderr
        assert await raw(client, origin) == before


async def approve(client: InterlockClient, run_id: str, approver: str) -> None:
    await client.emit(
        CloudEvent(
            id=f"approve-{run_id}",
            source="https://review.example.com",
            type="approval.granted",
            datacontenttype="application/json",
            data={"approver": approver},
            extensions={"runid": run_id},
        )
    )


async def test_migrate_moves_the_runs_that_agree_and_they_complete_on_the_new_version(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    async with stack(nats_url, subjects) as client:
        high = await client.start("code-review", {"repository": "acme/app", "pr": 2, "score": 9})
        low = await client.start("code-review", {"repository": "acme/app", "pr": 3, "score": 6})
        await until_state(client, high, "approval")
        await until_state(client, low, "approval")
        # Version 2 passes a 6 (the low run went through a fix for it) and merges with
        # another message.
        candidate = variant(
            tmp_path,
            "v2.yaml",
            ("guard: result.score > 7", "guard: result.score > 5"),
            ('message: "Merging ', 'message: "v2 merging '),
        )
        # Checked against the recorded runs before it is applied.
        shadow = await run_cli(
            ["shadow", "code-review", "--candidate", str(candidate), "--json"], nats_url, subjects
        )
        assert shadow.returncode == 1, shadow.stderr
        summary = json.loads(shadow.stdout)
        assert (summary["runs"], summary["agree"]) == (2, 1)
        (group,) = summary["groups"]
        assert group["kind"] == "guard"
        assert group["runs"] == [low]
        assert (await client.apply([(str(candidate), candidate.read_text())])).compiled.ok
        high_before, low_before = await raw(client, high), await raw(client, low)

        dry = await run_cli(
            ["migrate", "code-review", "--to", "2", "--dry-run", "--json"], nats_url, subjects
        )
        assert dry.returncode == 1, dry.stderr
        plan = json.loads(dry.stdout)
        assert [r["run_id"] for r in plan["moved"]] == [high]
        assert [r["run_id"] for r in plan["stayed"]] == [low]
        assert plan["stayed"][0]["divergence"]["kind"] == "guard"
        assert await raw(client, high) == high_before

        moved = await run_cli(["migrate", "code-review", "--to", "2"], nats_url, subjects)
        assert moved.returncode == 1, moved.stderr
        assert f"moved: {high} (v1, in approval)" in moved.stdout
        assert f"stays: {low} (v1): its log diverges from version 2" in moved.stdout
        assert await raw(client, low) == low_before
        after = await raw(client, high)
        assert after[: len(high_before)] == high_before
        (migrated,) = ev.decode_batch(after[-1][1])
        assert isinstance(migrated, ev.RunMigrated)
        assert (migrated.data.from_version, migrated.data.version) == (1, 2)

        # What would move the migrated run now, asked of the server.
        explained = await run_cli(["explain", high, "--json"], nats_url, subjects)
        assert explained.returncode == 0, explained.stderr
        explanation = json.loads(explained.stdout)
        assert explanation["reproduces"] is True
        waiting = explanation["waiting"]
        assert waiting["state"] == "approval"
        assert waiting["events"][0]["type"] == "approval.granted"

        await approve(client, high, "alice")
        await approve(client, low, "bob")
        high_state = await client.wait(high, WAIT)
        low_state = await client.wait(low, WAIT)
        assert high_state.outputs is not None
        assert low_state.outputs is not None
        assert high_state.outputs["message"].startswith("v2 merging acme/app#2")
        assert low_state.outputs["message"].startswith("Merging acme/app#3")
        # Each run's log replays against the version it ended on.
        agree = await run_cli(["replay", high, "--against", "2"], nats_url, subjects)
        assert agree.returncode == 0, agree.stdout + agree.stderr
        differ = await run_cli(["replay", low, "--against", "2", "--json"], nats_url, subjects)
        assert differ.returncode == 1
        assert json.loads(differ.stdout)["divergence"]["kind"] == "guard"


async def test_the_client_offers_the_same_reports(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    async with stack(nats_url, subjects) as ops:
        client = Client(await nats.connect(nats_url), subjects, owns_connection=True)
        try:
            origin = await client.start(
                "code-review", {"repository": "acme/app", "pr": 4, "score": 1}
            )
            await ops.wait(origin, WAIT)
            before = await raw(ops, origin)
            explained = await client.explain(origin, at=5)
            assert explained["steps"][0]["checks"][0]["reads"] == {"result.score": 1}
            assert (await client.replay(origin, 1))["agree"] is True
            fixed = variant(
                tmp_path, "one-fix.yaml", ("guard: context.fixes < 3", "guard: context.fixes < 1")
            )
            shadow = await client.shadow("code-review", fixed)
            assert (shadow["runs"], shadow["agree"]) == (1, 0)
            assert shadow["groups"][0]["kind"] == "guard"
            # since: an age or an RFC 3339 time compared as a moment, never as text.
            assert (await client.shadow("code-review", fixed, since="1h"))["runs"] == 1
            assert (await client.shadow("code-review", fixed, since="1ms"))["runs"] == 0
            later = await client.shadow("code-review", fixed, since="2999-01-01T00:00:00+02:00")
            assert later["runs"] == 0
            with pytest.raises(ValueError, match="'yesterday': give an RFC 3339 time"):
                await client.shadow("code-review", fixed, since="yesterday")
            (applied,) = [a for a in await client.apply([fixed]) if a.kind == "Workflow"]
            forked = await client.fork(origin, 4, version=applied.version, fork_id="r-client-fork")
            state = await ops.wait(forked, WAIT)
            assert state.outputs is not None
            assert state.outputs["reason"] == "score 3 after 1 fixes"
            plan = await client.migrate("code-review", applied.version, dry_run=True)
            assert plan["moved"] == []
            assert plan["stayed"] == []  # nothing is running
            assert await raw(ops, origin) == before
        finally:
            await client.close()
