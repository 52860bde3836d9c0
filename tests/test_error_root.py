"""Every exception Interlock defines derives from ``InterlockError``: a caller catches any of
them with one ``except``, whatever module raised it.

The walk imports every module of the package and looks at the exception classes each one
defines. A class whose name begins with ``_`` is control flow inside its module (it never
leaves it) and is not looked at; the few public ones that never reach a caller either are
listed below, each with why.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import interlock
from interlock.core.vocabulary import InterlockError

NOT_ERRORS = {
    # The CLI's own exit signals: main() prints the message and exits with the code;
    # no program calling Interlock ever sees them.
    "interlock.cli.common.CliError",
    "interlock.cli.common.InvalidInput",
    # Raised inside the CEL interpreter when an evaluation used up its steps; the
    # interpreter's caller turns it into OverBudget (an InterlockError) at once.
    "interlock.core.cel.BudgetExceeded",
    # An inbound event the orchestrator dead-letters (Refused) or hands back to JetStream
    # to wait its turn (Deferred): decisions about a message, caught where it is settled.
    "interlock.runtime.addressing.Refused",
    "interlock.runtime.fairness.Deferred",
    # A partition's holder could not decide a message handed to it: the reading replica's
    # consumer loop takes it as a failure of its own (retried, dead-lettered at the last try).
    "interlock.runtime.owners.HandedFailed",
    # A worker stopping hands its task back unanswered: caught by the worker's loop.
    "interlock.sdk.execution.Abandon",
}


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(interlock.__path__, "interlock."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_public_exception_derives_from_interlock_error() -> None:
    found = _defined_exceptions()
    outside = sorted(
        name
        for name, cls in found.items()
        if not issubclass(cls, InterlockError) and name not in NOT_ERRORS
    )
    assert outside == [], "derive these from InterlockError (or say why not in NOT_ERRORS)"


def test_the_allow_list_names_only_classes_that_exist_outside_the_root() -> None:
    """An entry whose class was removed, renamed or rooted since is taken out."""
    found = _defined_exceptions()
    stale = sorted(
        name for name in NOT_ERRORS if name not in found or issubclass(found[name], InterlockError)
    )
    assert stale == []


def test_the_errors_a_caller_catches_as_builtins_still_are() -> None:
    """Rooting them kept their built-in bases: ``except ValueError`` / ``LookupError``
    callers still catch them."""
    from interlock.core.fork import NotPossible
    from interlock.runtime.errors import RunExists, UnknownRun
    from interlock.runtime.eventloop import EventLoopError
    from interlock.runtime.logstore import RecordsTooLarge

    for cls in (NotPossible, RecordsTooLarge, RunExists, EventLoopError):
        assert issubclass(cls, ValueError)
        assert issubclass(cls, InterlockError)
    assert issubclass(UnknownRun, LookupError)
