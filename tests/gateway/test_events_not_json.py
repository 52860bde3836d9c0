"""An event posted without saying its data is JSON (``curl -d`` sends the content type of a
form): a trigger whose ``input`` reads ``data.<field>`` cannot use it, and the operator who
posts it is told so in words (the answer's ``refused`` and the dead letter alike), with what
to send; the same event sent as JSON starts its run. Real stack, an operator's token over
HTTP (a publisher's is told only that its event is stored: test_publisher_answer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interlock.transport.subjects import Subjects
from support.gateway import GatewayStack, gateway_stack
from support.runtime import yaml

pytestmark = pytest.mark.asyncio

NOTE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: note}
    spec:
      triggers:
        - event: com.example.note
          input: {message: "{{ data.message }}"}
      initial_state: done
      states:
        done:
          type: terminal
          outputs: {message: "{{ inputs.message }}"}
    """
)

# Triggers whose key reads the data: a rate per customer, a debounce per repository.
PACED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: paced}
    spec:
      triggers:
        - event: com.example.order
          rate: {limit: 5, per: 1m, key: data.customer}
        - event: com.example.push
          debounce: {key: data.repo, period: 1s}
      initial_state: done
      states:
        done: {type: terminal}
    """
)


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [NOTE, PACED]) as stack:
        yield stack


def note(event_id: str, content_type: str, kind: str = "note") -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": event_id,
        "ce-source": "https://shop.example",
        "ce-type": f"com.example.{kind}",
        "Content-Type": content_type,
    }


async def _letter(http: Any, reason: str) -> dict[str, Any]:
    for _ in range(600):
        letters = (await http.get("/dead-letters", params={"reason": reason})).json()
        if letters:
            return dict(letters[0])
        await asyncio.sleep(0.05)
    raise AssertionError(f"no dead letter {reason}")


async def test_data_not_sent_as_json_is_refused_saying_what_to_send(gs: GatewayStack) -> None:
    body = b'{"message": "hi"}'
    async with gs.http("operator") as http:
        r = await http.post(
            "/events",
            headers=note("n-1", "application/x-www-form-urlencoded"),
            content=body,
        )
        assert r.status_code == 202, r.text
        [item] = r.json()["events"]
        assert item["started"] == []
        [refused] = item["refused"]
        assert refused["reason"] == "bad-trigger-input"
        detail = refused["detail"]
        assert "17 bytes of a content type that is not JSON, not a JSON object" in detail
        assert "Content-Type, application/json" in detail
        assert "<class" not in detail  # no Python internals

        again = await http.post("/events", headers=note("n-2", "application/json"), content=body)
        assert again.status_code == 202, again.text
        [started] = again.json()["events"][0]["started"]
        # The orchestrator dead-letters the first with the same words.
        letter = await _letter(http, "bad-trigger-input")
    assert letter["detail"] == detail
    state = await gs.stack.wait(started["run_id"])
    assert state.outputs == {"message": "hi"}


@pytest.mark.parametrize(
    ("kind", "body"), [("order", b'{"customer": "bob"}'), ("push", b'{"repo": "a"}')]
)
async def test_a_trigger_key_over_data_not_sent_as_json_says_what_to_send(
    gs: GatewayStack, kind: str, body: bytes
) -> None:
    """The key of a rate or a debounce that reads ``data.<field>`` says the same as an
    input does, where it printed the expression language's error over Python's types."""
    async with gs.http("operator") as http:
        r = await http.post(
            "/events",
            headers=note(f"{kind}-1", "application/x-www-form-urlencoded", kind),
            content=body,
        )
        assert r.status_code == 202, r.text
        [item] = r.json()["events"]
        assert item["started"] == item["gathered"] == []
        [refused] = item["refused"]
        assert refused["reason"] == "bad-trigger-key"
        detail = refused["detail"]
        assert "the key of trigger default/paced#trigger" in detail
        assert f"reads the event's data, which is {len(body)} bytes of a content type" in detail
        assert "Content-Type, application/json" in detail
        assert "class" not in detail  # no Python internals

        again = await http.post(
            "/events", headers=note(f"{kind}-2", "application/json", kind), content=body
        )
        assert again.status_code == 202, again.text
        [item] = again.json()["events"]
        assert item["refused"] == []
        assert item["started"] or item["gathered"]
    async with gs.http("operator") as http:
        letter = await _letter(http, "bad-trigger-key")
    assert letter["detail"].endswith(detail.split(": ", 1)[1])
