"""Answers the orchestrator refuses: forged ones never reach a run's log.

An agent of a capability may answer on ``<prefix>.results.<capability>.*`` (the results
stream) and ``<prefix>.answer.<capability>.*`` (a request the orchestrator replies to once
the answer is in the log); NATS permissions say so. Everything else is checked by the
orchestrator before it appends: the answer must echo the per-attempt ``Interlock-Token``
of the request it answers, name that request's run, action and attempt, and the run must
still await that attempt. Each refused answer is dead-lettered with its reason (told in the
reply to a request); the log is unchanged. Real nats-server, no agent
process: the test reads the requests and writes the answers by hand, as an attacker would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from interlock.core.vocabulary import TASK_COMPLETED, TASK_FAILED
from interlock.transport import tasks
from interlock.transport.cloudevents import CloudEvent, decode_message
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, eventually, running_stack, yaml

pytestmark = pytest.mark.timeout(60)

FLAKY = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: flaky
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: slow
              retry:
                max_attempts: 2
                backoff: {initial: 1s, multiplier: 1, max: 1s, jitter: false}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


class Requests:
    """Task requests as they are published (a plain subscription, like a tap on the wire)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[CloudEvent, dict[str, str]]] = asyncio.Queue()

    async def on_msg(self, msg: Msg) -> None:
        self.queue.put_nowait((decode_message(msg.headers, msg.data), dict(msg.headers or {})))

    async def next(self, run_id: str) -> tuple[CloudEvent, dict[str, str]]:
        while True:
            event, headers = await asyncio.wait_for(self.queue.get(), TIMEOUT)
            if event.extensions["runid"] == run_id:
                return event, headers


def answer_for(
    request: CloudEvent,
    *,
    run_id: str | None = None,
    attempt: str | None = None,
    event_type: str = TASK_COMPLETED,
    data: Any = None,
    suffix: str = "answer",
) -> CloudEvent:
    ext = {
        "runid": run_id or request.extensions["runid"],
        "actionid": request.extensions["actionid"],
        "attempt": attempt or request.extensions["attempt"],
    }
    return CloudEvent(
        id=f"{request.id}.{ext['attempt']}.{suffix}",
        source="test://forger",
        type=event_type,
        subject=ext["runid"],
        datacontenttype="application/json",
        data={} if data is None else data,
        extensions=ext,
    )


WAYS = ["stream", "request"]
"""How an answer is sent: published to the results stream, or requested on the answer
subject (the orchestrator replies with what became of it)."""


async def send(
    stack: Any, way: str, subject: str, event: CloudEvent, token: str | None
) -> dict[str, str] | None:
    """Send an answer on ``subject`` (a results subject; its answer twin for a request);
    the reply's headers (None: published to the stream)."""
    headers, payload = tasks.encode_result(event, token=token)
    if way == "stream":
        await stack.client.js.publish(subject, payload, headers=headers)
        return None
    where = stack.subjects.answered(subject)
    assert where is not None
    answer_subject = stack.subjects.answer(*where)
    reply = await stack.client.nc.request(answer_subject, payload, headers=headers, timeout=TIMEOUT)
    assert reply.headers is not None
    return dict(reply.headers)


@pytest.mark.parametrize("way", WAYS)
async def test_forged_answers_are_dead_lettered_and_the_log_is_unchanged(
    nats_url: str, subjects: Subjects, way: str
) -> None:
    async with running_stack(nats_url, subjects, [FLAKY], worker=False) as stack:

        async def publish(subject: str, event: CloudEvent, token: str | None) -> None:
            reply = await send(stack, way, subject, event, token)
            assert reply is None or reply[tasks.ANSWER_HEADER] == tasks.ANSWER_RECORDED

        requests = Requests()
        tap = await stack.client.nc.subscribe(subjects.capabilities_all, cb=requests.on_msg)
        letters = await stack.client.js.subscribe(subjects.dead_letters_all, ordered_consumer=True)

        forged = 0

        async def refused(subject: str, event: CloudEvent, token: str | None) -> str:
            """Publish a forged answer; the reason of its dead letter."""
            nonlocal forged
            forged += 1  # each its own id: the results stream drops a repeated one
            event = msgspec.structs.replace(event, id=f"{event.id}.{forged}")
            reply = await send(stack, way, subject, event, token)
            letter = await letters.next_msg(timeout=TIMEOUT)
            assert letter.headers is not None
            if reply is not None:  # told why, once the dead letter is stored
                assert reply[tasks.ANSWER_HEADER] == tasks.ANSWER_REFUSED
                reason = letter.headers["Interlock-Dead-Letter-Reason"]
                assert reply[tasks.ANSWER_REASON_HEADER] == reason
                # and what was wrong, which the agent may not read in the dead letter
                detail = letter.headers["Interlock-Dead-Letter-Detail"]
                assert reply[tasks.ANSWER_DETAIL_HEADER] == detail, (reply, detail)
            where = stack.subjects.answered(subject)
            assert where is not None
            sent_on = subject if way == "stream" else stack.subjects.answer(*where)
            assert letter.headers["Interlock-Dead-Letter-Subject"] == sent_on
            return letter.headers["Interlock-Dead-Letter-Reason"]

        run_a = await stack.client.start("flaky", {})
        run_b = await stack.client.start("flaky", {})
        req_a, head_a = await requests.next(run_a)
        req_b, head_b = await requests.next(run_b)
        token_a, token_b = head_a[tasks.TOKEN_HEADER], head_b[tasks.TOKEN_HEADER]
        assert token_a
        assert token_b
        assert token_a != token_b
        before = len(await stack.records(run_a))

        answer_a = answer_for(req_a)
        # Run B's token (an agent holding another run's task) on run A's answer.
        assert await refused(subjects.result("slow", run_a), answer_a, token_b) == ("answer-token")
        # Run B's own answer, sent to run A's subject.
        assert await refused(subjects.result("slow", run_a), answer_for(req_b), token_b) == (
            "answer-mismatch"
        )
        # From another capability's subject (an agent of "echo" answering "slow").
        assert await refused(subjects.result("echo", run_a), answer_a, token_a) == ("answer-token")
        # No token; a made-up token.
        assert await refused(subjects.result("slow", run_a), answer_a, None) == "answer-token"
        assert await refused(subjects.result("slow", run_a), answer_a, "x" * 43) == ("answer-token")
        # Without the attempt.
        bare = CloudEvent(
            id="bare",
            source="test://forger",
            type=TASK_COMPLETED,
            subject=run_a,
            data={},
            extensions={"runid": run_a, "actionid": req_a.extensions["actionid"]},
        )
        assert await refused(subjects.result("slow", run_a), bare, token_a) == ("answer-incomplete")
        assert len(await stack.records(run_a)) == before

        # Attempt 1 fails (retryable): attempt 2 is dispatched with a token of its own.
        failed = answer_for(
            req_a,
            event_type=TASK_FAILED,
            data={"error": {"class": "agent_error", "message": "flaky", "retryable": True}},
        )
        await publish(subjects.result("slow", run_a), failed, token_a)
        retry, retry_head = await requests.next(run_a)
        assert retry.extensions["attempt"] == "2"
        assert retry_head[tasks.TOKEN_HEADER] not in (token_a, token_b)
        during = len(await stack.records(run_a))
        # A late answer to attempt 1, genuine token and all, is not applied to attempt 2.
        late = answer_for(req_a, suffix="late")
        assert await refused(subjects.result("slow", run_a), late, token_a) == (
            "answer-stale-attempt"
        )
        # Nor is attempt 1's token good for attempt 2.
        relabelled = answer_for(req_a, attempt="2", suffix="relabelled")
        assert await refused(subjects.result("slow", run_a), relabelled, token_a) == (
            "answer-token"
        )
        assert len(await stack.records(run_a)) == during

        # The genuine answer to attempt 2 completes the run; run B is untouched meanwhile.
        await publish(
            subjects.result("slow", run_a),
            answer_for(retry),
            retry_head[tasks.TOKEN_HEADER],
        )
        assert (await stack.wait(run_a)).status == "completed"
        await publish(subjects.result("slow", run_b), answer_for(req_b), token_b)
        assert (await stack.wait(run_b)).status == "completed"
        # An answer to an action the run no longer awaits.
        again = answer_for(retry, suffix="again")
        assert await refused(
            subjects.result("slow", run_a), again, retry_head[tasks.TOKEN_HEADER]
        ) == ("answer-not-awaited")
        await tap.unsubscribe()
        await letters.unsubscribe()


async def test_task_consumers_are_made_by_the_orchestrator(
    nats_url: str, subjects: Subjects
) -> None:
    """Every capability of the registered AgentDefs gets its consumer without any worker
    running; the token key outlives the orchestrator (a second one makes the same tokens)."""
    async with running_stack(nats_url, subjects, [FLAKY], worker=False) as stack:
        wanted = {tasks.consumer_name(c) for c in ("echo", "strict", "liar", "slow")}

        async def made() -> bool:
            infos = await stack.client.js.consumers_info(subjects.tasks_stream)
            return wanted <= {c.name for c in infos}

        await eventually(made, what="the capability consumers")
        key = stack.orchestrator.answers.tokens.token("slow", "r", "r:1", 1)
    async with running_stack(nats_url, subjects, [FLAKY], worker=False) as stack:
        assert stack.orchestrator.answers.tokens.token("slow", "r", "r:1", 1) == key
