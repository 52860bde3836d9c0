"""What a gateway credential of the orchestrator's account (as ``interlock creds issue
gateway`` made them before gateways had accounts of their own) can have the server write
where it may not: a direct get answers with the stored message, headers and all, on the
reply subject the requester names, so a message stored with ``Nats-Rollup: all`` (an
upload's meta, when object buckets took rollups; a party's in its own bucket, which still
does) and then asked for by a direct get with a bucket key as the reply subject reaches
that bucket as a rollup. It wiped every key of the workflows bucket. No key-value bucket
takes a rollup now: the copy is refused and every key stays. (The gateway of its own
account reaches no bucket this way at all: tests/security/test_gateway_account.py.)"""

from __future__ import annotations

import asyncio

import pytest
from test_rollup_copies import party_rollup

from interlock.auth.roles import Role
from interlock.transport.kvread import bucket_values
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


async def keys(secured: Secured, bucket: str) -> list[str]:
    """The bucket's keys, read by direct gets (nats-py's ``KeyValue.keys()`` watches the
    bucket, and may stop before the keys already stored when the server is busy)."""
    return sorted(await bucket_values(await secured.operator.js.key_value(bucket)))


async def test_a_rollup_copied_onto_a_bucket_key_wipes_nothing(secured: Secured) -> None:
    targets = [SUBJECTS.workflows_bucket, SUBJECTS.agents_bucket, SUBJECTS.runs_bucket]
    run_id = await secured.operator.start("awaiting", {})

    async def indexed() -> bool:
        return run_id in await keys(secured, SUBJECTS.runs_bucket)

    await eventually(indexed, what="the run in the run index")
    before = {bucket: await keys(secured, bucket) for bucket in targets}
    assert all(before.values()), before

    creds = secured.data / "copying-gateway.creds"
    shared_account_user(secured.auth.keys, Role("gateway"), "copying-gateway", creds)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    # The rollup is stored where rollups are taken: a party's own bucket (the uploads
    # bucket, where the gateway stored it before, takes none now).
    stream, subject = await party_rollup(secured)
    try:
        for bucket in targets:
            await nc.publish(
                f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", reply=f"$KV.{bucket}.zz-copied"
            )
        await nc.flush()
    finally:
        await nc.close()
    assert not refusals.errors  # nothing refused the gateway: the buckets are the fence
    await asyncio.sleep(0.5)  # the copies are written (or refused) by the server
    after = {bucket: await keys(secured, bucket) for bucket in targets}
    assert after == before
