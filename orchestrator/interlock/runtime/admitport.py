"""What :class:`~interlock.runtime.runs.Runs` asks of admission at once
(:mod:`interlock.runtime.atonce`), which itself stands on the runs: the port between."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from interlock.core import events as ev
    from interlock.core.definition import Definition
    from interlock.core.state import RunState
    from interlock.runtime.payloads import Payloads

Decide = Callable[..., Awaitable[Any]]
"""``Runs._decide``: a decision, on the thread kept for costly ones where it may be."""


class Taken(Protocol):
    """A decision's records with admissions made in them (``asked``: the decision's own,
    as it made them)."""

    asked: list[ev.AnyRecord]

    def in_time(self) -> bool: ...

    def appending(self) -> tuple[list[ev.AnyRecord], RunState]: ...

    def refused(self) -> None: ...


class AdmitsAtOnce(Protocol):
    """Takes free slots before an append that asks for them."""

    async def take(
        self,
        run_id: str,
        definition: Definition,
        records: list[ev.AnyRecord],
        states: tuple[RunState, RunState | None],
        decide: Decide,
    ) -> Taken | None: ...

    async def opening(
        self,
        run_id: str,
        definition: Definition,
        decided: tuple[list[ev.AnyRecord], RunState],
        payloads: Payloads | None,
        decide: Decide,
    ) -> Taken | None: ...
