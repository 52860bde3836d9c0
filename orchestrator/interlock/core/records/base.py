"""What every run-log record shares: the CloudEvent envelope and the payload parts
several families use (an error, a spawn budget)."""

from __future__ import annotations

import msgspec

PREFIX = "io.interlock."
"""The start of every record's ``type``."""
SOURCE = "interlock://orchestrator"
"""The ``source`` of the records the orchestrator writes."""


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A classified failure."""

    error_class: str = msgspec.field(name="class")
    """An :class:`~interlock.core.vocabulary.ErrorClass` (kept ``str`` in the log)."""
    message: str
    retryable: bool = False
    code: str = ""
    """A finer code the agent gave (``tool_error``, ``guardrail_denied``...), or the class it
    named that is not one of the error classes; guards read it as ``result.error.code``."""
    retry_after_s: float | None = None
    """The wait before another attempt the agent asked for (its ``retry_after``, in seconds
    from this failure, clamped to an hour); the retry goes no sooner."""


class SpawnBudget(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run's depth in its tree of runs (its actions are spawns at ``depth + 1``), the
    deepest spawn allowed (counted from the root) and the spawns it and its child runs may
    still make (see docs/language.md, spawn budgets)."""

    depth: int = 0
    max_depth: int | None = None
    allowance: int | None = None


class Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """CloudEvent envelope of a run-log record (structured mode JSON).

    The required CloudEvent attributes have no defaults so that ``omit_defaults`` (which
    keeps optional attributes such as ``traceparent`` out of the JSON when unset) never
    drops them.
    """

    specversion: str
    id: str
    source: str
    subject: str
    """The run id."""
    time: str
    datacontenttype: str
    traceparent: str | None = None
