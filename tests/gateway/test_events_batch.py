"""A batched ``POST /events`` over a real socket: its events are published together (one
round trip, not one per event), stored in the batch's order, and each answered as the same
event posted alone is answered."""

from __future__ import annotations

import json
from typing import Any

import pytest

from interlock.core.engine import derive_run_id
from interlock.transport.subjects import Subjects
from support.gateway import HELLO, GatewayStack, gateway_stack, yaml
from support.runtime import DeadLetters

pytestmark = pytest.mark.asyncio

BATCH = {"Content-Type": "application/cloudevents-batch+json"}
SOURCE = "https://ci.example/builds"


CALLS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: calls}
    spec:
      triggers:
        - event: com.example.call
          rate: {limit: 2, per: 1h, on_limit: drop}
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {message: call}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)
"""Two runs an hour; the events over that are dead-lettered (``rate-limited``)."""


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [HELLO, CALLS]) as stack:
        yield stack


def event(event_id: str, data: Any) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": SOURCE,
        "type": "com.example.greet",
        "data": data,
    }


DATA = [
    {"message": "one", "lang": "en"},  # starts a run of hello
    {"message": "two", "lang": "fr"},  # the trigger's filter wants en: starts nothing
    {"lang": "en"},  # no message: hello's input is missing, refused (invalid-inputs)
    {"message": "four", "lang": "en"},
    {"message": "five", "lang": "de"},
    {"message": "six", "lang": "en"},
]


def what_it_does(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs between two events of different ids."""
    out = {k: v for k, v in answer.items() if k not in ("id", "seq")}
    out["started"] = [{k: v for k, v in s.items() if k != "run_id"} for s in answer["started"]]
    return out


async def stored_ids(gs: GatewayStack) -> list[str]:
    """The ``ce-id`` of each event the EVENTS stream holds, in its order."""
    js, stream = gs.stack.js, gs.stack.subjects.events_stream
    last = (await js.stream_info(stream)).state.last_seq
    ids = []
    for seq in range(1, last + 1):
        msg = await js.get_msg(stream, seq)
        assert msg.headers is not None
        ids.append(msg.headers["ce-id"])
    return ids


async def test_a_batch_is_stored_in_order_and_answered_as_each_alone(gs: GatewayStack) -> None:
    alone = []
    async with gs.http(role="operator") as http:
        for i, data in enumerate(DATA):
            r = await http.post(
                "/events", headers={"Content-Type": "application/cloudevents+json"},
                content=json.dumps(event(f"alone-{i}", data)),
            )  # fmt: skip
            assert r.status_code == 202, r.text
            alone += r.json()["events"]
        # In the batch, b-1 again (the same source and id) after b-3.
        batch = [event(f"b-{i}", data) for i, data in enumerate(DATA)]
        batch.insert(4, event("b-1", {"message": "again", "lang": "fr"}))
        r = await http.post("/events", headers=BATCH, content=json.dumps(batch))
    assert r.status_code == 202, r.text
    assert r.json()["mode"] == "batched"
    answers = r.json()["events"]
    again = answers.pop(4)
    assert [a["id"] for a in answers] == [f"b-{i}" for i in range(len(DATA))]
    assert [what_it_does(a) for a in answers] == [what_it_does(a) for a in alone]
    assert [len(a["started"]) for a in answers] == [1, 0, 0, 1, 0, 1]
    assert answers[2]["refused"][0]["reason"] == "invalid-inputs"
    definition, _ = await gs.stack.client.registry.latest("hello")
    for i in (0, 3, 5):
        [run] = answers[i]["started"]
        assert run["run_id"] == derive_run_id(definition, SOURCE, f"b-{i}")
    # Stored once, in the batch's order, after the events sent alone.
    seqs = [a["seq"] for a in answers]
    assert seqs == list(range(seqs[0], seqs[0] + len(DATA)))
    assert seqs[0] == alone[-1]["seq"] + 1
    assert (again["id"], again["duplicate"], again["seq"]) == ("b-1", True, answers[1]["seq"])
    assert [a["duplicate"] for a in answers] == [False] * len(DATA)
    assert await stored_ids(gs) == [f"alone-{i}" for i in range(len(DATA))] + [
        f"b-{i}" for i in range(len(DATA))
    ]
    # The runs the batch said it starts are started.
    for i, message in ((0, "one"), (3, "four"), (5, "six")):
        state = await gs.stack.wait(answers[i]["started"][0]["run_id"])
        assert state.outputs == {"echoed": message}


async def test_a_bad_event_in_the_middle_of_a_batch_stores_none_of_it(gs: GatewayStack) -> None:
    reference = {"$object": {"bucket": "il_uploads", "name": "x", "size": 1, "digest": "d"}}
    bad_ones = [
        ({"specversion": "1.0", "id": "bad", "source": SOURCE}, 400, "invalid-event"),
        (event("ref", reference), 400, "invalid-reference"),
    ]
    async with gs.http(role="publisher") as http:
        for bad, status, kind in bad_ones:
            batch = [event("m-0", DATA[0]), bad, event("m-2", DATA[3])]
            r = await http.post("/events", headers=BATCH, content=json.dumps(batch))
            assert r.status_code == status, r.text
            problem = r.json()
            assert problem["type"].endswith("/" + kind)
            assert problem["index"] == 1
            assert "event 1 of the batch" in problem["detail"]
    assert await gs.stored_events() == 0


async def test_a_batch_over_a_rate_that_drops_says_which_events_are_dropped(
    gs: GatewayStack,
) -> None:
    def call(event_id: str) -> dict[str, Any]:
        return {**event(event_id, {}), "type": "com.example.call"}

    # c-0 again is stored once: it takes no second start.
    batch = [call("c-0"), call("c-0"), call("c-1"), call("c-2"), call("c-3")]
    async with DeadLetters(gs.stack.js, gs.stack.subjects) as letters:
        async with gs.http(role="operator") as http:
            r = await http.post("/events", headers=BATCH, content=json.dumps(batch))
        assert r.status_code == 202, r.text
        answers = r.json()["events"]
        assert [a["duplicate"] for a in answers] == [False, True, False, False, False]
        assert [len(a["started"]) for a in answers] == [1, 1, 1, 0, 0]
        assert [[x["reason"] for x in a["refused"]] for a in answers] == [[]] * 3 + [
            ["rate-limited"]
        ] * 2
        # What the orchestrator does: the runs listed start, the others are dead letters.
        for a in answers[:3]:
            state = await gs.stack.wait(a["started"][0]["run_id"])
            assert state.status == "completed"
        dropped = [await letters.next(), await letters.next()]
    assert [(m.headers or {}).get("ce-id") for m in dropped] == ["c-2", "c-3"]
    assert [(m.headers or {}).get("Interlock-Dead-Letter-Reason") for m in dropped] == [
        "rate-limited"
    ] * 2
