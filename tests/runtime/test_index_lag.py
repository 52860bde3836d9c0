"""`interlock runs` reads the run index, written by the relays just behind the run logs: when
it is behind, the list says so and how far, rather than show a run just started or paused as
it was (or not at all) without a word."""

from __future__ import annotations

import asyncio

import pytest

from interlock.transport.subjects import Subjects
from support.runtime import cli_env, client_for, eventually, run_cli, serve, started, yaml

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

WAITS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: waits}
    spec:
      initial_state: wait
      states:
        wait:
          on: [{event: com.example.go, goto: done}]
        done: {type: terminal}
    """
)


async def test_the_run_list_says_how_far_behind_the_index_is(
    nats_url: str, subjects: Subjects
) -> None:
    env = cli_env(nats_url, subjects.prefix)

    async def runs() -> tuple[str, str]:
        done = await asyncio.to_thread(run_cli, "runs", env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr

    orchestrator = serve(nats_url, subjects.prefix)
    try:
        async with client_for(nats_url, subjects) as client:
            assert (await client.apply([("w", WAITS)])).compiled.ok
            await started(orchestrator)
            first = await client.start("waits", {})

            async def indexed() -> bool:
                listed, note = await runs()
                return first in listed and note == ""

            await eventually(indexed, what="the first run listed, and no note")
            # No relay reads the logs now: what is appended waits for the index.
            assert orchestrator.stop() == 0, orchestrator.output
            second = await client.start("waits", {})
            listed, note = await runs()
            assert second not in listed
            assert note == (
                "note: the run index is behind the run logs (1 append not yet in it): a run "
                "started, paused or moved just now may be missing or shown as it was "
                "('interlock describe run RUN_ID' reads its log)\n"
            )
            orchestrator = serve(nats_url, subjects.prefix)
            await started(orchestrator)

            async def caught_up() -> bool:
                listed, note = await runs()
                return second in listed and note == ""

            await eventually(caught_up, what="the second run listed, and no note")
    finally:
        assert orchestrator.stop() == 0, orchestrator.output
