"""The write-behind writes a finished run's index entry at the next flush, a running run's
once it has been held, what is left when it stops, and acknowledges their messages after."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings
from typing import Any

from nats.aio.client import Client
from test_runindex_writes import fast, record

from interlock.core import events as ev
from interlock.runtime.runindex import RunIndex
from interlock.runtime.writebehind import SLICE, WriteBehind
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects
from support.runtime import eventually

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


async def _delivered(
    fast: Client, subjects: Subjects, runs: list[str], durable: str
) -> tuple[RunIndex, dict[str, Any]]:
    """A started run index, and one delivered (unacknowledged) message per run."""
    js = jetstream(fast)
    index = RunIndex(fast, subjects)
    await index.start()
    for run_id in runs:
        await js.publish(subjects.run(run_id), b"-")
    sub = await js.pull_subscribe(subjects.runs_all, durable, stream=subjects.runs_stream)
    msgs: dict[str, Any] = {}
    while len(msgs) < len(runs):
        for m in await sub.fetch(len(runs) - len(msgs), timeout=WAIT):
            msgs[m.subject.rsplit(".", 1)[1]] = m
    return index, msgs


async def test_entries_are_written_when_due_and_their_messages_acknowledged_after(
    fast: Client, subjects: Subjects
) -> None:
    js = jetstream(fast)
    runs = ["held", "ends", "ends-too", "left"]
    index, msgs = await _delivered(fast, subjects, runs, "wb")

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
    await _all_acked(js, subjects, "wb")


async def test_a_flush_lets_other_work_run_between_its_runs(
    fast: Client, subjects: Subjects
) -> None:
    """A flush that has worked its slice lets the event loop run: what became due
    meanwhile (a message of a run's next step) runs between its reports, not after the
    whole flush (each report here takes longer than a slice)."""
    runs = [f"many-{n}" for n in range(5)]
    index, msgs = await _delivered(fast, subjects, runs, "wb-many")
    reported: list[str] = []
    seen_by_other_work: list[int] = []
    loop = asyncio.get_running_loop()

    def report(run_id: str, records: list[Any]) -> None:
        reported.append(run_id)
        time.sleep(2 * SLICE)
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


async def test_a_flush_keeps_up_with_a_busy_event_loop(fast: Client, subjects: Subjects) -> None:
    """Under load every turn of the event loop takes milliseconds; a flush still gets
    through its runs in a few turns, not one or two per run (a flush that slow fell
    behind the runs coming in, and held their messages past their acknowledgement
    wait: every one came again)."""
    js = jetstream(fast)
    runs = [f"busy-{n}" for n in range(300)]
    index, msgs = await _delivered(fast, subjects, runs, "wb-busy")
    loop = asyncio.get_running_loop()
    turns = 0
    busy = True

    def other_work() -> None:  # a turn of the loop that takes 5 ms, again and again
        nonlocal turns
        turns += 1
        time.sleep(0.005)
        if busy:
            loop.call_soon(other_work)

    reported: list[str] = []
    behind = WriteBehind(index, lambda run_id, _: reported.append(run_id), hold=60.0)
    for run_id in runs:
        behind.add(run_id, _finished(run_id), _finished(run_id), [msgs[run_id]])
    loop.call_soon(other_work)
    try:
        await behind.flush(everything=True)
    finally:
        busy = False
    assert sorted(reported) == sorted(runs)
    # One turn per run each way took 600 turns here.
    assert turns < 100, turns
    await fast.flush()
    await _all_acked(js, subjects, "wb-busy")
    await behind.stop()


async def test_a_stop_that_cuts_a_flush_short_leaves_no_write_unawaited(
    fast: Client, subjects: Subjects
) -> None:
    """Stopped with more held than it writes in its time, the write-behind drops the writes
    it sent and did not see acknowledged (their messages come again) without leaving a
    coroutine never awaited (Python warns of each one when it is collected)."""
    runs = [f"cut-{n}" for n in range(40)]
    index, msgs = await _delivered(fast, subjects, runs, "wb-cut")
    behind = WriteBehind(index, lambda run_id, records: None, hold=60.0)
    for run_id in runs:
        behind.add(run_id, _finished(run_id), _finished(run_id), [msgs[run_id]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await behind.stop(timeout=0.001)  # the flush is cut short while it awaits a write
        gc.collect()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert unawaited == []


async def _all_acked(js: Any, subjects: Subjects, consumer: str) -> None:
    """Every delivered message acknowledged, as the consumer's info says: JetStream applies
    acknowledgements after the connection's flush, so the info is looked at until it does."""

    async def acked() -> bool:
        info = await js.consumer_info(subjects.runs_stream, consumer)
        return int(info.num_ack_pending or 0) == 0

    await eventually(acked, what=f"every message of {consumer} acknowledged")
