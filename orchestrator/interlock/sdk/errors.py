"""Failures a capability handler can raise, and the error classes they travel as."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from enum import StrEnum

from interlock.core import vocabulary
from interlock.core.rfc3339 import format_time
from interlock.core.vocabulary import InterlockError

__all__ = ["AgentError", "ErrorClass", "RetryableError"]


class ErrorClass(StrEnum):
    """The classes a worker's answers carry: the agent-side subset of the core's
    :class:`~interlock.core.vocabulary.ErrorClass`, whose values they are."""

    TIMEOUT = vocabulary.ErrorClass.TIMEOUT.value
    """The request's deadline passed before the handler finished."""
    CANCELLED = vocabulary.ErrorClass.CANCELLED.value
    """The orchestrator cancelled the action while it ran."""
    SCHEMA_ERROR = vocabulary.ErrorClass.SCHEMA_ERROR.value
    """The input or the output did not match the capability's schema."""
    AGENT_ERROR = vocabulary.ErrorClass.AGENT_ERROR.value
    """The handler failed (raised)."""
    PLATFORM_ERROR = vocabulary.ErrorClass.PLATFORM_ERROR.value
    """The worker itself failed around the handler."""
    PAYLOAD_TOO_LARGE = vocabulary.ErrorClass.PAYLOAD_TOO_LARGE.value
    """The handler's answer is larger than the NATS server accepts in one message."""


class AgentError(InterlockError):
    """A handler failure, reported as ``task.failed`` with class ``agent_error``.

    Non-retryable by default: raise it for failures that another attempt would repeat
    (bad input the schema could not express, a refused operation). Raise
    :class:`RetryableError` for transient ones. ``code`` is a finer reason of your own
    (``tool_error``, ``guardrail_denied``...) that workflows can route on with
    ``result.error.code``. ``retry_after`` (seconds, a ``timedelta`` or an aware
    ``datetime``: an API's ``Retry-After``) keeps the next attempt from going before it
    (the later of it and the retry policy's backoff, at most an hour).

    Raises:
        ValueError: ``retry_after`` is negative, not finite, or a naive datetime.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        code: str | None = None,
        retry_after: float | timedelta | datetime | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        if retryable is not None:
            self.retryable = retryable
        self.retry_after = _retry_after(retry_after)
        """The wire form: seconds, or an RFC 3339 instant."""


def _retry_after(value: float | timedelta | datetime | None) -> float | str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("retry_after: give an aware datetime (with its time zone)")
        return format_time(value)
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"retry_after {value!r} is not a finite, non-negative wait")
    return float(seconds)


class RetryableError(AgentError):
    """A transient handler failure: ``agent_error`` with ``retryable: true``."""

    retryable = True
