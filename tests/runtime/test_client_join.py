"""A run started from the CLI (on an operator's credential, as ``interlock creds issue``
makes it) over a full limit takes its place in line at once, as an orchestrator's own
starts do: the relay, held up here as behind a flood's records, finds it there when it
reads its ``run.queued``; the runs go in that order, one at a time, each admitted once.
Over HTTP (the gateway's account may not write the slots bucket) a start is unchanged: it
joins when the relay reads it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from interlock.transport.subjects import Subjects
from support.accounts import issued_creds, pooled_subjects, secured_nats_url
from support.concurrency import Gates, gated_stack, limited, timeline
from support.runtime import cli_env, eventually, run_cli

__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects


async def test_runs_started_from_the_cli_join_their_line_before_the_relay_reads_them(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1)
    operator = await issued_creds(nats_url, subjects, "operator")
    assert operator is not None
    env = cli_env(nats_url, subjects.prefix, INTERLOCK_CREDS=str(operator))

    def start(run_id: str, n: int) -> None:
        given = json.dumps({"customer": "acme", "n": n})
        done = run_cli("start", "limited", "--input", given, "--run-id", run_id, env=env)
        assert done.returncode == 0, done

    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        flow = stack.orchestrator.flow
        slots = flow.admission.slots
        await asyncio.to_thread(start, "cj-holder", 0)

        async def holder_at_work() -> bool:
            return gates.started == [0]

        await eventually(holder_at_work, what="the first run at work (its slot was free)")
        # The relay's effect of each run.queued waits from now on: as behind a flood.
        relay_reads, queued = asyncio.Event(), flow._queued

        async def held_up(record: Any) -> None:
            await relay_reads.wait()
            await queued(record)

        flow._queued = held_up  # type: ignore[method-assign]
        for n, run_id in enumerate(("cj-second", "cj-third"), start=1):
            await asyncio.to_thread(start, run_id, n)
        lines = await slots.lines("default/limited#1", "acme")
        assert lines is not None
        assert [h.run_id for h in lines.entry.holders] == ["cj-holder"]
        assert [await lines.place(r, "") for r in ("cj-second", "cj-third")] == [1, 2]
        assert not any(w.early for w in lines.entry.waiting)  # their logs ask already

        relay_reads.set()
        for n in range(3):
            gates.gate(n).set()
        for run_id in ("cj-holder", "cj-second", "cj-third"):
            assert (await stack.wait(run_id)).status == "completed"
        assert gates.started == [0, 1, 2]
        seen = await timeline(stack.client.nc, subjects)
        assert seen.most[("default/limited#1", "acme")] == 1
        for run_id in ("cj-second", "cj-third"):
            assert seen.counts[run_id].get("run.queued") == 1
            assert seen.counts[run_id].get("run.admitted") == 1

        async def emptied() -> bool:
            return await slots.entries() == []

        await eventually(emptied, what="nobody holding or waiting")
