"""Concurrency limits of runs on a real nats-server: a run over its limit waits, recorded in
its log, and starts in order as slots free; whatever ends a run frees its slot; the limit is
never exceeded, as the logs show it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from interlock.core import events as ev
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.subjects import Subjects
from support.concurrency import GATE_AGENT, Gates, gate_worker, gated_stack, limited, timeline
from support.runtime import Stack, cli_env, eventually, run_cli, running_stack, yaml


async def _emptied(stack: Stack) -> None:
    """Until nothing is left holding or waiting: a run's slots are freed in the background
    once its end is appended, so a look right after its end may still find them."""
    slots = stack.orchestrator.flow.admission.slots

    async def empty() -> bool:
        return await slots.entries() == []

    await eventually(empty, what="every slot freed")


async def test_runs_over_the_limit_wait_and_start_in_order_as_slots_free(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=2)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        acme = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(6)]
        beta = await client.start("limited", {"customer": "beta", "n": 100})

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(3), what="two acme runs and the beta run at work")
        await asyncio.sleep(0.3)  # nothing more starts
        assert sorted(gates.started) == [0, 1, 100]

        # The third waits, and its log says for what.
        records = await stack.records(acme[2])
        assert [ev.record_type(r).removeprefix(ev.PREFIX) for r in records] == [
            "run.started",
            "run.queued",
        ]
        queued = records[1]
        assert isinstance(queued, ev.RunQueued)
        assert [(s.limit, s.key, s.size) for s in queued.data.slots] == [
            ("default/limited#1", "acme", 2)
        ]
        # describe says where it stands, as a user reads it.
        env = cli_env(nats_url, subjects.prefix)
        shown = await asyncio.to_thread(run_cli, "describe", "run", acme[4], env=env)
        assert shown.returncode == 0, shown.stderr
        assert "queued       3rd for key acme under default/limited#1 (2/2 running)" in (
            shown.stdout
        ), shown.stdout
        shown = await asyncio.to_thread(run_cli, "describe", "run", acme[0], env=env)
        assert "slot         holds a slot for key acme under default/limited#1" in shown.stdout

        # A failed run frees its slot as a completed one does; runs start in their order.
        gates.fail.add(1)
        gates.gate(1).set()
        await eventually(lambda: started(4), what="the next acme run at work")
        assert gates.started[-1] == 2
        # One slot freed at a time, each taken by the next in line: two freed at once
        # admit two runs in their order, whose tasks may still reach the worker in either.
        for n, count in ((0, 5), (2, 6), (3, 7)):
            gates.gate(n).set()
            await eventually(lambda count=count: started(count), what=f"{count} runs at work")
        for n in (4, 5, 100):
            gates.gate(n).set()
        outcomes = [await stack.wait(r) for r in [*acme, beta]]
        assert [o.status for o in outcomes] == [
            "completed",
            "failed",
            "completed",
            "completed",
            "completed",
            "completed",
            "completed",
        ]
        # (0 and 1, started at once, may reach the worker in either order: checked above.)
        assert gates.started[3:] == [2, 3, 4, 5]

        seen = await timeline(stack.client.nc, subjects)
        assert seen.most[("default/limited#1", "acme")] == 2
        assert seen.most[("default/limited#1", "beta")] == 1
        assert [r for r in seen.admitted if r in acme] == acme
        # Nothing is left holding or waiting.
        await _emptied(stack)


async def test_a_cancelled_run_frees_its_slot_and_a_queued_one_its_place(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1)
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        runs = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(3)]

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first run at work")
        await client.cancel(runs[1], "not wanted")  # waiting: it leaves the line
        await client.cancel(runs[0], "stop")  # holding: its slot goes to the third
        await eventually(lambda: started(2), what="the third run at work")
        assert gates.started == [0, 2]
        gates.gate(2).set()
        assert (await stack.wait(runs[2])).status == "completed"
        assert (await stack.wait(runs[1])).status == "cancelled"
        seen = await timeline(stack.client.nc, subjects)
        assert runs[1] not in seen.admitted
        assert seen.most[("default/limited#1", "acme")] == 1
        await _emptied(stack)


WAITING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: waiting
    spec:
      inputs:
        customer: {type: string, required: true}
      concurrency:
        - {key: inputs.customer, limit: 1}
      initial_state: hold
      states:
        hold:
          type: human_in_the_loop
          on:
            - {event: com.example.go, goto: done}
        done:
          type: terminal
    """
)


async def test_an_event_sent_to_a_queued_run_does_not_start_it(
    nats_url: str, subjects: Subjects
) -> None:
    """A publisher who knows a queued run's id sends it the event its first state waits for,
    addressed to it: the run stays queued (it takes nothing before it holds its slot), and
    the run holding the slot is not disturbed."""
    async with running_stack(nats_url, subjects, [WAITING], worker=False) as stack:
        first = await stack.client.start("waiting", {"customer": "acme"})
        second = await stack.client.start("waiting", {"customer": "acme"})

        async def entered() -> bool:
            return "state.entered" in [
                ev.record_type(r).removeprefix(ev.PREFIX) for r in await stack.records(first)
            ]

        await eventually(entered, what="the first run in its first state")
        for n in range(2):
            event = CloudEvent(
                id=f"go-{n}",
                source="/publisher",
                type="com.example.go",
                datacontenttype="application/json",
                data={},
            )
            headers, payload = encode_binary(event)
            headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
            await stack.js.publish(subjects.inbound(event.type, second), payload, headers=headers)
        await asyncio.sleep(0.5)
        kinds = [ev.record_type(r).removeprefix(ev.PREFIX) for r in await stack.records(second)]
        assert kinds == ["run.started", "run.queued"]
        # The slot's holder ends: the queued run is admitted, and then takes events.
        await stack.client.cancel(first, "done with it")

        async def admitted() -> bool:
            return "run.admitted" in [
                ev.record_type(r).removeprefix(ev.PREFIX) for r in await stack.records(second)
            ]

        await eventually(admitted, what="the second run admitted")
        go = CloudEvent(id="go-late", source="/publisher", type="com.example.go", data={})
        headers, payload = encode_binary(go)
        await stack.js.publish(subjects.inbound(go.type, second), payload, headers=headers)
        assert (await stack.wait(second)).status == "completed"


async def test_runs_wait_in_line_by_priority_then_by_when_they_were_queued(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifest = limited(capability="gate", limit=1).replace(
        "  initial_state: work", "  priority: 'inputs.n % 10'\n  initial_state: work"
    )
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        first = await client.start("limited", {"customer": "acme", "n": 100})

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first run at work")
        # Priorities 1, 5, 1, 9, 5 (n % 10), queued in that order behind the first.
        order = [11, 25, 31, 49, 55]
        waiting = {n: await client.start("limited", {"customer": "acme", "n": n}) for n in order}

        async def all_in_line() -> bool:
            found = await stack.orchestrator.flow.admission.slots.entries()
            return bool(found) and found[0].queued == len(order)

        await eventually(all_in_line, what="every run in line")
        for n in [100, 49, 25, 55, 11, 31]:
            gates.gate(n).set()
        for run_id in [first, *waiting.values()]:
            assert (await stack.wait(run_id)).status == "completed"
        assert gates.started == [100, 49, 25, 55, 11, 31]


async def test_a_scope_shares_one_limit_and_on_limit_skips_or_cancels_the_oldest(
    nats_url: str, subjects: Subjects
) -> None:
    """Two workflows naming scope `vendor` share its slot; `skip` ends a run that finds the
    limit full (cancelled, saying why), `cancel-oldest` cancels the holder to make room."""
    gates = Gates()
    first = limited("first", capability="gate", limit=1, scope="vendor")
    second = limited("second", capability="gate", limit=1, scope="vendor", on_limit="skip")
    newest = limited("newest", capability="gate", limit=1, on_limit="cancel-oldest")
    async with (
        running_stack(
            nats_url, subjects, [GATE_AGENT, first, second, newest], worker=False
        ) as stack,
        gate_worker(nats_url, subjects, gates),
    ):
        client = stack.client

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        holder = await client.start("first", {"customer": "acme", "n": 1})
        await eventually(lambda: started(1), what="the first workflow's run at work")
        skipped = await client.start("second", {"customer": "acme", "n": 2})
        outcome = await stack.wait(skipped)
        assert outcome.status == "cancelled"
        records = await stack.records(skipped)
        end = records[-1]
        assert isinstance(end, ev.RunCancelled)
        assert end.data.reason == (
            "skipped: concurrency limit default/vendor is full for key 'acme'"
        )

        async def listed() -> list[dict[str, Any]] | None:
            env = cli_env(nats_url, subjects.prefix)
            shown = await asyncio.to_thread(
                run_cli, "runs", "--workflow", "second", "-o", "json", env=env
            )
            return [r for r in json.loads(shown.stdout) if r["run_id"] == skipped] or None

        # Listed as what it is: cancelled, waiting for no slot any more.
        (row,) = await eventually(listed, what="the skipped run in the run list")
        assert (row["status"], row["waiting"]) == ("cancelled", [])
        other_key = await client.start("second", {"customer": "beta", "n": 3})
        await eventually(lambda: started(2), what="another key's run at work")
        gates.gate(1).set()
        gates.gate(3).set()
        assert (await stack.wait(holder)).status == "completed"
        assert (await stack.wait(other_key)).status == "completed"

        old = await client.start("newest", {"customer": "acme", "n": 4})
        await eventually(lambda: started(3), what="the oldest run at work")
        new = await client.start("newest", {"customer": "acme", "n": 5})
        assert (await stack.wait(old)).status == "cancelled"
        await eventually(lambda: started(4), what="the newest run at work")
        gates.gate(5).set()
        assert (await stack.wait(new)).status == "completed"
        reason = (await stack.records(old))[-1]
        assert isinstance(reason, ev.RunCancelled)
        assert reason.data.reason.startswith(
            "cancelled to make room under concurrency limit default/newest#1 (key 'acme')"
        )
        seen = await timeline(stack.client.nc, subjects)
        assert seen.most == {
            ("default/vendor", "acme"): 1,
            ("default/vendor", "beta"): 1,
            ("default/newest#1", "acme"): 1,
        }
        await _emptied(stack)


async def test_fair_share_serves_the_keys_of_one_limit_in_turn(
    nats_url: str, subjects: Subjects
) -> None:
    """One slot shared by every customer (key "all"), fair by customer: acme's six runs
    queued first do not hold beta's two back; the customers take turns."""
    gates = Gates()
    manifest = limited(capability="gate", limit=1).replace(
        "key: inputs.customer", "key: '\"all\"'\n      fair: inputs.customer"
    )
    async with gated_stack(nats_url, subjects, gates, manifest) as stack:
        client = stack.client
        first = await client.start("limited", {"customer": "zed", "n": 100})

        async def started(count: int) -> bool:
            return len(gates.started) >= count

        await eventually(lambda: started(1), what="the first run at work")
        runs = [await client.start("limited", {"customer": "acme", "n": n}) for n in range(1, 7)]
        runs += [await client.start("limited", {"customer": "beta", "n": n}) for n in (11, 12)]

        async def all_in_line() -> bool:
            found = await stack.orchestrator.flow.admission.slots.entries()
            return bool(found) and found[0].queued == len(runs)

        await eventually(all_in_line, what="every run in line")
        for n in [100, 1, 2, 3, 4, 5, 6, 11, 12]:
            gates.gate(n).set()
        for run_id in [first, *runs]:
            assert (await stack.wait(run_id)).status == "completed"
        assert gates.started == [100, 1, 11, 2, 12, 3, 4, 5, 6]
