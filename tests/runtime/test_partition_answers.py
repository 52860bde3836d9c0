"""Answers by request after a live partition change: one replica, the holder of the run's
partition, takes each; an answer decided twice is no dead letter."""

from __future__ import annotations

import asyncio

import nats
from nats.aio.msg import Msg

from interlock.core import events as ev
from interlock.runtime.service import Orchestrator
from interlock.transport import tasks
from interlock.transport.partitions import read_map
from interlock.transport.subjects import Subjects
from support.runtime import TWO_ECHOES, cli_env, connect, run_cli, running_stack


async def test_after_two_live_changes_each_answer_is_taken_once_and_none_dead_lettered(
    nats_url: str, subjects: Subjects
) -> None:
    env = cli_env(nats_url, subjects.prefix)
    async with running_stack(nats_url, subjects, [TWO_ECHOES]) as stack:
        other = Orchestrator(await connect(nats_url), subjects)
        await other.start()
        # What the agent sent by request, to send one again later.
        sent: list[Msg] = []
        spy = await nats.connect(nats_url)

        async def keep(msg: Msg) -> None:
            sent.append(msg)

        await spy.subscribe(f"{subjects.prefix}.answer.>", cb=keep)
        try:
            for count in ("2", "3"):
                done = run_cli("partitions", "set", count, env=env)
                assert done.returncode == 0, done.stderr
            replicas = (stack.orchestrator.relay, other.relay)
            for _ in range(80):  # both replicas see the three layouts and share the three
                held = [set(r.ownership.held) for r in replicas]
                seen = all(len(r.run_log.placement.map.layouts) == 3 for r in replicas)
                if seen and held[0] | held[1] == {0, 1, 2} and all(held):
                    break
                await asyncio.sleep(0.25)
            else:
                raise AssertionError(f"the replicas did not share the partitions: {held}")
            runs = [await stack.client.start("two-steps", {}) for _ in range(12)]
            for run_id in runs:
                assert (await stack.wait(run_id)).outputs == {"step": 2}
            listed = run_cli("dead-letters", "list", env=env)
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout.strip() == "no dead letters", listed.stdout
            for run_id in runs:
                completed = [
                    r for r in await stack.records(run_id) if isinstance(r, ev.ActionCompleted)
                ]
                assert len(completed) == 2, run_id
            # The agent sends an answer it sent already (its reply was lost): taken already,
            # so recorded, and no dead letter.
            first = next(m for m in sent if m.subject.endswith(runs[0]))
            again = await spy.request(
                first.subject, first.data, timeout=5, headers=dict(first.headers or {})
            )
            assert (again.headers or {}).get(tasks.ANSWER_HEADER) == tasks.ANSWER_RECORDED
            listed = run_cli("dead-letters", "list", env=env)
            assert listed.stdout.strip() == "no dead letters", listed.stdout
            map_, _ = await read_map(stack.client.nc, subjects)
            assert [x.count for x in map_.layouts] == [1, 2, 3]
        finally:
            await spy.close()
            await other.stop()
            await other.nc.close()
