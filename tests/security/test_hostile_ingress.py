"""Costly CEL at ingress: a trigger's ``input`` template and a ``correlate.events`` key
whose comprehension meets a big event stop at their step budget, and the event is
dead-lettered with the reason (``bad-trigger-input``, ``bad-correlation-key``); while a
string of such events is evaluated, an event published after them still starts its run,
and that run completes before the last of them is dead-lettered (the costly evaluations
run away from the event loop, and ingress fetches on without waiting for them)."""

from __future__ import annotations

import pytest

from interlock.core.compiler import compile_workflow_text
from interlock.core.engine import derive_run_id
from interlock.core.expr import STEP_BUDGET
from interlock.core.incoming import heavy_value
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from support.hostile import PINGED, DeadLetters, Stack, running_stack, yaml

pytestmark = pytest.mark.timeout(300)

DOUBLING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: doubling
    spec:
      inputs:
        xs: {type: list, required: true}
      triggers:
        - event: acme.batch
          input:
            xs: "{{ data.xs.map(x, x * 2) }}"
      initial_state: done
      states:
        done:
          type: terminal
    """
)

KEYED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: keyed
    spec:
      inputs:
        order: {type: string, required: true}
      correlate:
        key: "{{ inputs.order }}"
        events:
          acme.parcel: 'string(size(data.xs.filter(x, x < 0)))'
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: acme.parcel, goto: done}
        done:
          type: terminal
    """
)

COSTLY_EACH = 5
"""Events of each costly kind: ten evaluations of a whole step budget in all."""
ITEMS = 20_000
"""Items of the events' list (~110 KB): the comprehension runs out of budget on it."""
BUDGET_SPENT = f"evaluation stopped after {STEP_BUDGET:,} steps (its budget)"


async def _dead_lettered(stack: Stack) -> int:
    info = await stack.js.stream_info(stack.subjects.dead_letter_stream)
    return info.state.messages


async def test_costly_ingress_expressions_are_refused_and_hold_up_no_other_run(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        running_stack(nats_url, subjects, [PINGED, DOUBLING, KEYED]) as stack,
        DeadLetters(stack.js, subjects) as letters,
    ):
        big = {"xs": list(range(ITEMS))}
        for n in range(COSTLY_EACH):
            for kind in ("batch", "parcel"):
                event = CloudEvent(id=f"{kind}-{n}", source="t", type=f"acme.{kind}", data=big)
                await stack.client.emit(event)
        first = await letters.next(timeout=120)
        assert first.headers is not None
        # Published once the costly evaluations are under way: a later fetch.
        await stack.client.emit(CloudEvent(id="ping", source="t", type="acme.ping"))
        pinged = derive_run_id(compile_workflow_text(PINGED), "t", "ping")
        state = await stack.wait(pinged, 120)
        assert state.status == "completed", state
        assert await _dead_lettered(stack) < 2 * COSTLY_EACH

        reasons = [first.headers["Interlock-Dead-Letter-Reason"]]
        details = [first.headers["Interlock-Dead-Letter-Detail"]]
        for _ in range(2 * COSTLY_EACH - 1):
            letter = await letters.next(timeout=120)
            assert letter.headers is not None
            reasons.append(letter.headers["Interlock-Dead-Letter-Reason"])
            details.append(letter.headers["Interlock-Dead-Letter-Detail"])
        assert sorted(reasons) == sorted(
            ["bad-trigger-input"] * COSTLY_EACH + ["bad-correlation-key"] * COSTLY_EACH
        )
        for reason, detail in zip(reasons, details, strict=True):
            workflow = "doubling" if reason == "bad-trigger-input" else "keyed"
            assert detail.startswith(f"{workflow}: "), detail
            assert BUDGET_SPENT in detail, detail
        assert await _dead_lettered(stack) == 2 * COSTLY_EACH


def test_a_value_is_heavy_from_its_limit_counted_through_every_level() -> None:
    assert not heavy_value({"a": [1, 2], "b": {"c": 3}}, limit=6)
    assert heavy_value({"a": [1, 2], "b": {"c": 3}}, limit=5)
    assert heavy_value([[]] * 10, limit=10)
    assert not heavy_value("x" * 1_000_000, limit=2)
    # Counting stops at the limit: a list of ten million items is seen at once.
    assert heavy_value([0] * 10_000_000)
