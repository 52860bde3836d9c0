"""Debounced and batched triggers on a real nats-server, with time on an advanceable
clock: a burst of events of one key starts one run with its last event, never later than
``max_wait``; a batch is cut at ``max_events`` or ``max_wait``; keys and namespaces keep
windows of their own, and a flood of one key does not hold up another's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.incoming import Incoming
from interlock.core.windowing import DUPLICATE, entry_token
from interlock.runtime.client import InterlockClient
from interlock.runtime.service import Orchestrator
from interlock.runtime.timers import ClockTimers
from interlock.runtime.triggerstate import window_entries
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.flow import WAIT, clock_orchestrator
from support.runtime import ECHO_MANIFEST, DeadLetters, eventually


def workflow(name: str, trigger: str, namespace: str = "default") -> str:
    return f"""\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  triggers:
    - event: com.example.push
{trigger}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {{event: go, goto: done}}
    done:
      type: terminal
"""


DEBOUNCE = (Path(__file__).resolve().parents[2] / "examples" / "debounce.yaml").read_text()
DEBOUNCE += "---\n" + ECHO_MANIFEST.read_text()
"""One build per burst of pushes of a repository (10 s quiet, 60 s at most)."""
BATCH = workflow(
    "rows",
    "      batch: {key: data.table, max_events: 3, max_wait: 30s}\n"
    "      input: {row: '{{ data.row }}'}",
)


class Stack:
    def __init__(
        self, client: InterlockClient, timers: ClockTimers, orchestrator: Orchestrator
    ) -> None:
        self.client, self.timers, self.orchestrator = client, timers, orchestrator
        self.sent = 0

    async def push(self, key: str, n: int = 1, *, field: str = "repo", **data: object) -> list[str]:
        ids = []
        for _ in range(n):
            self.sent += 1
            event_id = f"e{self.sent}"
            await self.client.emit(
                CloudEvent(
                    id=event_id,
                    source="/git",
                    type="com.example.push",
                    data={field: key, "n": self.sent, **data},
                )
            )
            ids.append(event_id)
        return ids

    async def taken(self, trigger: str, key: str, count: int) -> None:
        """Wait until the window of ``trigger``'s ``key`` holds ``count`` events."""
        windows = self.orchestrator.starting.windows

        async def holds() -> bool:
            entry, _ = await windows.read(entry_token(trigger, key))
            return entry is not None and entry.open is not None and entry.open.count == count

        await eventually(holds, within=WAIT, what=f"{count} events in {key}'s window")

    async def runs(self, workflow: str) -> list[ev.RunStartedData]:
        out = []
        for row in await self.client.list_runs():
            if row["workflow"] == workflow:
                records, _ = await self.client.runs.log.read(row["run_id"])
                first = records[0]
                assert isinstance(first, ev.RunStarted)
                out.append(first.data)
        return sorted(out, key=lambda d: d.window.opened_at if d.window else "")

    async def runs_of(self, workflow: str, count: int) -> list[ev.RunStartedData]:
        async def enough() -> list[ev.RunStartedData] | None:
            found = await self.runs(workflow)
            return found if len(found) >= count else None

        found = await eventually(enough, within=WAIT, what=f"{count} runs of {workflow}")
        assert found is not None
        return found

    async def explained(self, workflow: str, says: str) -> None:
        """Each run of ``workflow`` re-drives to its log (``explain``, ``replay``), and one
        says ``says`` of its start."""
        definition, _ = await self.client.registry.latest(workflow)
        definition = self.client.registry.link(definition)
        summaries = []
        for row in await self.client.list_runs():
            if row["workflow"] == workflow:
                records, _ = await self.client.runs.log.read(row["run_id"])
                report = analysis.explain(records, definition)
                assert report["reproduces"], report.get("mismatch")
                summaries += [r["summary"] for r in report["steps"][0]["records"]]
        assert any(says in s for s in summaries), summaries


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    async with clock_orchestrator(nats_url, subjects, index_hold=0) as (
        client,
        timers,
        orchestrator,
    ):
        yield Stack(client, timers, orchestrator)


async def test_a_burst_of_one_key_starts_one_run_with_its_last_event(stack: Stack) -> None:
    await stack.client.apply([("debounce.yaml", DEBOUNCE)])
    trigger = "default/build-on-push#trigger1"
    ids = await stack.push("acme/api", 20)
    await stack.taken(trigger, "acme/api", 20)
    await stack.timers.advance(9)
    assert await stack.runs("build-on-push") == []
    await stack.timers.advance(1)
    [started] = await stack.runs_of("build-on-push", 1)
    assert started.trigger is not None
    assert started.trigger["id"] == ids[-1]
    assert started.inputs == {"repo": "acme/api", "n": 20}
    window = started.window
    assert window is not None
    assert (window.kind, window.key, window.count, window.closed_by) == (
        "debounce", "acme/api", 20, "period"
    )  # fmt: skip
    assert window.events == ids
    await stack.explained(
        "build-on-push",
        "from a debounce window of 20 event(s) for key 'acme/api' of "
        f"{trigger}, opened 10.0s before, closed by period",  # how long the burst was held
    )
    # Quiet again: nothing more starts; the next burst is a window of its own.
    await stack.timers.advance(120)
    assert len(await stack.runs("build-on-push")) == 1


async def test_a_debounce_never_waits_longer_than_max_wait(stack: Stack) -> None:
    await stack.client.apply([("debounce.yaml", DEBOUNCE)])
    trigger = "default/build-on-push#trigger1"
    sent: list[str] = []
    # An event every 5 s (the period is 10 s): the window would never be quiet.
    for n in range(14):
        sent += await stack.push("acme/web")
        await stack.taken(trigger, "acme/web", n + 1) if n < 12 else None
        await stack.timers.advance(5)
    [started] = await stack.runs_of("build-on-push", 1)
    window = started.window
    assert window is not None
    assert window.closed_by == "max_wait"
    # Opened at t=0, closed at t=60: the events sent at 0, 5, ... 55 (12 of them).
    assert window.events == sent[:12]


async def test_a_batch_is_cut_at_max_events_and_at_max_wait(stack: Stack) -> None:
    await stack.client.apply([("rows.yaml", BATCH)])
    trigger = "default/rows#trigger1"
    first = await stack.push("orders", 3, field="table", row="r")
    [full] = await stack.runs_of("rows", 1)
    assert full.window is not None
    assert (full.window.closed_by, full.window.events) == ("max_events", first)
    assert full.inputs == {"events": [{"row": "r"}] * 3}
    rest = await stack.push("orders", 2, field="table", row="s")
    await stack.taken(trigger, "orders", 2)
    await stack.timers.advance(29)
    assert len(await stack.runs("rows")) == 1
    await stack.timers.advance(1)
    [_, cut] = await stack.runs_of("rows", 2)
    assert cut.window is not None
    assert (cut.window.closed_by, cut.window.events, cut.window.count) == ("max_wait", rest, 2)
    assert cut.inputs == {"events": [{"row": "s"}] * 2}
    await stack.explained("rows", "from a batch window of 2 event(s)")


async def test_keys_and_namespaces_keep_windows_of_their_own(stack: Stack) -> None:
    other = DEBOUNCE.replace("namespace: default", "namespace: other")
    await stack.client.apply([("debounce.yaml", DEBOUNCE), ("other.yaml", other)])
    # A flood of one key: the other key's one event closes on its own time.
    await stack.push("flood", 200)
    lone = await stack.push("lone")
    await stack.taken("default/build-on-push#trigger1", "flood", 200)
    await stack.taken("other/build-on-push#trigger1", "lone", 1)
    await stack.timers.advance(10)
    runs = await stack.runs_of("build-on-push", 4)
    keys = sorted((r.namespace, r.window.key, r.window.count) for r in runs if r.window)
    assert keys == [
        ("default", "flood", 200),
        ("default", "lone", 1),
        ("other", "flood", 200),
        ("other", "lone", 1),
    ]
    assert all(r.trigger and r.trigger["id"] in (lone[0], "e200") for r in runs)


async def test_a_window_sealed_by_an_orchestrator_that_died_starts_one_run(stack: Stack) -> None:
    await stack.client.apply([("debounce.yaml", DEBOUNCE)])
    trigger = "default/build-on-push#trigger1"
    ids = await stack.push("x", 2)
    await stack.taken(trigger, "x", 2)
    windows = stack.orchestrator.starting.windows
    token = entry_token(trigger, "x")
    entry, revision = await windows.read(token)
    assert entry is not None
    window = entry.open
    assert window is not None
    # What an orchestrator killed between closing the window and starting its run leaves.
    window.closed_by = "period"
    entry.sealed, entry.open = window, None
    assert await windows._write(token, entry, revision)
    # Every path that finds it finishes it: the sweep of each starting orchestrator, its
    # timer coming again, the next event of its key. One run, with both events.
    await windows.sweep()
    await windows.sweep()
    await windows.due(window.run_id, f"{window.run_id}:window:{token}:0")
    later = await stack.push("x")
    [started] = await stack.runs_of("build-on-push", 1)
    assert started.window is not None
    assert started.window.events == ids
    # An event delivered again (its orchestrator died before acknowledging it) after its
    # window's run started is not taken into the next window.
    definition, version = await stack.client.registry.latest("build-on-push")
    again = Incoming(type="com.example.push", source="/git", id=ids[0], data={"repo": "x"})
    taken = await windows.take(
        definition, version, definition.triggers[0], "x", again, {"repo": "x"}, room=1 << 16
    )
    assert taken == DUPLICATE
    await stack.timers.advance(10)
    [_, second] = await stack.runs_of("build-on-push", 2)
    assert second.window is not None
    assert second.window.events == later


async def test_an_event_whose_key_cannot_be_computed_is_dead_lettered(
    stack: Stack, subjects: Subjects
) -> None:
    await stack.client.apply([("debounce.yaml", DEBOUNCE)])
    async with DeadLetters(stack.client.js, subjects) as letters:
        await stack.push("x" * 300)  # a key longer than 256 characters
        await stack.push("acme", field="repository")  # no data.repo: no key
        refused = [await letters.next(), await letters.next()]
    reasons = [m.headers.get("Interlock-Dead-Letter-Reason") for m in refused if m.headers]
    assert reasons == ["bad-trigger-key"] * 2
    details = " ".join(str(m.headers.get("Interlock-Dead-Letter-Detail")) for m in refused)
    assert "is 300 characters long (at most 256)" in details
    assert await window_entries(stack.client.js, subjects) == []


async def test_an_event_a_batchs_inputs_cannot_take_is_refused_when_it_comes(
    stack: Stack, subjects: Subjects
) -> None:
    strings = BATCH.replace(
        "  triggers:", '  inputs: {events: {type: "list[string]", required: true}}\n  triggers:'
    )
    await stack.client.apply([("rows.yaml", strings)])
    async with DeadLetters(stack.client.js, subjects) as letters:
        await stack.push("orders", field="table", row="r")  # an item {"row": "r"}: no string
        [refused] = [await letters.next()]
    assert refused.headers is not None
    assert refused.headers.get("Interlock-Dead-Letter-Reason") == "invalid-inputs"
    assert await window_entries(stack.client.js, subjects) == []


async def test_a_debounce_of_the_largest_events_takes_them(stack: Stack) -> None:
    """Events near the largest taken (a quarter of the payload limit) are each kept once
    in a debounce's window, their data being its run's inputs, not twice: the window,
    beside the one closed before it, stays within what the server takes."""
    large = workflow("large", "      debounce: {key: data.repo, period: 10s}")
    await stack.client.apply([("large.yaml", large)])
    blob = "b" * (250 * 1024)
    first = await stack.push("big", blob=blob)
    await stack.taken("default/large#trigger1", "big", 1)
    await stack.timers.advance(11)
    (run,) = await stack.runs_of("large", 1)
    second = await stack.push("big", blob=blob)
    await stack.taken("default/large#trigger1", "big", 1)
    await stack.timers.advance(11)
    runs = await stack.runs_of("large", 2)
    assert [r.trigger["id"] for r in runs if r.trigger] == [*first, *second]
    assert all(r.inputs["blob"] == blob for r in runs)
    assert run.window is not None
    assert run.window.closed_by == "period"


async def test_an_event_larger_than_its_window_may_hold_is_dead_lettered(
    stack: Stack, subjects: Subjects
) -> None:
    """A debounced event whose ``input`` renders its data twice over takes more than a
    window may hold (half the payload limit): refused with its reason, the window left
    as it was, and the key's next event taken."""
    twice = workflow(
        "twice",
        "      debounce: {key: data.repo, period: 10s}\n"
        "      input: {a: '{{ data.blob }}', b: '{{ data.blob }}'}",
    )
    await stack.client.apply([("twice.yaml", twice)])
    async with DeadLetters(stack.client.js, subjects) as letters:
        await stack.push("k", blob="b" * 200_000)
        refused = await letters.next()
    headers = refused.headers or {}
    assert headers.get("Interlock-Dead-Letter-Reason") == "too-large-for-window"
    assert "default/twice#trigger1" in str(headers.get("Interlock-Dead-Letter-Detail"))
    assert await window_entries(stack.client.js, subjects) == []
    (small,) = await stack.push("k", blob="small")
    await stack.taken("default/twice#trigger1", "k", 1)
    await stack.timers.advance(11)
    (run,) = await stack.runs_of("twice", 1)
    assert run.trigger is not None
    assert run.trigger["id"] == small
