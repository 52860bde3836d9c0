"""Payloads by reference on a real nats-server: stored once by digest, loaded back checked
against the digest and the bound, refused when the object was replaced under its name."""

from __future__ import annotations

import os

import pytest
from nats.aio.client import Client

from interlock.core.objects import ObjectError, ObjectRef, parse_ref
from interlock.transport.objects import Objects, store_object, stream_of
from interlock.transport.subjects import Subjects


async def test_a_payload_round_trips_and_is_stored_once(nc: Client, subjects: Subjects) -> None:
    objects = Objects(nc)
    bucket = f"{subjects.prefix}_objects"
    await objects.ensure_bucket(bucket)
    data = os.urandom(300 * 1024)
    ref = await objects.put(bucket, data)
    again = await objects.put(bucket, data)
    assert again == ref
    assert ref.size == len(data)
    assert await objects.get(ref) == data
    info = await objects.js.stream_info(stream_of(bucket))
    assert info.state.messages == 4  # three chunks and one meta: the second put sent nothing
    assert parse_ref(ref.to_json()) == ref


async def test_an_object_replaced_under_its_name_is_refused(nc: Client, subjects: Subjects) -> None:
    objects = Objects(nc)
    bucket = f"{subjects.prefix}_objects"
    await objects.ensure_bucket(bucket)
    ref = await objects.put_value(bucket, {"score": 9})
    parsed = parse_ref(ref)
    # Whoever can write the bucket puts other bytes under the same name.
    await store_object(objects.js, bucket, parsed.name, b'{"score": 1}')
    with pytest.raises(ObjectError, match="digest mismatch"):
        await objects.get_value(parsed)


async def test_bounds_and_missing_objects_say_what_is_wrong(nc: Client, subjects: Subjects) -> None:
    objects = Objects(nc, max_bytes=1000)
    bucket = f"{subjects.prefix}_objects"
    await objects.ensure_bucket(bucket)
    with pytest.raises(ObjectError, match="over the bound of 1000"):
        await objects.put(bucket, b"x" * 1001)
    ref = await objects.put(bucket, b"x" * 10)
    with pytest.raises(ObjectError, match="over the bound"):
        await objects.get(ObjectRef(bucket=bucket, name=ref.name, size=5000, digest=ref.digest))
    gone = ObjectRef(bucket=bucket, name="sha256-00", size=1, digest=ref.digest)
    with pytest.raises(ObjectError, match="not found"):
        await objects.get(gone)
    await objects.delete(ref)
    with pytest.raises(ObjectError, match="not found"):
        await objects.get(ref)
