"""An agent's answer naming a large object of its own bucket, for an attempt the run no
longer awaits, as the agent would send it (its credential as ``interlock creds issue
agent`` makes it, plain nats-py, answers by request). An answer's token verifies for an
attempt answered long ago as well as for a fresh one, and the orchestrator loaded the
answer's object (read, hashed, decoded: up to 64 MiB) before it looked whether the run
awaited that attempt: an agent that had had one task could make it do so again and
again. Now the run must await the attempt first; a late answer loads nothing."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import nats
import pytest

from interlock.auth.jwt import creds_tags, creds_user
from interlock.auth.roles import Role, inbox_prefix
from interlock.core import events as ev
from interlock.core.objects import digest_of
from interlock.transport import tasks
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.objects import store_object
from support.auth import SUBJECTS, Secured, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _answer(msg: nats.aio.msg.Msg, n: int) -> dict[str, str]:
    h = msg.headers or {}
    return {
        "ce-specversion": "1.0", "ce-id": f"answer-{n}", "ce-source": "interlock://agent/rogue",
        "ce-type": "task.completed", "ce-subject": h["ce-runid"],
        "ce-datacontenttype": "application/json", "Content-Type": "application/json",
        "ce-runid": h["ce-runid"], "ce-actionid": h["ce-actionid"],
        "ce-attempt": h["ce-attempt"], "Interlock-Token": h[tasks.TOKEN_HEADER],
    }  # fmt: skip


async def test_a_late_answer_naming_an_object_loads_nothing(secured: Secured) -> None:
    creds = secured.issue(Role("agent", capabilities=("held",)), "rogue-held")
    [bucket] = [t.removeprefix("objects:") for t in creds_tags(creds) if t.startswith("objects:")]
    orchestrator = secured.orchestrator
    order = CloudEvent(id=secrets.token_hex(4), source="test", type="acme.order.placed", data={})
    await secured.operator.emit(order)
    nc = await nats.connect(
        secured.url, user_credentials=str(creds), inbox_prefix=inbox_prefix(creds_user(creds))
    )
    try:
        js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=10)
        sub = await js.pull_subscribe_bind("cap_held", SUBJECTS.tasks_stream)
        [task] = await sub.fetch(1, timeout=30)
        run_id = task.headers["ce-runid"]
        subject = f"{SUBJECTS.prefix}.answer.held.{run_id}"
        reply = await nc.request(subject, b"{}", headers=_answer(task, 0), timeout=30)
        assert reply.headers[tasks.ANSWER_HEADER] == tasks.ANSWER_RECORDED, reply.headers
        await task.ack()

        data = json.dumps({"blob": os.urandom(1 << 20).hex()}).encode()
        await store_object(js, bucket, "late", data)
        ref = {"bucket": bucket, "name": "late", "size": len(data), "digest": digest_of(data)}
        reads = orchestrator.payloads.reads
        for n in range(1, 4):  # the same attempt's token, answered already
            body = json.dumps({"$object": ref}).encode()
            reply = await nc.request(subject, body, headers=_answer(task, n), timeout=30)
            assert reply.headers[tasks.ANSWER_HEADER] != tasks.ANSWER_RECORDED, reply.headers
        assert orchestrator.payloads.reads == reads  # nothing loaded for them
    finally:
        await nc.close()

    async def ended() -> bool:
        return isinstance((await secured.operator.read(run_id))[-1], ev.RunCompleted)

    await eventually(ended, what="the run ended on its one answer")


async def test_an_answer_sent_again_and_again_reads_the_log_once(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token verifies for as long as the agent keeps it, and an answer to an attempt no
    longer awaited made the orchestrator read the run's whole log to tell a copy of the
    answer taken (replied ``recorded``) from a late one: an agent that had had one task of a
    long run could have it read that log at every copy it sent. It is read once per
    attempt; the copies, the same answer or others, are told what the first was."""
    creds = secured.issue(Role("agent", capabilities=("held",)), "rogue-held")
    order = CloudEvent(id=secrets.token_hex(4), source="test", type="acme.order.placed", data={})
    await secured.operator.emit(order)
    nc = await nats.connect(
        secured.url, user_credentials=str(creds), inbox_prefix=inbox_prefix(creds_user(creds))
    )
    reads: list[str] = []
    log = secured.orchestrator.run_log
    read = log.read

    async def counted(run_id: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(run_id)
        return await read(run_id, *args, **kwargs)

    try:
        js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=10)
        sub = await js.pull_subscribe_bind("cap_held", SUBJECTS.tasks_stream)
        [task] = await sub.fetch(1, timeout=30)
        run_id = task.headers["ce-runid"]
        subject = f"{SUBJECTS.prefix}.answer.held.{run_id}"
        reply = await nc.request(subject, b"{}", headers=_answer(task, 0), timeout=30)
        assert reply.headers[tasks.ANSWER_HEADER] == tasks.ANSWER_RECORDED, reply.headers
        await task.ack()
        monkeypatch.setattr(log, "read", counted)
        for n in range(20):
            reply = await nc.request(subject, b"{}", headers=_answer(task, 0), timeout=30)
            assert reply.headers[tasks.ANSWER_HEADER] == tasks.ANSWER_RECORDED, reply.headers
            other = await nc.request(subject, b"{}", headers=_answer(task, n + 1), timeout=30)
            assert other.headers[tasks.ANSWER_HEADER] != tasks.ANSWER_RECORDED, other.headers
    finally:
        await nc.close()
    assert reads.count(run_id) <= 1, len(reads)
