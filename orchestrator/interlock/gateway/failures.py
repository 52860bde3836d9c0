"""Failed attempts per capability, as the gateway sees them appended to the run logs.

The gateway follows every run log's appends with one core NATS subscription (the same
subjects its readers may read), notes which capability each requested action asks for, and
counts each ``action.failed`` record against that capability, keeping the last hour's.
Counting starts when the gateway starts (``since``): failures before it are not read back.
A failure whose request came before the gateway started is matched from the run's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from interlock.core import events as ev
from interlock.runtime.runs import utc_now
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.gateway.runlogs import RunLogs

log = logging.getLogger("interlock.gateway")

WINDOW_S = 3600.0
"""How far back failures are counted."""
REMEMBERED = 100_000
"""Requested actions remembered (their capability), the oldest forgotten first."""
KEPT = 10_000
"""Failures kept per capability within the window."""


class LastFailure(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    action_id: str
    attempt: int
    error: str
    """The error's class (``timeout``, ``tool_error``...)."""
    message: str
    at: str
    will_retry: bool


class CapabilityFailures(msgspec.Struct, frozen=True, kw_only=True):
    capability: str
    failed: int
    """Failed attempts in the window (timeouts and failure answers; retried or not)."""
    last: LastFailure


class FailureReport(msgspec.Struct, frozen=True, kw_only=True):
    """Failed attempts per capability over the last ``window_s`` seconds (since ``since``
    when the gateway started later), most failures first."""

    since: str
    window_s: float
    capabilities: list[CapabilityFailures]


class Failures:
    """Counts failed attempts per capability from the run logs' appends."""

    def __init__(
        self, nc: NatsClient, subjects: Subjects, logs: RunLogs, *, window_s: float = WINDOW_S
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._logs = logs
        self._window = window_s
        self._prefix = subjects.runs_all[:-1]
        self._asked: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._failed: dict[str, deque[tuple[float, LastFailure]]] = {}
        self._sub: Subscription | None = None
        self._lookups: set[asyncio.Task[None]] = set()
        self.since = utc_now()

    async def start(self) -> None:
        self.since = utc_now()
        self._sub = await self._nc.subscribe(self._subjects.runs_all, cb=self._on_append)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for task in list(self._lookups):
            task.cancel()

    async def _on_append(self, msg: Msg) -> None:
        run_id = msg.subject[len(self._prefix) :]
        try:
            records = ev.decode_batch(msg.data)
        except Exception:  # noqa: BLE001 - not a batch of records: not ours to judge
            return
        for record in records:
            if isinstance(record, ev.ActionRequested) and record.data.workflow is None:
                self._asked[(run_id, record.data.action_id)] = record.data.capability
                self._asked.move_to_end((run_id, record.data.action_id))
                while len(self._asked) > REMEMBERED:
                    self._asked.popitem(last=False)
            elif isinstance(record, ev.ActionFailed):
                capability = self._asked.get((run_id, record.data.action_id))
                if capability is not None:
                    self._count(capability, run_id, record)
                elif len(self._lookups) < 100:
                    task = asyncio.create_task(self._look_up(run_id, record))
                    self._lookups.add(task)
                    task.add_done_callback(self._lookups.discard)

    async def _look_up(self, run_id: str, failed: ev.ActionFailed) -> None:
        """The capability of an action asked for before the gateway started: from the log."""
        try:
            cached = await self._logs.log(run_id)
        except Exception:  # noqa: BLE001 - a failure not counted is better than none read
            log.debug("failure of %s/%s: its request was not found", run_id, failed.data.action_id)
            return
        for record in cached.records:
            if (
                isinstance(record, ev.ActionRequested)
                and record.data.action_id == failed.data.action_id
                and record.data.workflow is None
            ):
                self._count(record.data.capability, run_id, failed)
                return

    def _count(self, capability: str, run_id: str, record: ev.ActionFailed) -> None:
        d = record.data
        last = LastFailure(
            run_id=run_id,
            action_id=d.action_id,
            attempt=d.attempt,
            error=d.error.error_class,
            message=d.error.message,
            at=record.time,
            will_retry=d.will_retry,
        )
        kept = self._failed.setdefault(capability, deque(maxlen=KEPT))
        kept.append((time.monotonic(), last))

    def report(self) -> FailureReport:
        cut = time.monotonic() - self._window
        out = []
        for capability, kept in list(self._failed.items()):
            while kept and kept[0][0] < cut:
                kept.popleft()
            if not kept:
                del self._failed[capability]
                continue
            out.append(
                CapabilityFailures(capability=capability, failed=len(kept), last=kept[-1][1])
            )
        out.sort(key=lambda c: (-c.failed, c.capability))
        return FailureReport(since=self.since, window_s=self._window, capabilities=out)
