"""A message stored with ``Nats-Rollup: all`` purges every other message of its stream.
Key-value buckets take none; here the task requests' stream and the orchestrator's object
buckets, attacked by the users of the orchestrator's account that may write them (the
gateway's credential and the operator's, as ``interlock creds issue`` makes them):

- directly: the gateway and the operator write the uploads and the runs' objects buckets
  (large inputs), so a meta they put with the header wiped every run's payloads;
- by a copy: a party stores the header in its own bucket (which takes rollups: object
  store clients put with ``Nats-Rollup: sub``), and a direct get of it, with a reply
  subject naming a task subject or an object bucket, has the server write it there,
  headers and all: on ``il.cap.<capability>`` it dropped every queued task of every
  capability.

Neither takes a rollup now: the write is refused, the copy dropped, and every task and
object stays."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from nats.aio.client import Client

from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.core.objects import parse_ref
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.jetstream import jetstream
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server
from support.runtime import eventually

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROLLUP = {"Nats-Rollup": "all"}


async def _held(secured: Secured, stream: str, subject: str) -> int:
    info = await secured.operator.js.stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def _tasks_and_objects(secured: Secured) -> tuple[str, str]:
    """A task queued for ``held`` (nobody serves it) and a run whose inputs are kept by
    reference in the runs' objects bucket: (the run, its inputs' bucket)."""
    order = CloudEvent(id=secrets.token_hex(4), source="test", type="acme.order.placed", data={})
    await secured.operator.emit(order)
    capability = SUBJECTS.capability("held")

    async def queued() -> bool:
        return await _held(secured, SUBJECTS.tasks_stream, capability) >= 1

    await eventually(queued, what="a task queued for held")
    run_id = await secured.operator.start("awaiting", {"blob": "r" * 300_000})
    [started] = (await secured.operator.read(run_id))[:1]
    assert isinstance(started, ev.RunStarted)
    return run_id, parse_ref(started.data.inputs).bucket


async def party_rollup(secured: Secured) -> tuple[str, str]:
    """A message with ``Nats-Rollup: all`` stored by a party in its own bucket:
    (its stream, its subject)."""
    creds = secured.issue(Role("agent", capabilities=("held",)), "rolling-agent")
    bucket = SUBJECTS.party_bucket(secured.auth.keys.issued()[-1].account or "")
    nc = await plain_client(secured.url, creds, Refusals())
    try:
        js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=5)
        subject = f"$O.{bucket}.M.rolling"
        ack = await js.publish(subject, b"{}", headers=ROLLUP)
        assert ack.seq  # its own bucket takes it (and purges its own objects only)
    finally:
        await nc.close()
    return f"OBJ_{bucket}", subject


async def _attack(nc: Client, source: tuple[str, str], inputs: str) -> list[str]:
    """As a user of the orchestrator's account: a rollup put straight into the object
    buckets it writes, then copies of the party's onto a task subject and each bucket.
    What the server answered the straight puts."""
    said = []
    for bucket in (SUBJECTS.objects_bucket, SUBJECTS.uploads_bucket):
        msg = await nc.request(f"$O.{bucket}.M.wipe", b"{}", headers=ROLLUP, timeout=5)
        said.append(msg.data.decode())
    stream, subject = source
    targets = [
        SUBJECTS.capability("held"),
        SUBJECTS.capability("echo"),
        f"$O.{SUBJECTS.objects_bucket}.M.copied",
        f"$O.{inputs}.M.copied",
    ]
    for target in targets:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", reply=target)
    await nc.flush()
    return said


@pytest.mark.parametrize("role", ["gateway", "operator"])
async def test_a_rollup_put_or_copied_wipes_no_task_and_no_object(
    secured: Secured, role: str
) -> None:
    run_id, inputs = await _tasks_and_objects(secured)
    source = await party_rollup(secured)
    tasks_before = await _held(secured, SUBJECTS.tasks_stream, SUBJECTS.capabilities_all)
    objects_before = (await jetstream(secured.operator.nc).stream_info(f"OBJ_{inputs}")).state
    creds = secured.issue(Role(role), f"rolling-{role}")
    nc = await plain_client(secured.url, creds, Refusals())
    try:
        said = await _attack(nc, source, inputs)
    finally:
        await nc.close()
    assert all("rollup not permitted" in answer for answer in said), said
    await asyncio.sleep(0.3)  # the copies are written (or refused) by the server
    assert await _held(secured, SUBJECTS.tasks_stream, SUBJECTS.capabilities_all) >= tasks_before
    after = (await jetstream(secured.operator.nc).stream_info(f"OBJ_{inputs}")).state
    assert after.messages >= objects_before.messages
    # The run's inputs still load, whole and checked.
    secured.operator.payloads.forget()
    loaded = await secured.operator.payloads.loaded(await secured.operator.read(run_id))
    assert isinstance(loaded[0], ev.RunStarted)
    assert loaded[0].data.inputs["blob"] == "r" * 300_000
