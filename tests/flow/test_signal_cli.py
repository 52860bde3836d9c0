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


GATEKEEP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: gatekeep}
spec:
  initial_state: approval
  states:
    approval:
      type: human_in_the_loop
      on:
        - event: approval.granted
          guard: 'data.approver in ["alice", "bob"]'
          goto: merge
          set: {approver: "{{ data.approver }}"}
        - event: approval.granted
          guard: 'data.level > 2'
          goto: merge
    merge:
      actions:
        - capability: echo
          input: {message: "{{ context.approver.name }}"}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
"""


async def test_signal_says_why_it_was_declined_and_that_the_run_then_failed(
    nats_url: str, subjects: Subjects
) -> None:
    nc = await nats.connect(nats_url)
    orchestrator = Orchestrator(nc, subjects)
    await orchestrator.start()
    client = InterlockClient(await nats.connect(nats_url), subjects)
    try:
        echo = REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml"
        sources = [("gatekeep.yaml", GATEKEEP), (str(echo), echo.read_text())]
        assert (await client.apply(sources)).compiled.ok
        run_id = await client.start("gatekeep", {})
        async for record in client.follow(run_id):
            if isinstance(record, ev.StateEntered) and record.data.state == "approval":
                break

        async def signal(data: str) -> subprocess.CompletedProcess[str]:
            args = ["signal", run_id, "approval.granted", "--data", data]
            return await asyncio.to_thread(cli, args, nats_url, subjects.prefix)

        declined = await signal('{"approver": "carol"}')
        assert declined.returncode == 1
        lines = declined.stderr.splitlines()
        assert lines[0] == (
            f"run {run_id} took approval.granted in state approval, but no guard was true: it stays"
        )
        assert lines[1] == (
            '  on[0] approval.granted -> merge: `data.approver in ["alice", "bob"]` was false'
        )
        assert lines[2].startswith("  on[1] approval.granted -> merge: `data.level > 2` failed: ")
        assert len(lines) == 3

        failed = await signal('{"approver": "alice"}')
        assert failed.returncode == 1, failed.stderr
        assert failed.stdout == ""
        assert failed.stderr == (
            f"approval.granted moved run {run_id} from approval to merge and failed: "
            "expression_error: input of action 0 in state 'merge': field selection on a "
            "string ('alice'): a string has no fields\n"
        ), failed.stderr
        as_json = await asyncio.to_thread(
            cli,
            ["signal", run_id, "approval.granted", "-o", "json"],
            nats_url,
            subjects.prefix,
        )
        assert '"outcome": "finished"' in as_json.stdout
    finally:
        await orchestrator.stop()
        await nc.close()
        await client.nc.close()
