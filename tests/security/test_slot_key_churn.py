"""A publisher that names a new key in every event, as it would send it: its own credential
(as ``interlock creds issue publisher`` makes it) and plain nats-py, events of a type it may
publish whose data names a tenant no event named before. Each run takes a slot of its own
key and frees it at its end; the key's entry is then deleted, and a delete leaves a marker
in the slots bucket. Markers kept for good made the bucket grow by one message per key ever
named, and every read of the whole bucket (``interlock queues``, ``GET /queues``, each
metrics round, a process's first sweep) read them all: a publisher grew, without bound,
what the operators' and the readers' reads cost. A marker now goes once everyone has had
time to see it (:data:`interlock.runtime.slotlines.GONE_KEPT_S`, shortened here)."""

from __future__ import annotations

import pytest

from interlock.runtime import slotlines
from support.auth import SUBJECTS, Secured, publish_event, publisher, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

PER_TENANT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: per-tenant}
spec:
  triggers:
    - event: churn.job
  concurrency:
    - {key: data.tenant, limit: 1}
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: {message: hi}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
"""
KEYS = 30


@pytest.fixture(autouse=True)
def short_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slotlines, "GONE_KEPT_S", 1, raising=False)


async def test_keys_named_once_leave_nothing_in_the_slots_bucket(secured: Secured) -> None:
    applied = await secured.operator.apply([("per-tenant.yaml", PER_TENANT)])
    applied.compiled.raise_for_errors()
    nc, refusals = await publisher(secured, "churn.>", "churning-publisher")
    js = secured.operator.nc.jetstream()
    stream = f"KV_{SUBJECTS.slots_bucket}"
    try:
        for n in range(KEYS):
            await publish_event(nc, f"churn-{n}", "churn.job", {"tenant": f"tenant-{n:04d}"})
    finally:
        await nc.close()
    assert not refusals.errors

    async def all_done() -> bool:
        runs = await secured.operator.list_runs(workflow="per-tenant")
        return len(runs) == KEYS and all(r["status"] == "completed" for r in runs)

    await eventually(all_done, within=60, what=f"the {KEYS} runs completed")
    # Each key took a slot, so each had an entry: KEYS were written at least.
    assert (await js.stream_info(stream)).state.last_seq >= KEYS

    async def bucket_empty() -> bool:
        return (await js.stream_info(stream)).state.messages == 0

    await eventually(bucket_empty, within=15, what="the slots bucket emptied of markers")
