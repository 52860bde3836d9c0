"""Reading a durable pull consumer in batches, the same way in every loop that does."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import FetchTimeoutError


async def batches(
    sub: Any, size: int, stopping: asyncio.Event, name: str, log: logging.Logger
) -> AsyncIterator[list[Msg]]:
    """Batches of up to ``size`` messages until ``stopping`` is set.

    An empty fetch is no news; a failed one (a server restart, a leader election) is
    logged under ``name`` and tried again half a second later: the loop never ends on it.
    """
    while not stopping.is_set():
        try:
            msgs = await sub.fetch(size, timeout=1.0)
        except (TimeoutError, FetchTimeoutError, NatsTimeoutError):
            continue
        except Exception as exc:
            log.warning("%s: fetch failed: %s", name, exc)
            await asyncio.sleep(0.5)
            continue
        yield msgs
