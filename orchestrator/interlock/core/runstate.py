"""A run's state: everything ``decide`` needs to know about a run, rebuilt by folding its
log (:mod:`interlock.core.state` holds how each record changes it)."""

from __future__ import annotations

from typing import Any

import msgspec

from interlock.core import events as ev
from interlock.core.progress import Chain, DagProgress, MapProgress, PendingAction
from interlock.core.spawn import SpawnProgress
from interlock.core.vocabulary import FINISHED, RunStatus


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything decide needs to know about a run; rebuilt by folding its log."""

    run_id: str = ""
    workflow: str = ""
    namespace: str = "default"
    version: int = 0
    spec_hash: str = ""
    status: str = RunStatus.NEW
    seq: int = 0
    """How many records have been folded: the log position of the last one."""
    started_at: str = ""
    updated_at: str = ""
    state: str = ""
    inputs: dict[str, Any] = {}
    context: dict[str, Any] = {}
    states: dict[str, dict[str, Any]] = {}
    """``states.<name>.output``: the result of each state's last completed action."""
    pending: dict[str, PendingAction] = {}
    next_action: int = 0
    result: Any = None
    transitions: int = 0
    actions: int = 0
    seen: dict[str, None] = {}
    """Source+id of the last :data:`SEEN_KEPT` external events taken, oldest first (so
    encoding is stable): a redelivery of one of them is not taken again."""
    outputs: dict[str, Any] | None = None
    error: ev.ErrorInfo | None = None
    traceparent: str | None = None
    trigger: dict[str, Any] | None = None
    visit: int = 0
    """Log position of the current state's ``state.entered``: timers of an earlier visit
    are stale."""
    timers: dict[str, ev.TimerScheduledData] = {}
    map: MapProgress | None = None
    correlation_key: str | None = None
    parent: ev.ParentRef | None = None
    dag: DagProgress | None = None
    evidence: dict[str, dict[str, Any]] | None = None
    """What evidence events have proven, by subject then predicate (the latest value of
    each); kept across states, so evidence sent before a gate is checked still counts."""
    cost: float | None = None
    """The sum of the ``cost`` the answers reported (None: none reported any)."""
    spent: dict[str, int] | None = None
    """Transitions fired per edge budget (None: none spent)."""
    spawn: SpawnProgress | None = None
    """The run's depth and spawn allowance (None: a root run without spawn budgets)."""
    slots: list[ev.SlotClaim] | None = None
    """The concurrency slots the run needs (None: its workflow declares no limit)."""
    paused: ev.RunPause | None = None
    """Set while the run is paused (``run.paused`` to ``run.resumed``)."""
    waits: ev.RunPause | None = None
    """Set while a run migrated in its state waits for the slots its new version asks for
    (``run.queued`` with ``holds`` to ``run.admitted``): the events held meanwhile."""
    history: ev.HistoryLimits | None = None
    """The history limits the run was started under (None: none)."""
    chain: Chain | None = None
    """Where the run stands in a chain of runs continued as new (None: in none)."""
    enters: str | None = None
    """The state a queued fork enters once admitted (None: none waits)."""
    size: int = 0
    """The bytes of the records folded, each as :func:`events.encode` writes it: what
    ``history.max_bytes`` counts (never pinned: see :mod:`interlock.core.statecodec`)."""

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def queued(self) -> bool:
        """Waiting for its concurrency slots: running, and no state entered yet (or, a run
        migrated onto a limited version, holding in its state until admitted)."""
        if self.status != RunStatus.RUNNING:
            return False
        return self.waits is not None or (self.slots is not None and not self.state)
