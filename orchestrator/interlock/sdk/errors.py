"""Failures a capability handler can raise, and the error classes they travel as."""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    """The class of a failed task, as carried in ``task.failed`` data and matched by ``catch``."""

    TIMEOUT = "timeout"
    """The request's deadline passed before the handler finished."""
    CANCELLED = "cancelled"
    """The orchestrator cancelled the action while it ran."""
    SCHEMA_ERROR = "schema_error"
    """The input or the output did not match the capability's schema."""
    AGENT_ERROR = "agent_error"
    """The handler failed (raised)."""
    PLATFORM_ERROR = "platform_error"
    """The worker itself failed around the handler."""
    PAYLOAD_TOO_LARGE = "payload_too_large"
    """The handler's answer is larger than the NATS server accepts in one message."""


class AgentError(Exception):
    """A handler failure, reported as ``task.failed`` with class ``agent_error``.

    Non-retryable by default: raise it for failures that another attempt would repeat
    (bad input the schema could not express, a refused operation). Raise
    :class:`RetryableError` for transient ones. ``code`` is a finer reason of your own
    (``tool_error``, ``guardrail_denied``...) that workflows can route on with
    ``result.error.code``.
    """

    retryable: bool = False

    def __init__(
        self, message: str, *, retryable: bool | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        if retryable is not None:
            self.retryable = retryable


class RetryableError(AgentError):
    """A transient handler failure: ``agent_error`` with ``retryable: true``."""

    retryable = True
