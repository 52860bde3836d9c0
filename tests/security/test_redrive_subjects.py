"""Which dead letters a redrive may publish again: none an agent wrote (the subject it
names is the agent's word), and only to where the orchestrator reads the messages it
dead-letters, never to a run log, a task, a bucket or the JetStream API."""

from __future__ import annotations

import pytest

from interlock.runtime.client import DeadLetter
from interlock.transport.subjects import Subjects

S = Subjects("il")


def test_letters_an_agent_wrote_are_told_by_their_own_subject() -> None:
    assert S.written_by_an_agent(S.agent_dead_letter("review", "bad_input"))
    assert not S.written_by_an_agent(S.dead_letter("bad-json"))
    assert not S.written_by_an_agent(S.dead_letter("agent"))  # a reason, not the agents' tree
    assert not S.written_by_an_agent(Subjects("other").agent_dead_letter("review", "x"))


@pytest.mark.parametrize(
    "subject",
    [
        S.event("acme.order.placed"),
        S.addressed("r1", "approval.granted"),
        S.answer("review", "r1"),
        S.result("review", "r1"),
        S.timer_fired("r1"),
    ],
)
def test_the_orchestrators_own_inputs_are_redrivable(subject: str) -> None:
    assert S.dead_lettered_from(subject)


@pytest.mark.parametrize(
    "subject",
    [
        S.run("r1"),
        S.capability("review"),
        S.tasks_keeper,
        f"$KV.{S.workflows_bucket}.latest.x.y",
        "$JS.API.STREAM.PURGE.IL_RUNS",
        S.dead_letter("bad-json"),
        "il.events",
        "other.events.acme",
        "",
    ],
)
def test_nothing_else_is(subject: str) -> None:
    assert not S.dead_lettered_from(subject)


def _letter(
    subject: str, *, stored_on: str = "", headers: dict[str, str] | None = None
) -> DeadLetter:
    return DeadLetter(
        seq=1,
        time="",
        reason="r",
        detail="",
        subject=subject,
        headers=headers or {},
        data=b"{}",
        stored_on=stored_on or S.dead_letter("r"),
    )


def test_an_event_is_redriven() -> None:
    assert _letter(S.event("acme.order.placed")).redrive_refusal(S) is None
    assert _letter(S.addressed("r1", "approval.granted")).redrive_refusal(S) is None


@pytest.mark.parametrize(
    ("letter", "why"),
    [
        (
            _letter(S.event("x"), stored_on=S.agent_dead_letter("review", "bad")),
            "an agent wrote it",
        ),
        (_letter(""), "does not name the subject"),
        (_letter(S.answer("review", "r1")), "answers come from agents"),
        (_letter(S.result("review", "r1")), "answers come from agents"),
        (_letter(S.timer_fired("r1")), "fired timers from the orchestrator"),
        (_letter(S.run("r1")), "where no message the orchestrator reads comes"),
        (
            _letter(S.event("x"), headers={"Interlock-Dead-Letter-Truncated": "2000000"}),
            "of a 2,000,000-byte message",
        ),
    ],
    ids=["agent", "no subject", "answer", "result", "timer", "run log", "truncated"],
)
def test_every_other_letter_says_why_not(letter: DeadLetter, why: str) -> None:
    refusal = letter.redrive_refusal(S)
    assert refusal is not None
    assert why in refusal
