"""A worker's heartbeats: a liveness record in the workers KV bucket, under one key
``<capability token>.<instance>`` per capability it serves (an agent may write the keys
of its own capabilities only), rewritten every few seconds and expiring (the bucket's
TTL) when the process is gone."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from nats.js import JetStreamContext

from interlock.transport.tasks import heartbeat_key

log = logging.getLogger("interlock.sdk")


class Heartbeats:
    """The heartbeats of one worker process."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        capabilities: list[str],
        instance: str,
        record: Callable[[], dict[str, Any]],
        interval: float,
    ) -> None:
        self._js = js
        self._bucket = bucket
        self._keys = [heartbeat_key(c, instance) for c in capabilities]
        self._record = record
        self._interval = interval

    async def beat(self) -> None:
        """Write the record once, under every key (a failure waits for the next beat)."""
        value = json.dumps(self._record()).encode()
        try:
            kv = await self._js.key_value(self._bucket)
            for key in self._keys:
                await kv.put(key, value)
        # Liveness must never stop the worker.
        except Exception as exc:  # noqa: BLE001
            log.warning("heartbeat into %s failed: %s", self._bucket, exc)

    async def run(self) -> None:
        """Beat every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            await self.beat()

    async def forget(self) -> None:
        """Remove the keys (they expire anyway when this fails)."""
        try:
            kv = await self._js.key_value(self._bucket)
            for key in self._keys:
                await kv.delete(key)
        # Liveness must never stop the worker.
        except Exception as exc:  # noqa: BLE001
            log.debug("removing the heartbeats %s failed: %s", self._keys, exc)
