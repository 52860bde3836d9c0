"""``interlock signal`` as a user types it: a human approval from the command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import nats

from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.service import Orchestrator
from interlock.sdk.runner import load_worker
from interlock.transport.subjects import Subjects

REPO = Path(__file__).resolve().parents[2]
INTERLOCK = str(Path(sys.executable).with_name("interlock"))


def cli(args: list[str], url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INTERLOCK_URL": url, "INTERLOCK_PREFIX": prefix}
    return subprocess.run(
        [INTERLOCK, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def test_signal_approves_a_parked_run(nats_url: str, subjects: Subjects) -> None:
    nc = await nats.connect(nats_url)
    orchestrator = Orchestrator(nc, subjects)
    await orchestrator.start()
    worker = load_worker("echo")
    task = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
    client = InterlockClient(await nats.connect(nats_url), subjects)
    try:
        sources = [
            (str(p), p.read_text())
            for p in (
                REPO / "examples" / "code-review.yaml",
                REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml",
            )
        ]
        assert (await client.apply(sources)).compiled.ok
        run_id = await client.start("code-review", {"repository": "acme/app", "pr": 7, "score": 9})
        async for record in client.follow(run_id):
            if isinstance(record, ev.StateEntered) and record.data.state == "approval":
                break
        done = await asyncio.to_thread(
            cli,
            ["signal", run_id, "approval.granted", "--data", '{"approver": "alice"}'],
            nats_url,
            subjects.prefix,
        )
        assert done.returncode == 0, done.stderr
        assert f"approval.granted moved run {run_id} from approval to" in done.stdout
        state = await client.wait(run_id, 20)
        assert state.status == "completed"
        assert state.outputs is not None
        assert state.outputs["approver"] == "alice"
        again = await asyncio.to_thread(
            cli, ["signal", run_id, "approval.granted"], nats_url, subjects.prefix
        )
        assert again.returncode == 1
        assert "already completed" in again.stderr
        twice = await asyncio.to_thread(
            cli,
            [
                "start",
                "code-review",
                "--run-id",
                run_id,
                "--input",
                '{"repository": "a/b", "pr": 1}',
            ],
            nats_url,
            subjects.prefix,
        )
        assert twice.returncode == 1
        assert "exists already" in twice.stderr
    finally:
        await worker.stop(force=True)
        await asyncio.wait_for(task, 10)
        await orchestrator.stop()
        await nc.close()
        await client.nc.close()
