"""An agent's flood of heartbeats, as it would send it: its own credential (as ``interlock
creds issue agent`` makes it) and plain nats-py, puts under its own capability's keys in
the workers bucket, each with an instance name of its choosing and as many bytes as a
message takes. Every listing of workers (``interlock agents``, ``GET /agents``, the
orchestrator's metrics every 10 s) reads the whole bucket: unbounded, one agent's flood
made each of them as large as the flood, for the 15 s its keys live. The bucket takes no
heartbeat over 64 KiB and holds 64 MiB at most (1 MiB here): past that, puts are refused
until keys expire, and a listing reads no more than that."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from interlock.auth.roles import Role
from interlock.transport import streamconfigs
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOUND = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def small_bucket() -> Iterator[None]:
    """The workers bucket made with a bound of 1 MiB (where 64 MiB), so that the flood
    that fills it is small."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streamconfigs, "WORKERS_MAX_BYTES", BOUND)
        yield


def heartbeat(instance: str, size: int) -> bytes:
    record = {
        "name": "flood",
        "instance": instance,
        "capabilities": ["held"],
        "concurrency": 1,
        "in_flight": 0,
        "started_at": "2026-01-01T00:00:00Z",
        "heartbeat_at": "2026-01-01T00:00:00Z",
        "padding": "x" * size,
    }
    return json.dumps(record).encode()


async def test_a_flood_of_heartbeats_is_bounded(secured: Secured) -> None:
    creds = secured.issue(Role("agent", capabilities=("held",)), "flooding-agent")
    nc = await plain_client(secured.url, creds, Refusals())
    bucket = SUBJECTS.workers_bucket
    try:
        js = nc.jetstream()
        # One heartbeat larger than a heartbeat may be: refused, nothing stored.
        with pytest.raises(Exception, match=r"(?i)message size exceeds maximum"):
            await js.publish(f"$KV.{bucket}.held.huge", heartbeat("huge", 100_000))
        # Heartbeats of 60 kB under new instance names until the bucket is full.
        refused = None
        for n in range(2 * BOUND // 60_000):
            try:
                await js.publish(f"$KV.{bucket}.held.i{n}", heartbeat(f"i{n}", 60_000))
            except Exception as exc:  # noqa: BLE001 (the refusal is the point)
                refused = exc
                break
    finally:
        await nc.close()
    assert refused is not None, "the bucket took twice its bound"
    assert "maximum bytes exceeded" in str(refused).lower(), refused
    info = await secured.operator.nc.jetstream().stream_info(f"KV_{bucket}")
    assert info.state.bytes <= BOUND
    # What a listing reads is that much at most, and the flood's workers are listed.
    workers = (await secured.operator.agents())["workers"]
    flood = [w for w in workers if w.get("name") == "flood"]
    assert 0 < len(flood) <= BOUND // 60_000
    assert not any(w.get("instance") == "huge" for w in workers)
