"""An agent's retry-after, on a secured installation, as agents on their own credentials
send it: the SDK's ``RetryableError(retry_after=...)`` holds the next attempt back until
then (the run's log says so), a retry-after too large is clamped to an hour, and one that
is no wait at all (negative, text that is no instant) is refused with its reason, in the
reply and as a dead letter, and never reaches the run's log. Real nats-server with
Interlock's decentralized auth."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.core.retryafter import RETRY_AFTER_MAX_S
from interlock.core.rfc3339 import parse_time
from interlock.sdk import RetryableError, Worker
from interlock.transport import tasks
from interlock.transport.cloudevents import decode_message
from interlock.transport.connection import ConnectOptions
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

MANIFESTS = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: quota
    spec:
      capabilities:
        - name: quota.sdk
          input_schema: {type: object}
          output_schema: {type: object}
        - name: quota.raw
          input_schema: {type: object}
          output_schema: {type: object}
        - name: quota.rated
          input_schema: {type: object}
          output_schema: {type: object}
          rate: {limit: 600, per: 1m}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: quota-sdk
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: quota.sdk
              input: {}
              retry: {max_attempts: 3, backoff: {initial: 100ms, jitter: false}}
          on:
            - {event: task.completed, goto: done}
        done: {type: terminal}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: quota-raw
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: quota.raw
              input: {}
              retry: {max_attempts: 3, backoff: {initial: 100ms, jitter: false}}
          on:
            - {event: task.completed, goto: done}
        done: {type: terminal}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: quota-rated
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: quota.rated
              input: {}
              retry: {max_attempts: 3, backoff: {initial: 100ms, jitter: false}}
          on:
            - {event: task.completed, goto: done}
        done: {type: terminal}
    """
)


async def _applied(secured: Secured) -> None:
    applied = await secured.operator.apply([("<quota>", MANIFESTS)])
    applied.compiled.raise_for_errors()


async def _records(secured: Secured, run_id: str, kind: type[Any], n: int) -> list[Any]:
    """The first ``n`` records of type ``kind`` in the run's log, once there are that many."""
    for _ in range(600):
        found = [r for r in await secured.operator.read(run_id) if isinstance(r, kind)]
        if len(found) >= n:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {n} {kind.__name__} in {run_id}")


async def test_the_sdk_retry_after_holds_the_next_attempt_back(secured: Secured) -> None:
    await _applied(secured)
    creds = secured.issue(Role("agent", capabilities=("quota.sdk",)), "quota-sdk-agent")
    worker = Worker("quota-sdk-agent", grace_period=1.0)
    calls: list[int] = []

    @worker.capability("quota.sdk")
    async def call(inp: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RetryableError("429 Too Many Requests", code="rate_limited", retry_after=1.5)
        return {"calls": len(calls)}

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(creds)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        run_id = await secured.operator.start("quota-sdk", {})
        state = await secured.operator.wait(run_id, timeout=30)
        assert state.status == "completed"
    finally:
        await worker.stop(force=True)
        await serving
    log = await secured.operator.read(run_id)
    failed = next(r for r in log if isinstance(r, ev.ActionFailed))
    timer = next(r for r in log if isinstance(r, ev.TimerScheduled))
    requests = [r for r in log if isinstance(r, ev.ActionRequested)]
    assert failed.data.error.retry_after_s == 1.5
    assert failed.data.error.code == "rate_limited"
    assert timer.data.retry_after_s == 1.5
    assert timer.data.backoff_s == 0.1
    fire_at = parse_time(timer.data.fire_at)
    assert (fire_at - parse_time(failed.time)).total_seconds() == 1.5
    # The second attempt was asked for by the timer, not before it was due.
    assert [r.data.attempt for r in requests] == [1, 2]
    assert parse_time(requests[1].time) >= fire_at


async def test_a_retry_after_holds_the_rate_of_the_key_for_other_runs(secured: Secured) -> None:
    """A 429 with a retry-after spends the key's budget for everyone: a run asking for the
    capability after it waits for the same instant (one token a tenth of a second
    otherwise)."""
    await _applied(secured)
    creds = secured.issue(Role("agent", capabilities=("quota.rated",)), "quota-rated-agent")
    worker = Worker("quota-rated-agent", grace_period=1.0)
    calls: list[int] = []

    @worker.capability("quota.rated")
    async def call(inp: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RetryableError("429 Too Many Requests", code="rate_limited", retry_after=1.5)
        return {}

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(creds)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        first = await secured.operator.start("quota-rated", {})
        [failed] = await _records(secured, first, ev.ActionFailed, 1)
        second = await secured.operator.start("quota-rated", {})
        for run_id in (first, second):
            state = await secured.operator.wait(run_id, timeout=30)
            assert state.status == "completed"
    finally:
        await worker.stop(force=True)
        await serving
    assert failed.data.freed is not None
    held_until = failed.data.freed.rate_held_until
    assert held_until is not None
    assert (parse_time(held_until) - parse_time(failed.time)).total_seconds() == 1.5
    # Neither the other run's request nor the retry went out before then.
    admissions = [
        r
        for run_id in (first, second)
        for r in await secured.operator.read(run_id)
        if isinstance(r, ev.ActionAdmitted)
    ]
    assert len(admissions) == 3
    late = [r for r in admissions if r.time >= held_until]
    assert len(late) == 2, [(r.subject, r.time) for r in admissions]
    assert next(r for r in admissions if r not in late).subject == first


async def _task(nc: Client) -> Any:
    """The next task of ``quota.raw``, taken as a worker in any language does."""
    js = nc.jetstream(prefix=SUBJECTS.party_js_api)
    sub = await js.pull_subscribe_bind(
        durable=tasks.consumer_name("quota.raw"), stream=SUBJECTS.tasks_stream
    )
    msgs = await sub.fetch(1, timeout=30)
    return msgs[0]


async def _fail(nc: Client, task: Any, retry_after: Any) -> dict[str, str]:
    """Answer ``task`` by request with a retryable failure carrying ``retry_after``."""
    request = decode_message(task.headers, task.data)
    error = {"class": "agent_error", "message": "429", "retryable": True}
    event = tasks.answer_event(
        run_id=request.extensions["runid"],
        action_id=request.extensions["actionid"],
        attempt=int(request.extensions["attempt"]),
        event_id=f"{request.id}.{request.extensions['attempt']}.{msgspec.json.encode(retry_after)!r}",
        source="interlock://agent/raw",
        type="task.failed",
        data={"error": error | {"retry_after": retry_after}},
        time="2026-01-01T00:00:00Z",
    )
    headers, payload = tasks.encode_result(event, token=(task.headers or {})[tasks.TOKEN_HEADER])
    subject = SUBJECTS.answer("quota.raw", event.extensions["runid"])
    reply = await nc.request(subject, payload, headers=headers, timeout=10)
    return dict(reply.headers or {})


# The last one's detail, in the reply's headers, must not end the header nor forge another.
@pytest.mark.parametrize(
    "garbage", [-5, "tomorrow", "2026-01-01", True, {"s": 1}, "soon\r\nX-Forged: 1 \u2192"]
)
async def test_a_retry_after_that_is_no_wait_is_refused(secured: Secured, garbage: Any) -> None:
    await _applied(secured)
    creds = secured.issued.get("quota-raw-agent") or secured.issue(
        Role("agent", capabilities=("quota.raw",)), "quota-raw-agent"
    )
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        run_id = await secured.operator.start("quota-raw", {})
        task = await _task(nc)
        before = await secured.operator.read(run_id)
        reply = await _fail(nc, task, garbage)
        assert reply[tasks.ANSWER_HEADER] == tasks.ANSWER_REFUSED
        assert reply[tasks.ANSWER_REASON_HEADER] == "answer-retry-after"
        # The agent is told what was wrong (it may not read the dead letter).
        detail = reply[tasks.ANSWER_DETAIL_HEADER]
        assert "attempt 1: retry_after " in detail, detail
        assert detail.isascii(), detail
        assert detail.isprintable(), detail
        assert "X-Forged" not in reply, reply
        assert await secured.operator.read(run_id) == before  # nothing of it in the log
        letters = await secured.operator.dead_letters("answer-retry-after")
        assert any(run_id in letter.detail or run_id in letter.subject for letter in letters)
        # Answered right, the same attempt is still taken.
        reply = await _fail(nc, task, 0)
        assert reply[tasks.ANSWER_HEADER] == "recorded"
        await task.ack()
        await secured.operator.cancel(run_id)
    finally:
        await nc.close()
    assert not refusals.errors


async def test_a_huge_retry_after_is_clamped_to_an_hour(secured: Secured) -> None:
    await _applied(secured)
    creds = secured.issued.get("quota-raw-agent") or secured.issue(
        Role("agent", capabilities=("quota.raw",)), "quota-raw-agent"
    )
    nc = await plain_client(secured.url, creds, Refusals())
    try:
        run_id = await secured.operator.start("quota-raw", {})
        task = await _task(nc)
        reply = await _fail(nc, task, 1e300)
        assert reply[tasks.ANSWER_HEADER] == "recorded"
        await task.ack()
    finally:
        await nc.close()
    [failed] = await _records(secured, run_id, ev.ActionFailed, 1)
    [timer] = await _records(secured, run_id, ev.TimerScheduled, 1)
    assert failed.data.error.retry_after_s == RETRY_AFTER_MAX_S
    waited = parse_time(timer.data.fire_at) - parse_time(failed.time)
    assert waited.total_seconds() == RETRY_AFTER_MAX_S
    await secured.operator.cancel(run_id)
