"""A publisher's reference to an object of its own bucket whose meta (which it writes)
names thousands of empty chunks, as the publisher would write it: its own credential (as
``interlock creds issue publisher`` makes it) and raw publishes on its bucket's chunk and
meta subjects. The orchestrator read every chunk the meta named before it found the bytes
did not match, at every event naming it: a few bytes of event for as many reads as the
publisher wrote once. Now a meta of more chunks than its size allows is refused before
any chunk is read (dead letter ``bad-object``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from interlock.auth.jwt import creds_tags
from interlock.auth.roles import Role
from interlock.core.objects import digest_of
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHUNKS = 3_000


async def test_a_meta_of_many_empty_chunks_is_refused_unread(secured: Secured) -> None:
    creds = secured.issue(Role("publisher", events=("acme.>",)), "chunky-publisher")
    [bucket] = [t.removeprefix("objects:") for t in creds_tags(creds) if t.startswith("objects:")]
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    js = nc.jetstream(prefix=SUBJECTS.party_js_api)
    data = b'"0123456789"'
    digest = digest_of(data)
    try:
        for _ in range(CHUNKS):
            await nc.publish(f"$O.{bucket}.C.flood", b"")
        meta = {
            "name": "doc", "bucket": bucket, "nuid": "flood", "size": len(data),
            "chunks": CHUNKS, "digest": digest,
        }  # fmt: skip
        await js.publish(f"$O.{bucket}.M.ZG9j", json.dumps(meta).encode())  # "doc"
        ref = {"bucket": bucket, "name": "doc", "size": len(data), "digest": digest}
        headers = {
            "ce-specversion": "1.0", "ce-id": "chunky-1", "ce-source": "https://acme.example",
            "ce-type": "acme.order.placed", "Content-Type": "application/json",
        }  # fmt: skip
        body = json.dumps({"$object": ref}).encode()
        await js.publish(f"{SUBJECTS.prefix}.events.acme.order.placed", body, headers=headers)
    finally:
        await nc.close()
    assert not refusals.errors
    for _ in range(600):
        letters = [
            d
            for d in await secured.operator.dead_letters("bad-object")
            if "chunky-1" in json.dumps(d.headers)
        ]
        if letters:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the event was not dead-lettered")
    assert f"{CHUNKS} chunks for {len(data)} bytes" in letters[0].detail, letters[0].detail
