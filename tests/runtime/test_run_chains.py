"""Continue-as-new on a real nats-server: a run continues three times (by a transition,
and by its history limit under ``auto``); ``result``, ``describe`` and the run list follow
the chain; a correlated event and a signal addressed to the first run reach the newest; a
child run that continues still answers its parent; cancelling the first run cancels the
newest."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

import interlock
from interlock import Client
from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, running_stack, yaml

TICKING = yaml(
    """
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: ticking}
    spec:
      inputs:
        order: {type: string, required: true}
        round: {type: integer, default: 1}
      correlate:
        key: "{{ inputs.order }}"
        events: {order.tick: data.order}
      history: {max_records: 20}
      initial_state: waiting
      states:
        waiting:
          on:
            - event: renew
              goto: waiting
              continue_as_new: {inputs: {round: "{{ inputs.round + 1 }}"}}
            - event: order.tick
              goto: waiting
              set: {ticks: "{{ (has(context.ticks) ? context.ticks : 0) + 1 }}"}
            - {event: finish, goto: done}
        done:
          type: terminal
          outputs: {round: "{{ inputs.round }}", ticks: "{{ context.ticks }}"}
    """
)

PARENT = yaml(
    """
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: parent}
    spec:
      initial_state: call
      states:
        call:
          actions:
            - workflow: ticking
              input: {order: "{{ inputs.order }}"}
          on:
            - {event: task.completed, goto: done, set: {got: "{{ result }}"}}
        done:
          type: terminal
          outputs: {child: "{{ context.got }}"}
    """
)


async def _newest(client: Client, run_id: str) -> str:
    """The run of ``run_id``'s chain that is running, once the orchestrator started it."""
    for _ in range(500):
        result = await client.result(run_id)
        if result.status == "running":
            return result.run_id
        await asyncio.sleep(0.02)
    raise AssertionError(f"no run of {run_id}'s chain is running")


async def _tick(client: Client, order: str, n: int) -> None:
    await client.emit(
        CloudEvent(
            id=f"tick-{order}-{n}",
            source="https://shop.example",
            type="order.tick",
            data={"order": order},
        )
    )


async def test_a_run_continues_three_times_and_its_chain_is_followed(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        running_stack(nats_url, subjects, [TICKING]) as stack,
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        first = await client.start("ticking", {"order": "o-1"})
        # 1: a continue_as_new transition, by a signal to the first run.
        told = await client.signal(first, "renew", wait=TIMEOUT)
        assert (told.outcome, told.after) == ("moved", "continued")
        second = told.continued_to
        assert second is not None
        assert await _newest(client, first) == second
        # 2: a signal addressed to the first run goes to the newest.
        told = await client.signal(first, "renew", wait=TIMEOUT)
        assert told.addressed == first
        assert told.run_id == second
        third = told.continued_to
        assert third is not None
        assert await _newest(client, first) == third
        # 3: correlated events, sent to the key, reach the newest run, until its log nears
        # max_records (20) and its next transition continues it by itself.
        n = 0
        while await _newest(client, first) == third:
            n += 1
            await _tick(client, "o-1", n)
            assert n < 20
        fourth = await _newest(client, first)
        records = await stack.records(third)
        last = records[-1]
        assert isinstance(last, ev.RunContinued)
        assert (last.data.run_id, last.data.reason) == (fourth, "history.max_records")
        assert len(records) >= 16
        # The chain is linked both ways.
        started = (await stack.records(fourth))[0]
        assert isinstance(started, ev.RunStarted)
        assert started.data.continued_from is not None
        assert started.data.continued_from.run_id == third
        assert started.data.correlation_key == "o-1"
        described = await client.describe(fourth)
        assert described.chain is not None
        assert (described.chain.previous, described.chain.link) == (third, 3)
        assert described.chain.reason == "history.max_records"
        assert described.history is not None
        assert described.history.max_records == 20
        assert (await client.describe(second)).chain.next == third  # type: ignore[union-attr]
        # The run that continued near its limit is not told to continue as new any more.
        continued = await client.describe(third)
        assert continued.history is not None
        assert continued.history.records >= 16  # past 80% of max_records
        assert continued.history.suggested is False

        # The end: result of the first run follows the chain to it.
        await client.signal(first, "finish", wait=TIMEOUT)
        result = await client.result(first, wait=True, timeout=TIMEOUT)
        assert result.status == "completed"
        assert result.run_id == fourth
        assert result.chain == [first, second, third, fourth]
        assert result.outputs == {"round": 3, "ticks": n}

        # The run list says which run continued as which.
        for _ in range(200):
            listed = {r.run_id: r for r in await client.runs(workflow="ticking")}
            if listed.get(fourth) is not None and listed[fourth].status == "completed":
                break
            await asyncio.sleep(0.02)
        assert listed[first].status == "continued"
        assert listed[first].continued_to == second
        assert listed[second].continued_from == first
        assert [r.run_id for r in await client.runs(status="continued")] != []


async def test_a_child_that_continues_answers_its_parent_and_cancel_follows_the_chain(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        running_stack(nats_url, subjects, [TICKING, PARENT]),
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        parent = await client.start("parent", {"order": "o-2"})
        runs = []
        for _ in range(500):
            runs = await client.runs(workflow="ticking")
            if runs:
                break
            await asyncio.sleep(0.02)
        (child_run,) = runs
        told = await client.signal(child_run.run_id, "renew", wait=TIMEOUT)
        assert told.continued_to is not None
        await _newest(client, child_run.run_id)
        # The parent still waits: the chain has not ended.
        assert (await client.result(parent)).status == "running"
        ticked = await client.signal(child_run.run_id, "order.tick", wait=TIMEOUT)
        assert ticked.outcome == "moved"
        await client.signal(child_run.run_id, "finish", wait=TIMEOUT)
        done = await client.result(parent, wait=True, timeout=TIMEOUT)
        assert done.status == "completed", done
        assert done.outputs == {"child": {"round": 2, "ticks": 1}}

        # Cancelling a run that continued cancels the newest run of its chain.
        other = await client.start("ticking", {"order": "o-3"})
        told = await client.signal(other, "renew", wait=TIMEOUT)
        newest = await _newest(client, other)
        assert newest == told.continued_to
        assert await client.cancel(other, "enough")
        ended = await client.result(other, wait=True, timeout=TIMEOUT)
        assert (ended.run_id, ended.status, ended.reason) == (newest, "cancelled", "enough")
        assert ended.chain == [other, newest]
        assert not await client.cancel(other)

        # A parent cancelled while its child continued: the child's newest run is cancelled.
        for _ in range(500):  # the run list has every run so far
            listed = {r.run_id for r in await client.runs(workflow="ticking")}
            if newest in listed:
                break
            await asyncio.sleep(0.02)
        seen = listed
        parent = await client.start("parent", {"order": "o-4"})
        child_id = ""
        for _ in range(500):
            kids = [r.run_id for r in await client.runs(workflow="ticking") if r.run_id not in seen]
            if kids:
                (child_id,) = kids
                break
            await asyncio.sleep(0.02)
        told = await client.signal(child_id, "renew", wait=TIMEOUT)
        newest_child = await _newest(client, child_id)
        assert newest_child == told.continued_to
        assert await client.cancel(parent, "parent gone")
        gone = await client.result(child_id, wait=True, timeout=TIMEOUT)
        assert (gone.run_id, gone.status) == (newest_child, "cancelled")
        assert gone.reason == "parent cancelled"
        try:
            await client.result("rnosuch", wait=True, timeout=1)
        except interlock.UnknownRun:
            pass
        else:
            raise AssertionError("no such run")


async def test_the_cli_follows_the_chain_and_each_link_replays_from_its_log(
    nats_url: str,
    subjects: Subjects,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``interlock`` as typed (its own event loop, on a thread): signal, result, describe,
    explain, logs, export and replay --file of each run of a chain."""
    (tmp_path / "ticking.yaml").write_text(TICKING)
    monkeypatch.chdir(tmp_path)
    flags = ["--server", nats_url, "--prefix", subjects.prefix]

    async def cli(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(interlock_main, [*args, *flags])
        out = capsys.readouterr()
        return code, out.out, out.err

    def offline(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = interlock_main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    async with running_stack(nats_url, subjects, [TICKING]):
        _, out, _ = await cli("start", "ticking", "--input", '{"order": "o-9"}', "-o", "json")
        first = json.loads(out)["run_id"]
        code, out, err = await cli("signal", first, "renew")
        assert code == 0, err
        assert "continued as new as run n" in out
        code, out, err = await cli("signal", first, "order.tick")
        assert code == 0, err
        assert f"run {first} continued as new: order.tick went to n" in out
        second = out.split("went to ")[1].split(",")[0]
        await cli("signal", first, "finish")
        code, out, err = await cli("result", first, "--wait", "--timeout", "30")
        assert code == 0, err
        assert json.loads(out) == {"round": 2, "ticks": 1}
        assert f"continued as new: {first} -> {second}" in err

        _, out, _ = await cli("describe", "run", second)
        assert f"continues    {first} (run 2 of its chain; transition)" in out
        # Its log's size beside its limits, for people (the JSON keeps the numbers).
        history = re.search(r"^history +(.*)$", out, re.M)
        assert history is not None, out
        assert re.fullmatch(
            r"\d+ records \(\d+\.\d KiB\) of at most 20 records / 256 MiB "
            r"\(continue_as_new: auto\)",
            history[1],
        ), history[1]
        _, out, _ = await cli("describe", "run", second, "-o", "json")
        assert json.loads(out)["history"]["max_bytes"] == 256 * 1024 * 1024
        _, out, _ = await cli("explain", first)
        assert f"continued as new: run {second} goes on from here" in out
        # Explained at its first record, it has not continued yet: that came later.
        _, out, _ = await cli("explain", first, "--at", "1")
        assert f"\nlater, it continued as new: run {second} goes on from its end" in out, out
        _, out, _ = await cli("logs", first)
        assert f"run continued    as {second} in waiting (transition)" in out
        for run_id in (first, second):
            exported = tmp_path / f"{run_id}.jsonl"
            assert (await cli("export", run_id, "-o", str(exported)))[0] == 0
            code, out, err = offline(
                "replay", "--file", str(exported), "--against", "ticking.yaml", "--json"
            )
            assert json.loads(out)["agree"] is True, out
        code, out, err = offline("explain", "--file", str(exported), "--workflow", "ticking.yaml")
        assert f"it continues run {first}" in out, err
        # One run's export says its log is one link of a chain, and how to have them all.
        code, out, err = await cli("export", first)
        assert code == 0, err
        assert f"note: run {first} continued as new as run {second}: this file" in err
        assert f"interlock export {first} --chain -o DIR" in err
        # --chain, named by any run of it: every run, first to newest, each replaying.
        folder = tmp_path / "chain"
        code, out, err = await cli("export", second, "--chain", "-o", str(folder))
        assert code == 0, err
        assert f"wrote the 2 run(s) of the chain to {folder}, first to newest: {first}.jsonl" in err
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f"{first}.jsonl", f"{second}.jsonl"]
        )
        for run_id in (first, second):
            code, out, err = offline(
                "replay", "--file", str(folder / f"{run_id}.jsonl"), "--against", "ticking.yaml"
            )
            assert code == 0, out + err
        assert (folder / f"{second}.jsonl").read_bytes() == exported.read_bytes()
        code, out, err = await cli("export", first, "--chain")
        assert code == 2
        assert "give the folder, -o DIR" in err
