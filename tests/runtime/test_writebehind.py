"""The write-behind writes a finished run's index entry at the next flush, a running run's
once it has been held, what is left when it stops, and acknowledges their messages after."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client
from test_runindex_writes import fast, record

from interlock.core import events as ev
from interlock.runtime.runindex import RunIndex
from interlock.runtime.writebehind import WriteBehind
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

__all__ = ["fast"]  # the fixture, shared with test_runindex_writes

WAIT = 20.0
"""Seconds a test waits for what must happen (far more than it takes)."""


def _running(run_id: str) -> list[Any]:
    return [
        record(ev.RunStarted, run_id, 1, ev.RunStartedData(workflow="wf", spec_hash="h")),
        record(ev.StateEntered, run_id, 2, ev.StateEnteredData(state="a")),
        record(
            ev.ActionRequested,
            run_id,
            3,
            ev.ActionRequestedData(action_id=f"{run_id}:3", state="a", index=0, capability="c"),
        ),
    ]


def _finished(run_id: str) -> list[Any]:
    return [
        record(ev.RunStarted, run_id, 1, ev.RunStartedData(workflow="wf", spec_hash="h")),
        record(ev.StateEntered, run_id, 2, ev.StateEnteredData(state="a")),
        record(ev.RunCompleted, run_id, 3, ev.RunCompletedData(state="a")),
    ]


async def test_entries_are_written_when_due_and_their_messages_acknowledged_after(
    fast: Client, subjects: Subjects
) -> None:
    js = jetstream(fast)
    index = RunIndex(fast, subjects)
    await index.start()
    runs = ["held", "ends", "ends-too", "left"]
    for run_id in runs:
        await js.publish(subjects.run(run_id), b"-")
    sub = await js.pull_subscribe(subjects.runs_all, "wb", stream=subjects.runs_stream)
    msgs = {m.subject.rsplit(".", 1)[1]: m for m in await sub.fetch(len(runs), timeout=WAIT)}
    assert set(msgs) == set(runs)

    reported: asyncio.Queue[tuple[str, list[Any]]] = asyncio.Queue()
    behind = WriteBehind(
        index, lambda run_id, records: reported.put_nowait((run_id, records)), hold=2.0
    )

    async def next_report() -> tuple[str, list[Any]]:
        return await asyncio.wait_for(reported.get(), WAIT)

    behind.add("held", _running("held"), _running("held"), [msgs["held"]])
    behind.add("ends", _finished("ends"), _finished("ends"), [msgs["ends"]])
    assert (await next_report()) == ("ends", _finished("ends"))
    assert behind.holds("held")  # a running run waits its hold (two seconds)
    # The flush loop, done with one flush, waits for the next one.
    behind.add("ends-too", _finished("ends-too"), _finished("ends-too"), [msgs["ends-too"]])
    assert (await next_report())[0] == "ends-too"
    assert (await next_report()) == ("held", _running("held"))
    assert behind.holding == 0
    behind.add("left", _running("left"), _running("left"), [msgs["left"]])
    await behind.stop()  # writes what it holds
    assert (await next_report())[0] == "left"

    kv = await js.key_value(subjects.runs_bucket)
    entries = {run_id: json.loads((await kv.get(run_id)).value or b"{}") for run_id in runs}
    assert {run_id: (e["status"], e["state"]) for run_id, e in entries.items()} == {
        "held": ("running", "a"),
        "ends": ("completed", "a"),
        "ends-too": ("completed", "a"),
        "left": ("running", "a"),
    }
    await fast.flush()  # the server has what this connection sent: the acknowledgements
    assert (await js.consumer_info(subjects.runs_stream, "wb")).num_ack_pending == 0


async def test_a_flush_lets_other_work_run_between_its_runs(
    fast: Client, subjects: Subjects
) -> None:
    """A flush of many runs reports them one turn of the event loop at a time: what
    became due meanwhile (a message of a run's next step) runs between them, not after
    the whole flush."""
    js = jetstream(fast)
    index = RunIndex(fast, subjects)
    await index.start()
    runs = [f"many-{n}" for n in range(5)]
    for run_id in runs:
        await js.publish(subjects.run(run_id), b"-")
    sub = await js.pull_subscribe(subjects.runs_all, "wb-many", stream=subjects.runs_stream)
    msgs = {m.subject.rsplit(".", 1)[1]: m for m in await sub.fetch(len(runs), timeout=WAIT)}
    reported: list[str] = []
    seen_by_other_work: list[int] = []
    loop = asyncio.get_running_loop()

    def report(run_id: str, records: list[Any]) -> None:
        reported.append(run_id)
        if len(reported) == 1:  # something else becomes due as the first is reported
            loop.call_soon(lambda: seen_by_other_work.append(len(reported)))

    behind = WriteBehind(index, report, hold=60.0)
    for run_id in runs:
        behind.add(run_id, _finished(run_id), _finished(run_id), [msgs[run_id]])
    await behind.flush(everything=True)

    assert sorted(reported) == runs
    assert len(seen_by_other_work) == 1
    assert seen_by_other_work[0] < len(runs)  # it ran before the flush was done
    await behind.stop()
