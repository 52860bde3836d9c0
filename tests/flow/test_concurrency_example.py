"""examples/concurrency.yaml as its header tells a new user to try it, through the CLI with
the operator's credential: two deploys to one environment, the second queued until the
first ends; another environment's goes on; an event of the trigger starts one more. (The
steps the CLI is not asked about go through the client: each CLI call starts Python.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

from interlock import Client
from interlock.client.queues import list_queues
from interlock.core import events as ev
from interlock.transport.subjects import Subjects
from support.runtime import cli, cli_env, eventually, run_cli, running_stack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "concurrency.yaml"


async def test_the_concurrency_example_runs_one_deploy_per_environment(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        running_stack(nats_url, subjects, [EXAMPLE.read_text()]) as stack,
        await Client.connect(nats_url, prefix=subjects.prefix) as signals,
    ):
        client = stack.client

        async def run(*args: str) -> str:
            return await cli(nats_url, subjects, *args)

        async def in_state(run_id: str, state: str) -> bool:
            return any(
                isinstance(r, ev.StateEntered) and r.data.state == state
                for r in await stack.records(run_id)
            )

        await client.start("deploy", {"env": "prod", "version": "d1"}, run_id="d1")
        await client.start("deploy", {"env": "staging", "version": "s1"}, run_id="s1")
        await eventually(lambda: in_state("d1", "verify"), what="d1 waits to be verified")
        await client.start("deploy", {"env": "prod", "version": "d2"}, run_id="d2")

        async def d2_queued() -> bool:
            return any(q.key == "prod" and q.queued == 1 for q in await list_queues(client))

        await eventually(d2_queued, what="d2 queued behind d1")
        await eventually(lambda: in_state("s1", "verify"), what="s1 waits to be verified")
        shown = [line.split()[:4] for line in (await run("queues")).splitlines()[1:]]
        assert shown == [
            ["default/deploy#1", "prod", "1/1", "1"],
            ["default/deploy#1", "staging", "1/1", "0"],
            ["default/deploys", "all", "2/3", "0"],
        ]
        # Its result is not there yet, and says where the run is: in line, in no state.
        waited = await asyncio.to_thread(
            run_cli, "result", "d2", env=cli_env(nats_url, subjects.prefix)
        )
        assert waited.returncode == 3
        assert waited.stderr == (
            "run d2 is running (queued, in no state yet: interlock describe run d2 says for what)\n"
        )
        described = await run("describe", "run", "d2")
        assert "queued       1st for key prod under default/deploy#1 (1/1 running)" in described
        assert "\nstate        - (none yet: it is queued)\n" in described

        said = await run("signal", "d1", "deploy.verified")
        assert said.startswith("deploy.verified moved run d1 from verify to done and completed")
        await eventually(lambda: in_state("d2", "verify"), what="d2 admitted once d1 ended")
        said = await run(
            "emit",
            "com.example.release",
            "--source",
            "https://ci.example",
            "--data",
            '{"env": "staging", "version": "r1"}',
        )
        (started,) = [line.split()[1] for line in said.splitlines() if line.startswith("started")]
        for run_id in ("d2", "s1"):
            assert (await signals.signal(run_id, "deploy.verified")).outcome == "moved"
        await eventually(lambda: in_state(started, "verify"), what="the released run admitted")
        assert (await signals.signal(started, "deploy.verified")).outcome == "moved"
        outcomes = {r: await stack.wait(r) for r in ("d1", "d2", "s1", started)}
        assert {r: (o.status, o.outputs["version"]) for r, o in outcomes.items()} == {
            "d1": ("completed", "d1"),
            "d2": ("completed", "d2"),
            "s1": ("completed", "s1"),
            started: ("completed", "r1"),
        }
