"""Binding a worker to its capabilities' consumers.

The orchestrator creates each capability's durable consumer ``cap_<capability>``; a worker
binds to it. A worker allowed to (no permissions set, ``interlock dev --insecure``) also
creates a missing one, as before; one that may not says so once and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from interlock.transport.consuming import STREAM_NOT_FOUND, ConsumerMismatch, ensure_consumer
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name, task_consumer_config

log = logging.getLogger("interlock.sdk")


class _CreateRefused(Exception):
    """Creating a capability's consumer failed: the orchestrator's job, then."""


_CREATE_RETRY = 15.0
"""Seconds between two attempts to create a missing consumer this worker was refused."""


def _once(warned: set[str], message: str, *args: object) -> None:
    """Log ``message`` once per binding loop."""
    if message not in warned:
        warned.add(message)
        log.warning(message, *args)


async def bind(
    js: JetStreamContext,
    subjects: Subjects,
    capability: str,
    stop: asyncio.Event,
    *,
    ack_wait: float,
    max_deliver: int,
    may_create: bool = True,
) -> ConsumerInfo | None:
    """Bind to the capability's durable consumer; wait for it (and the TASKS stream).

    The orchestrator creates the consumer; a worker allowed to (no permissions set,
    ``interlock dev --insecure``) creates it too when it is missing, one that is not
    says so once and waits for it. ``may_create`` False (an agent credential, whose
    account has no JetStream of its own) never tries. None: ``stop`` was set first.
    """
    warned: set[str] = set()
    create_after = 0.0
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            return await _ensure(
                js,
                subjects,
                capability,
                create=may_create and loop.time() >= create_after,
                ack_wait=ack_wait,
                max_deliver=max_deliver,
            )
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                _once(
                    warned,
                    "stream %s does not exist yet (is the orchestrator provisioned?); waiting",
                    subjects.tasks_stream,
                )
            else:  # the consumer is missing and this worker may not create it
                _once(
                    warned,
                    "consumer %s on %s does not exist yet and this worker cannot create "
                    "it; waiting for the orchestrator to create it",
                    consumer_name(capability),
                    subjects.tasks_stream,
                )
        except _CreateRefused as exc:
            create_after = loop.time() + _CREATE_RETRY
            _once(
                warned,
                "consumer %s on %s does not exist yet and this worker may not create it "
                "(%s); waiting for the orchestrator to create it",
                consumer_name(capability),
                subjects.tasks_stream,
                exc,
            )
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
            log.warning("JetStream not available (%s); retrying", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return None


async def _ensure(
    js: JetStreamContext,
    subjects: Subjects,
    capability: str,
    *,
    create: bool,
    ack_wait: float,
    max_deliver: int,
) -> ConsumerInfo:
    """The capability's consumer, created when missing if ``create``.

    Raises:
        nats.js.errors.NotFoundError: the consumer (not ``create``) or the stream is
            missing.
        _CreateRefused: creating the consumer failed (no permission, most likely).
    """
    config = task_consumer_config(subjects, capability, ack_wait=ack_wait, max_deliver=max_deliver)
    if not create:
        info: ConsumerInfo = await js.consumer_info(
            subjects.tasks_stream, consumer_name(capability)
        )
        return info
    try:
        return await ensure_consumer(js, subjects.tasks_stream, config)
    except ConsumerMismatch as exc:
        raise ConsumerMismatch(
            f"{exc}: two capability names map to the same consumer name"
        ) from None
    except nats.js.errors.NotFoundError:
        raise
    except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
        # Without the right to create consumers, the request goes unanswered (the
        # server refuses the publish) or is refused.
        if isinstance(exc, nats.js.errors.ServiceUnavailableError):
            raise
        raise _CreateRefused(str(exc) or type(exc).__name__) from exc
