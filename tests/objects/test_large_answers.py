"""Answers of 50 MB, by reference, on a real nats-server with Interlock's auth: from an SDK
worker and from a worker written to the documented protocol with plain nats-py, each on an
agent credential issued as ``interlock creds issue`` makes it. The guard reads the answer
as if inline, ``result`` and ``records`` give it back whole, the log holds a reference; an
object changed after it was referenced fails the read and changes no decision."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.aio.client
import pytest
import pytest_asyncio
from nats.js.object_store import ObjectStore

from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_tags as jwt_tags
from interlock.auth.jwt import creds_user
from interlock.auth.roles import Role, inbox_prefix
from interlock.cli.dev import start_stack, stop_stack
from interlock.client import Client
from interlock.core import events as ev
from interlock.core.objects import parse_ref
from interlock.runtime.embedded import EmbeddedNats
from interlock.sdk import Worker
from interlock.transport import tasks
from interlock.transport.connection import ConnectOptions
from interlock.transport.objects import stream_of
from support.auth import SUBJECTS, Secured, secured_server

__all__ = ["secured_server"]  # fixtures

pytestmark = pytest.mark.timeout(180)

BIG = 50 * 1000 * 1000

MANIFESTS = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata: {name: bulk}
    spec:
      capabilities:
        - name: bulk.sdk
          input_schema: {type: object, required: [text, n], properties: {text: {type: string}}}
          output_schema: {type: object}
        - {name: bulk.raw, input_schema: {type: object}, output_schema: {type: object}}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: bulky}
    spec:
      inputs:
        capability: {type: string, required: true}
        text: {type: string, default: ""}
        n: {type: integer, default: 50000000}
      initial_state: pick
      states:
        pick:
          type: human_in_the_loop
          on:
            - {event: go.sdk, goto: sdk}
            - {event: go.raw, goto: raw}
        sdk:
          actions: [{capability: bulk.sdk, input: {text: "{{ inputs.text }}", n: "{{ inputs.n }}"}}]
          on:
            - event: task.completed
              guard: 'result.score > 7 && size(result.blob) > 1000000'
              goto: done
            - {event: task.completed, goto: refused}
        raw:
          actions: [{capability: bulk.raw, input: {}}]
          on:
            - event: task.completed
              guard: 'result.score > 7 && size(result.blob) > 1000000'
              goto: done
            - {event: task.completed, goto: refused}
        done:
          type: terminal
          outputs:
            score: "{{ result.score }}"
            size: "{{ size(result.blob) }}"
            got: "{{ has(result.got) ? result.got : 0 }}"
        refused:
          type: terminal
    """
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(secured_server: tuple[EmbeddedNats, DevAuth, Path]) -> AsyncIterator[Secured]:
    server, auth, data = secured_server
    running = await start_stack(server.url, auth=auth, agents=False)
    client = await Client.connect(server.url, creds=auth.operator)
    (await client.ops.apply([("<objects>", MANIFESTS)])).compiled.raise_for_errors()
    try:
        yield Secured(server=server, auth=auth, data=data, operator=client.ops)
    finally:
        await client.close()
        await stop_stack(*running)


async def _started(url: str, operator: Path, event: str, **inputs: Any) -> tuple[Client, str]:
    client = await Client.connect(url, creds=operator)
    run_id = await client.start("bulky", {"capability": event, **inputs})
    await client.signal(run_id, event, {}, wait=0)
    return client, run_id


@pytest.mark.asyncio(loop_scope="module")
async def test_a_50_mb_answer_from_an_sdk_worker(stack: Secured) -> None:
    creds = stack.issue(Role("agent", capabilities=("bulk.sdk",)), "bulk-sdk")
    worker = Worker("bulk-sdk")

    @worker.capability("bulk.sdk")
    async def bulk(inp: dict[str, Any]) -> dict[str, Any]:
        return {"score": 9, "blob": "x" * inp["n"], "got": len(inp["text"])}

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(stack.url, creds_file=str(creds)))
    )
    client, run_id = await _started(stack.url, stack.auth.operator, "go.sdk")
    try:
        result = await client.result(run_id, wait=True, timeout=90)
        assert result.status == "completed", result
        assert result.outputs == {"score": 9, "size": BIG, "got": 0}
        # The log holds a reference in the answer's place: the run's own copy, in the
        # orchestrator account's bucket (the agent's upload is its to change or expire).
        raw = await client.ops.read(run_id)
        [done] = [r for r in raw if isinstance(r, ev.ActionCompleted)]
        ref = parse_ref(done.data.result)
        assert ref.bucket == SUBJECTS.objects_bucket
        assert ref.name.startswith(f"{run_id}.")
        assert ref.size > BIG
        # The client gives it back whole.
        [loaded] = [r for r in await client.records(run_id) if isinstance(r, ev.ActionCompleted)]
        assert loaded.data.result["blob"] == "x" * BIG
        # A large task input: stored in its capability's bucket, which the agent reads;
        # checked against the input schema as loaded, at dispatch and by the worker.
        text = "t" * 2_000_000
        second = await client.start("bulky", {"capability": "go.sdk", "text": text, "n": 1_000_001})
        await client.signal(second, "go.sdk", {}, wait=0)
        result = await client.result(second, wait=True, timeout=90)
        assert result.outputs == {"score": 9, "size": 1_000_001, "got": len(text)}, result
        [asked] = [r for r in await client.ops.read(second) if isinstance(r, ev.ActionRequested)]
        assert parse_ref(asked.data.input).bucket == SUBJECTS.inputs_bucket("bulk.sdk")
    finally:
        await client.close()
        await worker.stop()
        await serving


# --- a worker written to docs/agents-any-language.md with plain nats-py -------------------


class RawAgent:
    """An agent as docs/agents-any-language.md describes it, in plain nats-py: the tasks of
    ``bulk.raw`` from its durable consumer, answers by request, a large answer stored in
    its own bucket with nats-py's object store and referenced."""

    def __init__(self, nc: nats.aio.client.Client, bucket: str) -> None:
        self.nc = nc
        self.js = nc.jetstream(prefix=f"{SUBJECTS.prefix}.js.API")
        self.quick_js = nc.jetstream(prefix=f"{SUBJECTS.prefix}.js.API", timeout=0.5)
        self.store = ObjectStore(bucket, stream_of(bucket), self.js)
        self.bucket = bucket

    async def task(self) -> Any:
        sub = await self.js.pull_subscribe_bind("cap_bulk_raw", SUBJECTS.tasks_stream)
        [msg] = await sub.fetch(1, timeout=30)
        await sub.unsubscribe()
        return msg

    async def upload(self, name: str, data: bytes) -> dict[str, Any]:
        info = await self.store.put(name, data)
        meta = {"bucket": self.bucket, "name": name, "size": info.size, "digest": info.digest}
        return {"$object": meta}

    async def upload_by_hand(self, name: str, data: bytes) -> dict[str, Any]:
        """Store ``data`` as a client without an object store does (the documented
        chunks and info), its digest in base64url without padding, as Node's
        ``hash.digest("base64url")`` writes it."""
        nuid = secrets.token_hex(11)
        chunk = 128 * 1024
        parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        for part in parts:
            await self.js.publish(f"$O.{self.bucket}.C.{nuid}", part)
        digest = "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
        digest = digest.rstrip("=")
        info = {"name": name, "bucket": self.bucket, "nuid": nuid, "size": len(data),
                "chunks": len(parts), "digest": digest}  # fmt: skip
        key = base64.urlsafe_b64encode(name.encode()).decode()
        await self.js.publish(
            f"$O.{self.bucket}.M.{key}", json.dumps(info).encode(), headers={"Nats-Rollup": "sub"}
        )
        return {"$object": {"bucket": self.bucket, "name": name, "size": len(data),
                            "digest": digest}}  # fmt: skip

    async def answer(
        self, msg: Any, data: Any, event_type: str = "task.completed"
    ) -> dict[str, str]:
        h = msg.headers
        run_id, action, attempt = h["ce-runid"], h["ce-actionid"], h["ce-attempt"]
        headers = {
            "ce-specversion": "1.0",
            "ce-id": f"{action}.{attempt}.result",
            "ce-source": "interlock://agent/raw",
            "ce-type": event_type,
            "ce-subject": run_id,
            "ce-time": "2026-12-04T00:00:00Z",
            "ce-datacontenttype": "application/json",
            "Content-Type": "application/json",
            "ce-runid": run_id,
            "ce-actionid": action,
            "ce-attempt": attempt,
            "Interlock-Token": h[tasks.TOKEN_HEADER],
        }
        subject = f"{SUBJECTS.prefix}.answer.bulk.raw.{run_id}"
        reply = await self.nc.request(
            subject, json.dumps(data).encode(), headers=headers, timeout=60
        )
        await msg.ack()
        return dict(reply.headers or {})


async def _raw_agent(stack: Secured, name: str) -> RawAgent:
    creds = stack.issue(Role("agent", capabilities=("bulk.raw",)), name)
    tags = [t for t in jwt_tags(creds) if t.startswith("objects:")]
    nc = await nats.connect(
        stack.url, user_credentials=str(creds), inbox_prefix=inbox_prefix(creds_user(creds))
    )
    return RawAgent(nc, tags[0].removeprefix("objects:"))


@pytest.mark.asyncio(loop_scope="module")
async def test_a_50_mb_answer_from_a_worker_written_to_the_protocol(stack: Secured) -> None:
    agent = await _raw_agent(stack, "bulk-raw")
    client, run_id = await _started(stack.url, stack.auth.operator, "go.raw")
    try:
        msg = await agent.task()
        blob = {"score": 9, "blob": "y" * BIG}
        ref = await agent.upload("answer-1", json.dumps(blob).encode())
        said = await agent.answer(msg, ref)
        assert said["Interlock-Answer"] == "recorded", said
        result = await client.result(run_id, wait=True, timeout=60)
        assert result.status == "completed", result
        assert result.outputs == {"score": 9, "size": BIG, "got": 0}
    finally:
        await client.close()
        await agent.nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_whose_digest_has_no_padding_is_taken(stack: Secured) -> None:
    """base64url may leave its padding out (RFC 4648, and Node's digest("base64url")): a
    reference so written names the same bytes and is taken; the log keeps the padded form."""
    agent = await _raw_agent(stack, "bulk-raw-unpadded")
    client, run_id = await _started(stack.url, stack.auth.operator, "go.raw")
    try:
        msg = await agent.task()
        blob = {"score": 9, "blob": "u" * 1_200_000}
        ref = await agent.upload_by_hand("answer-unpadded", json.dumps(blob).encode())
        assert not ref["$object"]["digest"].endswith("=")
        said = await agent.answer(msg, ref)
        assert said["Interlock-Answer"] == "recorded", said
        result = await client.result(run_id, wait=True, timeout=60)
        assert result.status == "completed", result
        assert result.outputs == {"score": 9, "size": 1_200_000, "got": 0}
        [done] = [r for r in await client.records(run_id) if isinstance(r, ev.ActionCompleted)]
        assert done.data.result == blob
    finally:
        await client.close()
        await agent.nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_whose_object_was_replaced_is_refused_and_decides_nothing(
    stack: Secured,
) -> None:
    """The agent stores its answer, then puts other bytes under the same name before it
    answers with the first one's reference: the digest check refuses it, the answer is
    dead-lettered with what failed, and the run still waits for the attempt."""
    agent = await _raw_agent(stack, "bulk-raw-tamper")
    client, run_id = await _started(stack.url, stack.auth.operator, "go.raw")
    try:
        msg = await agent.task()
        ref = await agent.upload(
            "answer-2", json.dumps({"score": 9, "blob": "z" * 2_000_000}).encode()
        )
        # Its put of the same name replaces the meta, then may not purge the old chunks:
        # refused, unanswered (a short timeout rather than the default 5 s).
        quick = ObjectStore(agent.bucket, stream_of(agent.bucket), agent.quick_js)
        with contextlib.suppress(Exception):
            await quick.put("answer-2", json.dumps({"score": 1, "blob": ""}).encode())
        said = await agent.answer(msg, ref)
        assert said["Interlock-Answer"] == "refused", said
        assert said["Interlock-Answer-Reason"] == "bad-object"
        letters = await client.dead_letters("bad-object")
        [letter] = [d for d in letters if d.reason == "bad-object" and run_id in d.subject]
        assert "digest mismatch" in letter.detail
        described = await client.describe(run_id)
        assert described.status == "running"
        assert described.state == "raw"
        assert not [r for r in await client.records(run_id) if isinstance(r, ev.ActionCompleted)]
    finally:
        await client.close()
        await agent.nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_failure_by_reference_whose_retry_after_is_no_wait_is_refused(
    stack: Secured,
) -> None:
    """A failure's ``retry_after`` is checked once its object is loaded, as inline."""
    agent = await _raw_agent(stack, "bulk-raw-retry-after")
    client, run_id = await _started(stack.url, stack.auth.operator, "go.raw")
    try:
        msg = await agent.task()
        error = {"class": "agent_error", "message": "429", "retryable": True, "retry_after": -1}
        ref = await agent.upload("failure-1", json.dumps({"error": error}).encode())
        said = await agent.answer(msg, ref, "task.failed")
        assert said["Interlock-Answer"] == "refused", said
        assert said["Interlock-Answer-Reason"] == "answer-retry-after", said
        records = await client.records(run_id)
        assert not [r for r in records if isinstance(r, ev.ActionFailed)]
    finally:
        await client.close()
        await agent.nc.close()
