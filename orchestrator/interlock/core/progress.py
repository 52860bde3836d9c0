"""How far a map state's items and a DAG state's steps got, and where a run stands in a
chain of runs continued as new (parts of a run's state)."""

from __future__ import annotations

from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.vocabulary import StepStatus


class MapProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A map state's items and what became of each."""

    items: list[Any] = []
    parallelism: int = 1
    completion: str = "all"
    next: int = 0
    """The next item to request."""
    results: dict[int, Any] = {}
    failed: dict[int, ev.ErrorInfo] = {}
    at_least: int = 0
    sources: dict[int, str] = {}
    """Who answered each completed item (the answer's ``source``), for a quorum."""


class DagProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DAG state's steps and how far each got: ``held`` (its dependencies allow it but
    its evidence gate does not yet), ``running`` (asked for, or waiting for a retry), then
    ``completed``, ``failed`` or ``skipped``; a step not in ``status`` has not started."""

    steps: list[str] = []
    parallelism: int = 1
    completion: str = "all"
    status: dict[str, str] = {}
    results: dict[str, Any] = {}
    errors: dict[str, ev.ErrorInfo] = {}
    sources: dict[str, str] = {}
    """Who answered each completed step (the answer's ``source``)."""

    @property
    def running(self) -> int:
        """Steps in flight (asked for, or waiting for a retry); a held step is not."""
        return sum(1 for s in self.status.values() if s == StepStatus.RUNNING)

    def view(self) -> dict[str, dict[str, Any]]:
        """Each step as CEL reads it in ``steps``: its status, output (or error) and, once
        completed, who answered it (``source``)."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.steps:
            entry: dict[str, Any] = {"status": self.status.get(name, "pending")}
            if name in self.results:
                entry["output"] = self.results[name]
            if name in self.errors:
                e = self.errors[name]
                entry["error"] = {"class": e.error_class, "message": e.message, "code": e.code}
            if name in self.sources:
                entry["source"] = self.sources[name]
            out[name] = entry
        return out


class Chain(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run's place in a chain of runs continued as new: the run before it (whose
    ``run.continued`` names it), the run after it (once it has continued), its place."""

    previous: str | None = None
    next: str | None = None
    link: int = 0
    """0 for the first run of a chain, then 1, 2..."""
    state: str = ""
    """The state a continued run enters first (once admitted, when it waits for slots)."""
    reason: str = ""
    """Why the run before continued (``run.continued``'s ``reason``)."""


class PendingAction(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    action_id: str
    state: str
    index: int
    capability: str
    attempt: int = 1
    requested_at: str = ""
    deadline: str | None = None
    retry: ev.RetryInfo | None = None
    workflow: str | None = None
    item: int | None = None
    iteration: int | None = None
    step: str | None = None
    limits: list[ev.SlotClaim] = []
    """The capability's lines the request is in (see :mod:`interlock.core.capacity`)."""
    held: bool = False
    """Waiting for ``action.admitted``: not dispatched, no deadline running."""
    timeout_s: float | None = None
    """A held request's timeout, counted from its admission."""
    queued: str = ""
    """The limit its ``action.queued`` last said it waits for."""
