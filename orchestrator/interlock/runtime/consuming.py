"""What every consumer of Interlock's streams does the same way: make sure of its durable
consumer through a JetStream outage, and write a dead letter for a message it cannot handle.
(Reading consumers: :mod:`interlock.runtime.pulling`.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg


async def until_done(
    attempt: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
    name: str,
    log: logging.Logger,
) -> None:
    """Run ``attempt`` until it succeeds, backing off while JetStream cannot answer (a
    leader election, a server restart): a consumer loop must not end because it started
    at a bad time. Once ``stopping`` is set, a failure is raised instead."""
    wait = 0.5
    while True:
        try:
            await attempt()
            return
        except Exception as exc:
            if stopping.is_set():
                raise
            log.warning("%s: cannot subscribe yet (%s); retrying in %.1fs", name, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 10.0)


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
