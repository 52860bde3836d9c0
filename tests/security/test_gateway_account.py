"""The HTTP gateway's credential (as ``interlock creds issue gateway`` makes it) is a user of
an account of its own: no reply subject it names reaches a stream, a bucket or a run log of
the orchestrator's account, whatever answers it.

A direct get answers with a stored message, bytes and headers, on the reply subject its
requester names, and JetStream writes its acknowledgements there too. A gateway of the
orchestrator's account (as it was) had a token record it stored copied onto the HTTP
tokens bucket, where it was an operator's token; the same request as the gateway of its
own account reaches nothing: not the tokens, workflows, AgentDefs, slots, partition map
or a run log, not a subject its own account imports, not the orchestrator's own subjects
(tasks, answers, timers, handovers, cancel notices: a shared-account gateway's copy and
acknowledgement were both heard there), and no purge."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client
from test_role_cli import issued

from interlock.auth.accounts import JS_API_TAG
from interlock.auth.jwt import creds_tags
from interlock.auth.roles import JS_API, Role
from interlock.gateway.auth import Tokens, hash_token
from interlock.runtime.partitioning import set_partitions
from interlock.transport.partitions import read_map
from support.auth import (
    SUBJECTS,
    Refusals,
    Secured,
    plain_client,
    secured,
    secured_server,
    shared_account_user,
)
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

API = SUBJECTS.party_js_api
DELIVERIES = SUBJECTS.deliveries_bucket
TOKEN = "forged-operator-token-0123456789abcdef"
RECORD = json.dumps({"created": 1, "events": [], "name": "forged", "role": "operator"}).encode()
"""A token record as ``interlock tokens create`` writes it, for ``TOKEN``."""


@dataclass
class Attacker:
    nc: Client
    refusals: Refusals
    api: str
    """Where its account has the JetStream API: ``il.js.API``, or ``$JS.API`` as a user of
    the orchestrator's account."""

    async def store(self, key: str, value: bytes) -> None:
        """Put ``value`` under ``key`` of the deliveries bucket (the gateway writes it: the
        webhook replay guard), acknowledged."""
        ack = await self.nc.request(f"$KV.{DELIVERIES}.{key}", value, timeout=5)
        assert b'"seq"' in ack.data, ack.data

    async def copy(self, key: str, onto: str) -> None:
        """A direct get of ``key`` answered on ``onto``; returns once the same get, asked
        after it on this connection, has been answered (the server has handled it)."""
        api = f"{self.api}.DIRECT.GET.KV_{DELIVERIES}"
        body = json.dumps({"last_by_subj": f"$KV.{DELIVERIES}.{key}"}).encode()
        await self.nc.publish(api, body, reply=onto)
        answer = await self.nc.request(api, body, timeout=5)
        assert (answer.headers or {}).get("Nats-Sequence"), answer.headers

    async def ack_onto(self, onto: str) -> None:
        """An event published with ``onto`` as its reply subject: JetStream writes its
        acknowledgement there; returns once a second event's acknowledgement came back."""
        headers = {"ce-specversion": "1.0", "ce-source": "s", "ce-type": "acme.reflected"}
        await self.nc.publish(
            "il.events.acme.reflected", b"{}", reply=onto, headers={**headers, "ce-id": onto}
        )
        ack = await self.nc.request(
            "il.events.acme.reflected", b"{}", headers={**headers, "ce-id": "control"}, timeout=5
        )
        assert b'"seq"' in ack.data, ack.data


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(secured: Secured) -> AsyncIterator[Attacker]:
    creds = await issued(secured, "gateway")
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        yield Attacker(nc, refusals, API)
    finally:
        await nc.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_gateway(secured: Secured) -> AsyncIterator[Attacker]:
    """A gateway credential of the orchestrator's account, as ``creds issue`` made them."""
    path = secured.data / "shared-gateway.creds"
    shared_account_user(secured.auth.keys, Role("gateway"), "shared-gateway", path)
    refusals = Refusals()
    nc = await plain_client(secured.url, path, refusals)
    try:
        yield Attacker(nc, refusals, JS_API)
    finally:
        await nc.close()


async def test_the_issued_credential_names_its_api_prefix(secured: Secured) -> None:
    creds: Path = await issued(secured, "gateway")
    assert JS_API_TAG + API in creds_tags(str(creds))
    record = next(i for i in secured.auth.keys.issued() if i.name == "cli-gateway")
    assert record.account is not None
    assert record.account != secured.auth.keys.account_public_key


async def test_a_token_record_copied_by_a_direct_get_is_no_token(
    secured: Secured, gateway: Attacker, shared_gateway: Attacker
) -> None:
    tokens = Tokens(secured.operator.js, SUBJECTS)
    key = "t." + hash_token(TOKEN)
    onto = f"$KV.{SUBJECTS.http_tokens_bucket}.{key}"
    # As the gateway of its own account: nothing reaches the tokens bucket.
    await gateway.store("forged-token", RECORD)
    await gateway.copy("forged-token", onto)
    assert await tokens.caller(TOKEN, max_age=0) is None
    assert key not in {item["key"] for item in await tokens.list()}
    assert not gateway.refusals.errors
    # The same, as a gateway of the orchestrator's account: an operator's token.
    await shared_gateway.store("forged-token-2", RECORD)
    await shared_gateway.copy("forged-token-2", onto)

    async def minted() -> bool:
        found = await tokens.caller(TOKEN, max_age=0)
        return found is not None and found.role == "operator"

    await eventually(minted, what="the copied token record")
    await (await tokens.kv()).delete(key)


async def _keys(secured: Secured, bucket: str) -> dict[str, int]:
    from interlock.transport.kvread import bucket_values

    kv = await secured.operator.js.key_value(bucket)
    values = await bucket_values(kv)
    return {k: len(v) for k, v in values.items()}


COPIED_ONTO = {
    "a workflow": (SUBJECTS.workflows_bucket, "latest.default.forged"),
    "an AgentDef": (SUBJECTS.agents_bucket, "forged"),
    "a slot": (SUBJECTS.slots_bucket, "forged"),
    "a trigger window": (SUBJECTS.triggers_bucket, "forged"),
    "a partition's lease": (SUBJECTS.partitions_bucket, "owner.0"),
    # Buckets its own account imports: an answer does not go through an import.
    "a pause": (SUBJECTS.paused_bucket, "forged"),
}


@pytest.mark.parametrize("target", list(COPIED_ONTO), ids=list(COPIED_ONTO))
async def test_a_copy_or_an_acknowledgement_reaches_no_bucket(
    secured: Secured, gateway: Attacker, target: str
) -> None:
    bucket, key = COPIED_ONTO[target]
    before = await _keys(secured, bucket)
    await gateway.store(f"copy-{bucket}", b'{"forged": true}')
    await gateway.copy(f"copy-{bucket}", f"$KV.{bucket}.{key}")
    await gateway.ack_onto(f"$KV.{bucket}.{key}.acked")
    assert await _keys(secured, bucket) == before
    assert not gateway.refusals.errors


async def test_nothing_reaches_a_run_log(secured: Secured, gateway: Attacker) -> None:
    run_id = await secured.operator.start("awaiting", {})

    async def waiting() -> bool:
        return (await secured.operator.state(run_id)).state == "waiting"

    await eventually(waiting, what="the run waiting")
    before = [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]
    log = SUBJECTS.run(run_id)
    await gateway.store("to-the-log", b'{"forged": true}')
    await gateway.copy("to-the-log", log)
    await gateway.ack_onto(log)
    # Nor an event addressed to the run (its account imports both subjects).
    await gateway.ack_onto(SUBJECTS.addressed(run_id, "acme.order.approved"))
    after = [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]
    assert after == before
    assert (await secured.operator.state(run_id)).state == "waiting"


HEARD_ON = {
    "a task of echo": lambda run: SUBJECTS.capability("echo"),
    "an answer": lambda run: SUBJECTS.result("held", run),
    "an answer by request": lambda run: SUBJECTS.answer("held", run),
    "a fired timer": lambda run: SUBJECTS.timer_fired(run),
    "a handover to a partition's holder": lambda run: SUBJECTS.owner(0, "event", run),
    "a cancel notice": lambda run: SUBJECTS.control("held", run),
}


@pytest.mark.parametrize("target", list(HEARD_ON), ids=list(HEARD_ON))
async def test_nothing_is_heard_on_the_orchestrators_subjects(
    secured: Secured, gateway: Attacker, target: str
) -> None:
    """What an orchestrator would take from these subjects (listened to here as one,
    before the attempt; a flush after it: the server sent whatever came first)."""
    subject = HEARD_ON[target]("r" + "0" * 25)
    listener = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        heard = await listener.subscribe(subject)
        await listener.flush()
        await gateway.store("heard", b'{"forged": true}')
        await gateway.copy("heard", subject)
        await gateway.ack_onto(subject)
        await listener.flush()
        assert heard.pending_msgs == 0
    finally:
        await listener.close()
    assert not gateway.refusals.errors


async def test_no_purge(secured: Secured, gateway: Attacker) -> None:
    runs = SUBJECTS.runs_stream
    before = (await secured.operator.js.stream_info(runs)).state
    assert before.messages > 0
    # As the reply subject of what it sends: an API request of its own account, where
    # no stream is (under the orchestrator's name and under its own prefix).
    for onto in (f"{JS_API}.STREAM.PURGE.{runs}", f"{API}.STREAM.PURGE.{runs}"):
        await gateway.ack_onto(onto)
        await gateway.store("purge", b"{}")
        await gateway.copy("purge", onto)
    assert not gateway.refusals.errors
    # Asked directly: refused by the server (and imported by nothing).
    for subject in (f"{API}.STREAM.PURGE.{runs}", f"{JS_API}.STREAM.PURGE.{runs}"):
        await gateway.nc.publish(subject, b"{}", reply=gateway.nc.new_inbox())
        await gateway.refusals.wait_for("permissions violation", subject)
    after = (await secured.operator.js.stream_info(runs)).state
    assert (after.first_seq, after.messages >= before.messages) == (before.first_seq, True)


async def test_a_well_formed_map_copied_onto_the_map_changes_nothing(
    secured: Secured, gateway: Attacker
) -> None:
    # Last in this file: the runs' subjects are those of two partitions from now on.
    await set_partitions(secured.operator.nc, SUBJECTS, 2)
    kv = await secured.operator.js.key_value(SUBJECTS.partitions_bucket)
    entry = await kv.get("map")
    good, _ = await read_map(secured.operator.nc, SUBJECTS)
    forged = msgspec.json.decode(entry.value or b"{}")
    forged["streams"] = 1
    await gateway.store("forged-map", msgspec.json.encode(forged))
    await gateway.copy("forged-map", f"$KV.{SUBJECTS.partitions_bucket}.map")
    await gateway.ack_onto(f"$KV.{SUBJECTS.partitions_bucket}.map")
    assert (await kv.get("map")).revision == entry.revision
    assert (await read_map(secured.operator.nc, SUBJECTS))[0] == good
