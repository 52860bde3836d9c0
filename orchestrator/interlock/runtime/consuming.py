"""What every consumer of Interlock's streams does the same way: read a durable pull
consumer in batches, and write a dead letter for a message it cannot handle."""

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


def dead_letter_headers(msg: Msg, reason: str, detail: str) -> dict[str, str]:
    """The headers of a dead letter about ``msg`` (the orchestrator's and the workers' alike).

    Without the message's own JetStream headers: its ``Nats-Msg-Id`` would make the
    dead-letter stream drop a second letter about the same message, and others
    (``Nats-Expected-*``, ``Nats-Rollup``, ``Nats-TTL``) would act on the dead-letter
    stream. The caller adds its own ``Nats-Msg-Id``.
    """
    headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
    headers["Interlock-Dead-Letter-Reason"] = reason
    headers["Interlock-Dead-Letter-Detail"] = detail[:1000]
    headers["Interlock-Dead-Letter-Subject"] = msg.subject
    return headers
