"""Spawn budgets across a tree of runs (``budget.max_spawn_depth``,
``budget.max_total_spawns``): where a run stands, what it may still spawn, and what it
hands a child run. Pure; every value comes from the run's log (see docs/language.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.vocabulary import ErrorClass

if TYPE_CHECKING:  # the run state folds without the compiler's modules (read commands)
    from interlock.core.definition import Definition


class SpawnProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run's place in its tree of runs and what it has spent of its spawn allowance."""

    depth: int = 0
    max_depth: int | None = None
    allowance: int | None = None
    used: int = 0
    """Spawns charged to the allowance: the run's own actions, what its ended child runs
    reported, and the allowance still reserved for the child runs in flight."""
    held: dict[str, int] = {}
    """Allowance reserved per child run in flight (``<action id>#<attempt>``)."""

    @classmethod
    def of(cls, started: ev.SpawnBudget | None) -> SpawnProgress | None:
        if started is None:
            return None
        return cls(depth=started.depth, max_depth=started.max_depth, allowance=started.allowance)

    def charge(self, key: str, reserved: int | None) -> SpawnProgress:
        """One more spawn; a child run's reservation on top."""
        if self.allowance is None:
            return self
        if reserved is None:
            return replace(self, used=self.used + 1)
        return replace(self, used=self.used + 1 + reserved, held={**self.held, key: reserved})

    def settle(self, key: str, spent: int) -> SpawnProgress:
        """A child run ended having spent ``spent``: only that stays charged."""
        if key not in self.held:
            return self
        held = dict(self.held)
        reserved = held.pop(key)
        return replace(self, used=self.used - reserved + min(spent, reserved), held=held)

    def refusal(self) -> ev.ErrorInfo | None:
        """Why one more spawn is refused (None: it is allowed)."""
        depth = self.depth + 1
        if self.max_depth is not None and depth > self.max_depth:
            return ev.ErrorInfo(
                error_class=ErrorClass.BUDGET_EXCEEDED,
                message=f"a spawn at depth {depth} is deeper than budget.max_spawn_depth "
                f"allows ({self.max_depth} below the first run of the tree)",
                code="max_spawn_depth",
            )
        if self.allowance is not None and self.used >= self.allowance:
            return ev.ErrorInfo(
                error_class=ErrorClass.BUDGET_EXCEEDED,
                message=f"no spawn left: this run's share of budget.max_total_spawns "
                f"({self.allowance}) is spent",
                code="max_total_spawns",
            )
        return None

    def handed_down(self, sharing: int = 1) -> ev.SpawnBudget:
        """What a child run is handed: its depth, the tree's deepest spawn, and what is
        left of the allowance once this spawn is charged, split ``sharing`` ways (a map's
        item shares it with the items not yet asked for)."""
        allowance = None
        if self.allowance is not None:
            allowance = (self.allowance - self.used - 1) // max(1, sharing)
        return ev.SpawnBudget(depth=self.depth + 1, max_depth=self.max_depth, allowance=allowance)


def spawn_budget(definition: Definition, handed: ev.SpawnBudget | None) -> ev.SpawnBudget | None:
    """The spawn budgets a run starts under: what its parent handed down, narrowed by its
    own ``budget.max_spawn_depth`` (counted from the run) and ``budget.max_total_spawns``.
    None for a run that nobody spawned and that declares neither."""
    depth = 0 if handed is None else handed.depth
    max_depth = None if handed is None else handed.max_depth
    allowance = None if handed is None else handed.allowance
    own = definition.budget
    if own.max_spawn_depth is not None:
        limit = depth + own.max_spawn_depth
        max_depth = limit if max_depth is None else min(max_depth, limit)
    if own.max_total_spawns is not None:
        limit = own.max_total_spawns
        allowance = limit if allowance is None else min(allowance, limit)
    if handed is None and max_depth is None and allowance is None:
        return None
    return ev.SpawnBudget(depth=depth, max_depth=max_depth, allowance=allowance)
