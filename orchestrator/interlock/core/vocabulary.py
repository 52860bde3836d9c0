"""The words every part of Interlock shares: error classes, run statuses, timer purposes,
the root of its exceptions and the exit codes of the ``interlock`` command.

They are defined here once. Each enum is a ``StrEnum``, so a member *is* its string: it
compares equal to the text a log carries, encodes as that text, and the log's fields stay
plain ``str`` (an older reader must still decode a newer log that names a value it does not
know yet).
"""

from __future__ import annotations

from enum import StrEnum


class InterlockError(Exception):
    """The root of the errors Interlock raises on purpose: catch it to catch any of them.

    The core's errors (a manifest that does not compile, an expression that fails) derive
    from it, and so do the shell's and the SDK's.
    """


EXIT_OK = 0
EXIT_FAILED = 1
"""Invalid input, a failed or cancelled run."""
EXIT_USAGE = 2
"""Bad arguments, a file that cannot be read, a server that cannot be reached."""
EXIT_NOT_FINISHED = 3
"""``result`` of a run that has not finished yet."""
EXIT_NO_RUN = 4
"""No run has the id given (a failed run is 1)."""
EXIT_DENIED = 5
"""The credential may not do what the command needs (the server refused a permission)."""


class ErrorClass(StrEnum):
    """The class of a failed action or run, recorded in the log and matched by ``catch``."""

    TIMEOUT = "timeout"
    """No answer, or no end of the run, in the time allowed."""
    CANCELLED = "cancelled"
    """The action or the run was cancelled while it ran."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """A budget (actions, fan-out, transitions, loop iterations) was exhausted."""
    SCHEMA_ERROR = "schema_error"
    """An input or an output did not match the capability's schema."""
    AGENT_ERROR = "agent_error"
    """The agent's handler failed."""
    PLATFORM_ERROR = "platform_error"
    """Something around the handler failed (the worker, the transport)."""
    EXPRESSION_ERROR = "expression_error"
    """An expression the run needed (a map's ``over``, an output) failed."""
    WORKFLOW_FAILED = "workflow_failed"
    """The workflow itself ended the run as failed (a ``fail:`` terminal state)."""
    PAYLOAD_TOO_LARGE = "payload_too_large"
    """An answer too large to carry in one message, or to record in the run's log."""
    HISTORY_EXCEEDED = "history_exceeded"
    """The run's log reached its history limit (``spec.history``) and was not continued
    as a new run."""


ERROR_CLASSES: tuple[str, ...] = tuple(ErrorClass)
"""Every error class, in the order the documentation lists them."""

RETRYABLE: frozenset[str] = frozenset({ErrorClass.TIMEOUT, ErrorClass.PLATFORM_ERROR})
"""Error classes retried under a retry policy; an agent can mark any error retryable."""


TASK_COMPLETED = "task.completed"
"""Answer type of a handler that returned normally."""
TASK_FAILED = "task.failed"
"""Answer type of a failed task; its data is ``{"error": {"class", "message", ...}}``."""


class RunStatus(StrEnum):
    """Where a run stands; a finished run never changes again."""

    NEW = "new"
    """Nothing folded yet."""
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED = "continued"
    """The run's log ended and the run goes on in a new one (``run.continued`` names it)."""


FINISHED: frozenset[str] = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED}
)
"""The statuses of a run whose log is finished (a continued run's chain goes on)."""
RECORDED: tuple[str, ...] = tuple(s.value for s in RunStatus if s is not RunStatus.NEW)
"""The statuses of a run whose log holds anything, in order: what run listings filter by."""


class StepStatus(StrEnum):
    """Where a step of a DAG state stands (``steps.<name>.status``); no entry yet: not
    asked for."""

    HELD = "held"
    """Its evidence gate is not open yet."""
    RUNNING = "running"
    """Asked for, or waiting for a retry."""
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    """It can never run: a step it depends on ended otherwise than its edge asks."""


STEP_ENDED: frozenset[str] = frozenset(
    {StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED}
)
"""How a DAG step can end."""


class ItemStatus(StrEnum):
    """How one item of an ``all_settled`` map ended (``result[i].status``)."""

    COMPLETED = "completed"
    """Its action completed: ``result[i].result`` is its output."""
    FAILED = "failed"
    """Its action failed (retries exhausted): ``result[i].error`` says why."""


class TimerPurpose(StrEnum):
    """What a durable timer is for, recorded in ``timer.scheduled``."""

    ACTION_TIMEOUT = "action-timeout"
    """An attempt of an action got no answer in time."""
    RETRY = "retry"
    """The backoff before the next attempt of a failed action is over."""
    STATE_TIMEOUT = "state-timeout"
    """The run stayed in a state longer than the state's ``timeout.after``."""
    RUN_DEADLINE = "run-deadline"
    """The run did not finish within ``spec.deadline``: the one timer that belongs to the
    run rather than to a state visit."""
    RATE = "rate"
    """The run's trigger was over its rate: the run starts now (``run.queued``'s
    ``rate.until``)."""


class ContinueMode(StrEnum):
    """What a run does once its log nears its history limit (``spec.history``)."""

    AUTO = "auto"
    """Its next transition continues it as a new run."""
    NEVER = "never"
    """It goes on in this log, and fails with ``history_exceeded`` at the limit."""


SUGGESTED_SHARE = 0.8
"""The share of a history limit at which continuing as new is suggested (a warning, a
metric) and, under ``continue_as_new: auto``, done at the next transition."""
