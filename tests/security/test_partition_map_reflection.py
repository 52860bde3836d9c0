"""The partition map against what a user of the orchestrator's account can have written
onto its key: a gateway credential of that account (as ``interlock creds issue gateway``
made them before gateways had accounts of their own) names the map's KV subject as the
reply subject of an event it publishes, and JetStream writes its acknowledgement there.
Every field of the map has a default, so that value read as a map of one partition: new
runs went to partition 0 whatever their hash, and the next ``partitions set`` would have
dropped the layouts runs in flight are placed by. The orchestrators keep the map they read
last, and a fresh reader says the map is damaged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_role_cli import cli

from interlock.auth.roles import Role
from interlock.runtime.ownership import owners
from interlock.runtime.partitioning import set_partitions
from interlock.transport import partitions
from interlock.transport.partitions import partition_of, read_map
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

MAP = f"$KV.{SUBJECTS.partitions_bucket}.map"
FRESH_S = 0.5


def reflecting_gateway(secured: Secured) -> Path:
    """A gateway credential of the orchestrator's account (the layout before gateways had
    accounts of their own; tests/security/test_gateway_account.py: the gateway of its own
    account reaches nothing this way)."""
    path = secured.data / "reflecting-gateway.creds"
    if not path.exists():
        shared_account_user(secured.auth.keys, Role("gateway"), "reflecting-gateway", path)
    return path


async def stored_in(secured: Secured, run_id: str, partition: int) -> bool:
    api = f"$JS.API.STREAM.MSG.GET.{SUBJECTS.runs_stream_of(partition)}"
    body = json.dumps({"last_by_subj": SUBJECTS.run_in(run_id, partition)}).encode()
    reply = json.loads((await secured.operator.nc.request(api, body, timeout=5)).data)
    return "error" not in reply


async def acknowledged(secured: Secured, key: str) -> Any:
    """The partitions bucket's entry of ``key`` once it holds the JetStream acknowledgement
    reflected onto it (the server writes it there a moment after it stores the event)."""
    kv = await secured.operator.js.key_value(SUBJECTS.partitions_bucket)

    async def written() -> Any:
        entry = await kv.get(key)
        try:
            value = json.loads(entry.value or b"")
        except ValueError:
            return None
        return entry if isinstance(value, dict) and "stream" in value else None

    return await eventually(written, what=f"the acknowledgement written onto {key}")


async def started_in(secured: Secured, partition: int) -> str:
    """A run of ``awaiting`` whose id hashes to ``partition`` of 2."""
    for _ in range(40):
        run_id = await secured.operator.start("awaiting", {})
        if partition_of(run_id, 2) == partition:
            return run_id
    raise AssertionError(f"no run hashed to partition {partition}")


async def test_an_acknowledgement_written_onto_the_map_is_not_one_partition(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs are placed by a map read at most PLACE_FRESH_S (5 s) before: shortened here, so
    # that the map is read again within a second, not five.
    monkeypatch.setattr(partitions, "PLACE_FRESH_S", FRESH_S)
    await set_partitions(secured.operator.nc, SUBJECTS, 2)
    # Wait until the orchestrator's map is the new one.
    for _ in range(100):
        run_id = await started_in(secured, 1)
        if await stored_in(secured, run_id, 1):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the orchestrator never placed a run in partition 1")
    good, _ = await read_map(secured.operator.nc, SUBJECTS)

    creds = reflecting_gateway(secured)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        headers = {"ce-specversion": "1.0", "ce-id": "r1", "ce-source": "s", "ce-type": "acme.x"}
        await nc.publish("il.events.acme.x", b"{}", reply=MAP, headers=headers)
        await nc.flush()
    finally:
        await nc.close()
    assert not refusals.errors  # the server took it: the fence is the reader
    raw = await acknowledged(secured, "map")
    assert json.loads(raw.value or b"")["stream"] == SUBJECTS.events_stream

    # A reader that never read the map says it is damaged, where it said one partition.
    code, out, errs, _ = await cli(secured, secured.auth.operator, "partitions", "--json")
    assert code != 0, out
    assert "the partition map (il_partitions/map) is damaged" in errs, errs
    code, out, errs, _ = await cli(secured, secured.auth.operator, "partitions", "set", "3")
    assert code != 0, out
    assert "damaged" in errs, errs

    # The orchestrator reads the map again before it places runs (at most FRESH_S old)
    # and goes on with the one it read before: a run hashing to partition 1 is stored there.
    await asyncio.sleep(FRESH_S * 1.5)
    for _ in range(3):
        run_id = await started_in(secured, 1)
        assert await stored_in(secured, run_id, 1), run_id
        assert not await stored_in(secured, run_id, 0), run_id
    # The operator puts the map back (the value the orchestrators log) and all is as before.
    kv = await secured.operator.js.key_value(SUBJECTS.partitions_bucket)
    await kv.put("map", msgspec.json.encode(good))
    assert (await read_map(secured.operator.nc, SUBJECTS))[0] == good


async def test_an_acknowledgement_written_onto_a_lease_keeps_no_partition(
    secured: Secured,
) -> None:
    """A lease key holds its owner's name with a TTL; an acknowledgement written there has
    neither, and counted as a live lease: the holder's next renewal found the key changed
    and let the partition go, and no replica took it again (nothing relayed it)."""
    await set_partitions(secured.operator.nc, SUBJECTS, 2)

    async def both_held() -> dict[int, str] | None:
        found = await owners(secured.operator.nc, SUBJECTS)
        return found if set(found) == {0, 1} else None

    await eventually(both_held, what="both partitions held")
    creds = reflecting_gateway(secured)
    nc = await plain_client(secured.url, creds, Refusals())
    try:
        headers = {"ce-specversion": "1.0", "ce-id": "r2", "ce-source": "s", "ce-type": "acme.x"}
        lease = f"$KV.{SUBJECTS.partitions_bucket}.owner.1"
        await nc.publish("il.events.acme.x", b"{}", reply=lease, headers=headers)
        await nc.flush()
    finally:
        await nc.close()
    kv = await secured.operator.js.key_value(SUBJECTS.partitions_bucket)
    junk = (await acknowledged(secured, "owner.1")).revision

    async def taken_again() -> bool:
        entry = await kv.get("owner.1")
        return entry.revision > junk and 1 in await owners(secured.operator.nc, SUBJECTS)

    await eventually(taken_again, within=20, what="partition 1's lease taken again")
