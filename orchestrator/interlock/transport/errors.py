"""Errors raised by the NATS layer of the runtime (connection, embedded server, log appends)."""

from __future__ import annotations

from typing import Any

from interlock.core.vocabulary import InterlockError


class NatsServerNotFound(FileNotFoundError, InterlockError):
    """No ``nats-server`` binary could be found (or the one found is too old)."""


class NatsServerFailed(RuntimeError, InterlockError):
    """An embedded ``nats-server`` did not start, or stopped when it should be running."""


class ConnectionFailed(InterlockError):
    """The NATS server could not be reached or refused the connection; names the URL."""


class AppendConflict(InterlockError):
    """An optimistic append lost: the subject's last sequence was not the one expected.

    The caller re-reads the log and decides again. Nothing of the refused append is stored.

    Attributes:
        subject: the subject appended to.
        expected: the last subject sequence the caller expected.
    """

    def __init__(self, subject: str, expected: int | None, detail: str = "") -> None:
        message = f"append to {subject!r} conflicts: last subject sequence is not {expected}"
        super().__init__(f"{message} ({detail})" if detail else message)
        self.subject = subject
        self.expected = expected


class JetStreamAPIError(InterlockError):
    """The JetStream API refused a request; carries the server's codes and description."""

    def __init__(self, what: str, error: dict[str, Any]) -> None:
        self.code = int(error.get("code", 0))
        self.err_code = int(error.get("err_code", 0))
        self.description = str(error.get("description", "unknown error"))
        super().__init__(f"{what}: {self.description} (err_code {self.err_code})")
