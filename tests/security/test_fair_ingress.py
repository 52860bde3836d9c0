"""One publisher floods the orchestrator with events whose trigger inputs cost (a CEL
comprehension: evaluated on the thread kept for costly evaluations); another publisher
sends one such event right after. Served first come first served, the bystander's run
started after the whole flood (600 events held another's triggered run 84 s). Shared
fairly per publisher, it starts behind at most what the flood's lane had taken in when it
came (the lane's budget), however large the flood: asserted on the order of the runs'
first records in the run-log stream, not on time. Real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from interlock.runtime.fairness import PUBLISHER_BUDGET
from interlock.runtime.observe import OrchestratorObserver
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.runtime import Stack, eventually, running_stack, yaml

pytestmark = pytest.mark.asyncio

FLOOD = 200
VALUES = list(range(50))
"""Each event's list: the comprehension over it costs some tens of milliseconds."""
SLACK = 4
"""Flood runs whose evaluation was done, or running, as the bystander's came in line."""


def workflow(name: str, event: str) -> str:
    return yaml(
        f"""\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: {name}
        spec:
          triggers:
            - event: {event}
              input: {{n: "{{{{ data.xs.map(x, x * 2).filter(x, x > 3).size() }}}}"}}
          inputs:
            n: {{type: integer, required: true}}
          initial_state: wait
          states:
            wait:
              type: human_in_the_loop
              on:
                - {{event: go, goto: done}}
            done:
              type: terminal
        """
    )


async def _first_seq(stack: Stack, run_id: str) -> int:
    raw = await stack.client.log.read_raw(run_id)
    return int(raw[0][0])


def _event(n: int, source: str, type_: str) -> CloudEvent:
    return CloudEvent(id=f"e{n}", source=source, type=type_, data={"xs": VALUES})


async def test_a_flood_of_costly_events_does_not_hold_another_publishers_event(
    nats_url: str, subjects: Subjects
) -> None:
    manifests = [workflow("flooded", "com.flood.job"), workflow("bystander", "org.other.ping")]
    seen = Seen()
    async with running_stack(
        nats_url, subjects, manifests, worker=False, observers=[seen]
    ) as stack:
        client = stack.client
        await asyncio.gather(
            *(client.emit(_event(n, "https://flood", "com.flood.job")) for n in range(FLOOD))
        )
        # What the run logs held when the bystander's event came: flood runs started
        # before it are not held against the bystander.
        mark = (await client.js.stream_info(subjects.runs_stream)).state.last_seq
        await client.emit(_event(0, "https://other", "org.other.ping"))

        async def all_started() -> list[dict[str, object]] | None:
            runs = await client.list_runs()
            return runs if len(runs) == FLOOD + 1 else None

        runs = await eventually(all_started, within=180, interval=0.5, what="every run")
        [bystander] = [str(r["run_id"]) for r in runs if r["workflow"] == "bystander"]
        at = await _first_seq(stack, bystander)
        flood = [
            await _first_seq(stack, str(r["run_id"])) for r in runs if r["workflow"] == "flooded"
        ]
        ahead = [seq for seq in flood if mark < seq < at]
        behind = [seq for seq in flood if seq > at]
        assert len(ahead) <= PUBLISHER_BUDGET + SLACK, (len(ahead), len(behind))
        assert len(behind) >= FLOOD // 4, "the flood was over before the bystander came"
        assert seen.deferrals > 0
        # A deferral is no failed delivery: none is counted as a redelivery, none led to a
        # dead letter.
        assert seen.redeliveries == [], seen.redeliveries[:5]
        assert seen.letters == []


class Seen(OrchestratorObserver):
    """What the orchestrator reports: redeliveries, dead letters, deferrals."""

    def __init__(self) -> None:
        self.redeliveries: list[str] = []
        self.letters: list[str] = []
        self.deferrals = 0

    def redelivered(self, consumer: str) -> None:
        self.redeliveries.append(consumer)

    def dead_lettered(self, reason: str) -> None:
        self.letters.append(reason)

    def deferred(self) -> None:
        self.deferrals += 1
