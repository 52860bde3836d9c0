"""The Python SDK's heartbeat is the record contracts/asyncapi.yaml describes (tasks.Heartbeat)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.sdk import Worker
from interlock.transport import tasks
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects


async def test_the_sdk_heartbeat_has_exactly_the_documented_fields(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    await provision(js, subjects)
    worker = Worker("shape", concurrency=2, instance_id="i-1")

    @worker.capability("shape.check")
    async def handler(inp: dict[str, Any]) -> dict[str, Any]:
        return {}

    task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
    try:
        await worker.wait_ready()
        workers = await js.key_value(subjects.workers_bucket)
        entry = await workers.get(tasks.heartbeat_key("shape.check", "i-1"))
        record = json.loads(entry.value or b"")
        assert set(record) == set(tasks.Heartbeat.__struct_fields__)
        beat = msgspec.convert(record, tasks.Heartbeat)
        assert beat.capabilities == ["shape.check"]
    finally:
        await worker.stop()
        await task
