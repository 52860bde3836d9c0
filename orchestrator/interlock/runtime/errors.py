"""What the runtime raises when asked for something that is not there or not allowed.

Defined apart from the modules that raise them so that a program catching them (the
client, the CLI, the gateway) imports no more than these classes: the registry and the run
manager that raise them load the compiler and the engine.
"""

from __future__ import annotations

from interlock.core.vocabulary import InterlockError


class UnknownWorkflow(LookupError, InterlockError):
    """No workflow by that name is applied (or it was deleted)."""


class UnknownRun(LookupError, InterlockError):
    """No run with that id."""


class RunNotStarted(UnknownRun):
    """No run with that id yet, where an event this client stored will start one: the
    event is stored and the orchestrator has not started its run (it copies the event's
    data kept by reference first). Asked with a wait, the run is waited for."""

    def __str__(self) -> str:
        return (
            f"run {self.args[0]!r} is not started yet: the event that starts it is stored "
            "and the orchestrator has not started it (ask with a timeout to wait for it)"
        )


class InvalidInputs(ValueError, InterlockError):
    """A run's inputs do not match the workflow's declared inputs; no run was created."""

    def __init__(self, workflow: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"invalid inputs for workflow {workflow}: " + "; ".join(problems))


class EventTooLarge(ValueError, InterlockError):
    """An event larger than the orchestrator takes (nothing was published)."""

    def __init__(self, size: int, limit: int, *, by_reference: bool = False) -> None:
        self.size = size
        self.limit = limit
        why = (
            "the bound of payloads stored by reference (INTERLOCK_OBJECT_MAX_BYTES)"
            if by_reference
            else "a quarter of the server's payload limit: an event is copied into the logs "
            "of the runs it reaches"
        )
        super().__init__(f"the event takes {size:,} bytes; events take at most {limit:,} ({why})")


class RunExists(ValueError, InterlockError):
    """A run with the requested id exists already (nothing was started, or forked)."""

    def __init__(self, run_id: str, *, nothing_was: str = "started") -> None:
        super().__init__(f"run {run_id!r} exists already; nothing was {nothing_was}")


class UnknownDeadLetter(LookupError, InterlockError):
    """No dead letter at that sequence."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"no dead letter at sequence {seq}")
        self.seq = seq


class NotRedrivable(ValueError, InterlockError):
    """A dead letter that cannot be published again as its message first came: it kept
    only the start of a message too large for a letter, or names no subject. The letter
    is left as it is."""

    def __init__(self, seq: int, why: str) -> None:
        super().__init__(f"dead letter {seq} cannot be redriven: {why}")
        self.seq = seq


class RunNotEnded(ValueError, InterlockError):
    """Only a run that has ended may be deleted; nothing was deleted."""

    def __init__(self, run_id: str, status: str, *, newest: str | None = None) -> None:
        if newest is None:
            why = f"run {run_id} is {status}: only an ended run can be deleted"
        else:
            why = (
                f"run {run_id} continued as new, and the newest run of its chain, {newest}, "
                f"is {status}: a chain is deleted once its last run has ended"
            )
        super().__init__(why)
        self.run_id = run_id
        self.status = status
