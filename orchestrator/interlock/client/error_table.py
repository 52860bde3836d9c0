"""What each error a caller can see means at the edges: its HTTP status and problem type in
the gateway, its exit code in the ``interlock`` command.

One table, read by the gateway's REST routes (one guard around every route) and by the
command's connected client (one ``except`` around every command that talks to a server).
An error the table does not name, or names without an answer for one edge, goes on as it
is (a route answers 500, a command prints its traceback) unless the code that raised it
says more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from interlock.client.errors import UnknownAgent
from interlock.core.fork import NotPossible
from interlock.core.ids import InvalidRunId
from interlock.core.objects import ObjectError, StoredObjectDamaged
from interlock.core.vocabulary import (
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_NO_RUN,
    EXIT_USAGE,
    InterlockError,
)
from interlock.runtime.errors import (
    EventTooLarge,
    InvalidInputs,
    NotRedrivable,
    RunExists,
    RunNotStarted,
    UnknownDeadLetter,
    UnknownRun,
    UnknownWorkflow,
)
from interlock.transport.logmac import LogKeyUnavailable, SecretDamaged
from interlock.transport.refusals import PermissionRefused

__all__ = ["ERRORS", "Meaning", "meaning"]


def _no_run(exc: BaseException) -> str:
    return f"no run {exc.args[0]!r}"


@dataclass(frozen=True, slots=True)
class Meaning:
    """What one error class means at each edge (None: that edge has no general answer)."""

    status: int | None
    """The HTTP status of the gateway's problem answer."""
    problem: str | None
    """The problem type's short name (its URI ends with it)."""
    exit_code: int | None
    """The ``interlock`` command's exit code."""
    detail: Callable[[BaseException], str] = str
    """What to say, for a person (the problem's ``detail``, the command's message)."""


_NOT_FOUND = Meaning(404, "not-found", EXIT_FAILED)
_LOG_KEY = Meaning(503, "log-key-unavailable", EXIT_FAILED)

ERRORS: dict[type[InterlockError], Meaning] = {
    UnknownRun: Meaning(404, "unknown-run", EXIT_NO_RUN, _no_run),
    RunNotStarted: Meaning(404, "run-not-started", EXIT_NO_RUN),
    UnknownWorkflow: _NOT_FOUND,
    UnknownAgent: _NOT_FOUND,
    UnknownDeadLetter: _NOT_FOUND,
    InvalidInputs: Meaning(400, "invalid-request", EXIT_FAILED),
    InvalidRunId: Meaning(400, "invalid-request", EXIT_USAGE),
    RunExists: Meaning(409, "run-exists", EXIT_FAILED),
    NotRedrivable: Meaning(409, "not-redrivable", EXIT_FAILED),
    NotPossible: Meaning(409, "not-possible", EXIT_FAILED),
    # The gateway answers an event too large where it checks each event of a batch (413,
    # naming the event); a REST route has no general answer for it.
    EventTooLarge: Meaning(None, None, EXIT_FAILED),
    # A value a run's log keeps by reference, damaged where it is stored: no fault of the
    # caller's (500, saying which value and why); a reference a caller sent that names
    # nothing usable is the request's fault.
    StoredObjectDamaged: Meaning(500, "stored-object-damaged", EXIT_FAILED),
    ObjectError: Meaning(400, "invalid-reference", EXIT_FAILED),
    SecretDamaged: _LOG_KEY,
    LogKeyUnavailable: _LOG_KEY,
    # A refusal of the gateway's own connection is no fault of the caller's: no general
    # answer there.
    PermissionRefused: Meaning(None, None, EXIT_DENIED),
}
"""Error class -> what it means; a subclass means what its nearest listed class means."""


def meaning(exc: BaseException) -> Meaning | None:
    """What ``exc`` means at the edges, by its class or its nearest listed base class."""
    for cls in type(exc).__mro__:
        found = ERRORS.get(cls)
        if found is not None:
            return found
    return None
