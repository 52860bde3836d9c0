"""How a worker sends its answers: by request to the orchestrator, else to the results stream.

An answer is encoded once, measured against the server's payload limit (one too large to
send fails the attempt now, as ``payload_too_large``), and sent as a request on
``<prefix>.answer.<capability>.<run_id>``: the orchestrator replies once it is in the
run's log, or dead-lettered. With no orchestrator up, or no reply in time, it is published
to the results stream instead, which keeps it until an orchestrator takes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from interlock.core.objects import ObjectError, is_marker
from interlock.transport.clock import utc_now
from interlock.transport.jetstream import JetStream, connection, jetstream
from interlock.transport.objects import ObjectLimits, Objects
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import (
    ANSWER_DETAIL_HEADER,
    ANSWER_FAILED,
    ANSWER_HEADER,
    ANSWER_REASON_HEADER,
    ANSWER_REFUSED,
    TaskRequest,
    agent_source,
    encode_answer,
    failure,
)

from .errors import ErrorClass

log = logging.getLogger("interlock.sdk")

DIRECT_AFTER_TIMEOUT = 10.0
"""After an answer request got no reply in time, answers go to the results stream for this
long (each request that times out costs its task that wait)."""

ANSWER_HEADROOM = 8 * 1024
"""Room kept below the server's payload limit for an answer's headers."""


class Answer:
    """An answer as it goes on the wire (encoded once: measured, then sent)."""

    __slots__ = ("event_id", "headers", "payload", "size")

    def __init__(self, event_id: str, headers: dict[str, str], payload: bytes) -> None:
        self.event_id = event_id
        self.headers = headers
        self.payload = payload
        # "Name: value\r\n" per header, counted without a Python step per header.
        self.size = (
            len(payload)
            + sum(map(len, headers))
            + sum(map(len, headers.values()))
            + 4 * len(headers)
        )


class AnswerSender:
    """Sends the answers of one worker (results come from ``interlock://agent/<name>``)."""

    def __init__(self, name: str, timeout: float) -> None:
        self._source = agent_source(name)
        self.limits = ObjectLimits.from_env()
        """From which size an answer goes by reference, and the largest one."""
        self.timeout = timeout
        """Seconds to wait for the orchestrator's reply to an answer request before
        publishing the answer to the results stream instead (0: always the stream)."""
        self._direct_until = 0.0
        """Until this monotonic time answers skip the request (one timed out)."""

    async def by_reference(
        self, js: JetStreamContext, subjects: Subjects, capability: str, data: Any
    ) -> tuple[Any, str | None]:
        """The answer's data, stored in an object bucket with its reference in its place
        when its JSON is over the threshold (``INTERLOCK_OBJECT_THRESHOLD``); the bucket is
        the credential's own (its ``objects:`` tag), else the orchestrator account's uploads. With
        the reason when it cannot be (over the bound, or the bucket refused it): the
        attempt then fails as ``payload_too_large``."""
        if data is None or is_marker(data):
            return data, None
        encoded = msgspec.json.encode(data)
        if len(encoded) <= self.limits.threshold:
            return data, None
        nc = connection(js)
        bucket = getattr(nc, "objects_bucket", None) or subjects.uploads_bucket
        try:
            ref = await Objects(nc, max_bytes=self.limits.max_bytes).put(bucket, encoded)
        except ObjectError as exc:
            return data, f"the answer of {capability}: {exc}"
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            why = f"the answer of {capability} could not be stored in bucket {bucket}: {exc}"
            return data, why
        return ref.to_json(), None

    def answer(
        self, request: TaskRequest, capability: str, result_type: str, data: Any, limit: int
    ) -> tuple[Answer, str, Any]:
        """The answer, encoded once, or a payload_too_large failure when it would be over
        ``limit`` bytes: it could never be sent, so the attempt fails now, with the reason in
        the log, rather than let the run wait for an answer until its timeout."""
        answer = self._encoded(request, result_type, data)
        if answer.size <= limit:
            return answer, result_type, data
        result_type, data = failure(
            ErrorClass.PAYLOAD_TOO_LARGE,
            f"the answer of {capability} takes {answer.size:,} bytes; the NATS server accepts "
            f"at most {limit:,} in one message",
        )
        log.error("%s: %s", request.action_id, data["error"]["message"])
        return self._encoded(request, result_type, data), result_type, data

    def _encoded(self, request: TaskRequest, result_type: str, data: Any) -> Answer:
        event_id, headers, payload = encode_answer(
            request,
            source=self._source,
            type=result_type,
            data=data,
            time=utc_now(),
        )
        return Answer(event_id, headers, payload)

    async def send(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        capability: str,
        run_id: str,
        answer: Answer,
    ) -> bool:
        """Send an answer: by request (the orchestrator replies once it is in the run's log,
        or dead-lettered), else to the results stream. True once it is safe."""
        event_id, headers, payload = answer.event_id, answer.headers, answer.payload
        if self.timeout > 0 and time.monotonic() >= self._direct_until:
            subject = subjects.answer(capability, run_id)
            try:
                # The connection's shared reply subscription, as for publish acks.
                shared = js if isinstance(js, JetStream) else jetstream(connection(js))
                reply = await shared.request_ack(
                    subject, payload, headers=headers, ack_wait=self.timeout
                )
            except nats.errors.NoRespondersError:
                pass  # no orchestrator up: the stream keeps the answer until one is
            except (nats.errors.Error, TimeoutError) as exc:
                log.info(
                    "no reply to answer %s (%s); sending it to the results stream", event_id, exc
                )
                self._direct_until = time.monotonic() + DIRECT_AFTER_TIMEOUT
            else:
                said = reply.headers or {}
                status = said.get(ANSWER_HEADER)
                if status == ANSWER_REFUSED:
                    reason = said.get(ANSWER_REASON_HEADER)
                    detail = said.get(ANSWER_DETAIL_HEADER, "")
                    log.warning(
                        "answer %s refused and dead-lettered (%s): %s", event_id, reason, detail
                    )
                # Recorded, or refused and dead-lettered: sending it again changes nothing.
                if status is not None and status != ANSWER_FAILED:
                    return True
        return await self._publish(
            js, subjects.result(capability, run_id), headers, payload, event_id
        )

    async def _publish(
        self,
        js: JetStreamContext,
        subject: str,
        headers: dict[str, str],
        payload: bytes,
        event_id: str,
    ) -> bool:
        delay = 0.2
        for attempt in range(1, 6):
            try:
                await js.publish(subject, payload, headers=headers, timeout=5.0)
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                log.warning("publishing result %s failed (attempt %d): %s", event_id, attempt, exc)
                await asyncio.sleep(delay)
                delay *= 2
            else:
                return True
        return False
