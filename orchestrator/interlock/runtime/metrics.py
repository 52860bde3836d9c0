"""Prometheus metrics of the orchestrator, and the telemetry view of runs they share with tracing.

Three parts:

- :class:`RunTracker` turns the relay's ``relayed`` hook into per-record callbacks that
  know the run they belong to (workflow, current state, pending actions: a
  :class:`~interlock.runtime.runview.RunView`, its own module). Every appended
  record passes the relay once in the whole deployment, whoever appended it (a replica or
  the CLI), so each is counted once; when a replica did not relay a run's earlier records
  (another replica did, or it restarted) it reads the run's log to catch up, without
  emitting anything for those older records.
- :class:`OrchestratorMetrics` counts and times what the records and the other hooks say.
- :class:`~interlock.runtime.cluster_metrics.ClusterMetrics` (its own module) polls what
  only the server knows: consumer lag, requests waiting per capability, live workers, and
  (from the run index) how long runs sit in a state.

Counters from several replicas add up (``sum`` in PromQL); the polled gauges describe the
whole installation, so every replica reports the same value (``max`` in PromQL).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from interlock.core import events as ev
from interlock.core.vocabulary import RunStatus
from interlock.runtime import foreign
from interlock.runtime.chainmetrics import ChainMetrics
from interlock.runtime.logstore import LogStore
from interlock.runtime.observe import OrchestratorObserver
from interlock.runtime.plaincounts import PlainCounter, PlainHistogram
from interlock.runtime.runview import (
    ACTION_OUTCOMES,
    RUN_STATUSES,
    VIEW_CHANGES,
    RunView,
    action_target,
    epoch_seconds,
    record_seq,
)
from interlock.runtime.triggermetrics import TriggerFlowMetrics

log = logging.getLogger("interlock.metrics")

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
CATCH_UP_ATTEMPTS = 6
"""Reads of a run's log a catch-up tries (about 8 s in all) by default."""
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 21600, 86400)


class RunSink(Protocol):
    """Told about each live record, with the run as it was just before that record."""

    def on_record(self, run: RunView, record: ev.AnyRecord) -> None: ...


class RunTracker(OrchestratorObserver):
    """Feeds live records to sinks with their run's context; catches up from the log.

    Args:
        run_log: where to read a run this process has not followed (None: never read;
            records of unknown runs are then reported with what they carry alone).
        sinks: told about every live record.
        capacity: runs kept in memory (least recently used go first; finished runs at once).
        catch_up_attempts: reads of a run's log tried before its records are reported
            without its history.
    """

    def __init__(
        self,
        run_log: LogStore | None,
        sinks: Sequence[RunSink] = (),
        *,
        capacity: int = 10_000,
        catch_up_attempts: int = CATCH_UP_ATTEMPTS,
    ) -> None:
        self._log = run_log
        self._attempts = max(1, catch_up_attempts)
        self._sinks = list(sinks)
        self._capacity = capacity
        self._runs: OrderedDict[str, RunView] = OrderedDict()
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._queues: dict[str, list[Sequence[ev.AnyRecord]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add_sink(self, sink: RunSink) -> None:
        self._sinks.append(sink)

    def view(self, run_id: str) -> RunView | None:
        """The run as last seen here (None when this process does not follow it)."""
        return self._runs.get(run_id)

    def relayed(self, run_id: str, records: Sequence[ev.AnyRecord]) -> None:
        # Fed by the relay, not by this process's own appends: every record passes the
        # relay once across all replicas, including those the CLI appended (``start``,
        # ``cancel``), so runs are counted once and completely.
        if not records:
            return
        ended = self._finished.get(run_id)
        if ended is not None:
            records = [r for r in records if record_seq(r) > ended]
            if not records:
                return  # a run that ended, read again
        queue = self._queues.get(run_id)
        if queue is not None:  # catching up: keep the log order
            queue.append(records)
            return
        first = record_seq(records[0])
        run = self._runs.get(run_id)
        if isinstance(records[0], ev.RunStarted):
            run = RunView(run_id)
        elif run is None or run.seq + 1 != first:
            if self._log is None or first <= 1:
                run = run or RunView(run_id)
            else:
                self._queues[run_id] = [records]
                task = asyncio.get_running_loop().create_task(self._catch_up(run_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
        self._report(run, records)

    async def drain(self) -> None:
        """Wait until every catch-up in progress is done (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _report(self, run: RunView, records: Sequence[ev.AnyRecord]) -> None:
        sinks = self._sinks
        changes = VIEW_CHANGES
        for record in records:
            # record_seq and RunView.apply, in line (they run for every record of every run)
            try:
                seq = int(record.id.rsplit(":", 1)[1])
            except (IndexError, ValueError):
                seq = 0
            last = run.seq
            if seq <= last and last:
                continue  # already reported
            for sink in sinks:
                try:
                    sink.on_record(run, record)
                except Exception:
                    log.exception("telemetry sink %s failed", type(sink).__name__)
            if seq > last:
                run.seq = seq
            change = changes.get(type(record))
            if change is not None:
                change(run, record, seq)
        self._keep(run)

    def _keep(self, run: RunView) -> None:
        if run.finished:
            self._runs.pop(run.run_id, None)
            # Remember it ended: a record the relay reads again (after a failover) must not
            # count the run a second time.
            self._finished[run.run_id] = run.seq
            while len(self._finished) > self._capacity:
                self._finished.popitem(last=False)
            return
        self._runs[run.run_id] = run
        self._runs.move_to_end(run.run_id)
        while len(self._runs) > self._capacity:
            self._runs.popitem(last=False)

    async def _catch_up(self, run_id: str) -> None:
        assert self._log is not None
        queue = self._queues[run_id]
        try:
            while queue:
                batch = queue[0]
                first = record_seq(batch[0])
                run = self._runs.get(run_id) or RunView(run_id)
                if run.seq + 1 < first:
                    await self._fold_with_retries(run, first)
                queue.pop(0)
                self._report(run, batch)
        finally:
            self._queues.pop(run_id, None)

    async def _fold_with_retries(self, run: RunView, before: int) -> None:
        """Fold the run's earlier records; when the log stays unreadable (a failover that
        lasts), go on with what the records carry rather than lose them."""
        for attempt in range(self._attempts):
            try:
                await self._fold_log(run, before)
            # Telemetry must never stop the orchestrator.
            except Exception as exc:  # noqa: BLE001
                if attempt + 1 == self._attempts:
                    log.warning(
                        "telemetry: cannot read the log of run %s, reporting without its "
                        "history: %s",
                        run.run_id,
                        exc,
                    )
                    return
                await asyncio.sleep(0.25 * 2**attempt)
            else:
                return

    async def _fold_log(self, run: RunView, before: int) -> None:
        """Apply, without reporting, the run's records logged before position ``before``."""
        assert self._log is not None
        for stream_seq, data in await self._log.read_raw(run.run_id, run.stream_seq):
            batch = ev.decode_batch(data)
            if not batch or record_seq(batch[0]) >= before:
                break
            for record in batch:
                if record_seq(record) > run.seq:
                    run.apply(record)
            run.stream_seq = stream_seq


# --- the orchestrator's own counters --------------------------------------------------


class _ForeignMessages(Collector):
    """``interlock_foreign_messages_total``: messages in run logs and bucket values this
    process skipped as not written by Interlock, by stream (each counted once; see
    :mod:`interlock.runtime.foreign`)."""

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "interlock_foreign_messages",
            "Messages in run logs, and bucket values, found not written by Interlock "
            "(skipped, reported; each once per process)",
            labels=["stream"],
        )
        for stream, count in sorted(foreign.COUNTS.items()):
            family.add_metric([stream], count)
        yield family


class OrchestratorMetrics(OrchestratorObserver):
    """Counters and histograms of one orchestrator process.

    They are plain numbers (:mod:`interlock.runtime.plaincounts`), updated from the event
    loop without a lock and exposed at a scrape as prometheus_client's classes would
    expose them.

    Register it twice: as an observer of the orchestrator (dead letters, redeliveries,
    conflicts, dispatches) and as a sink of a :class:`RunTracker` (run records).
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.runs_started = PlainCounter(
            "interlock_runs_started", "Runs started", ["workflow"], registry=r
        )
        self.runs_completed = PlainCounter(
            "interlock_runs_completed",
            "Runs that reached a terminal state",
            ["workflow"],
            registry=r,
        )
        self.runs_failed = PlainCounter(
            "interlock_runs_failed", "Runs that failed", ["workflow", "error_class"], registry=r
        )
        self.runs_cancelled = PlainCounter(
            "interlock_runs_cancelled", "Runs cancelled", ["workflow"], registry=r
        )
        self.run_duration = PlainHistogram(
            "interlock_run_duration_seconds",
            "Time from a run's start to its end (record times)",
            ["workflow", "status"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.states_entered = PlainCounter(
            "interlock_states_entered", "States entered by runs", ["workflow", "state"], registry=r
        )
        self.transitions = PlainCounter(
            "interlock_transitions", "Transitions fired", ["workflow"], registry=r
        )
        self.guard_failures = PlainCounter(
            "interlock_guard_failures",
            "Guards that could not be evaluated (the transition did not fire)",
            ["workflow", "state"],
            registry=r,
        )
        self.actions_requested = PlainCounter(
            "interlock_actions_requested", "Actions requested by runs", ["capability"], registry=r
        )
        self.actions_dispatched = PlainCounter(
            "interlock_actions_dispatched",
            "Capability requests published (a re-dispatch after a crash counts again)",
            ["capability"],
            registry=r,
        )
        self.action_duration = PlainHistogram(
            "interlock_action_duration_seconds",
            "Time from an action's request to its answer (record times)",
            ["capability", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.dead_letters = PlainCounter(
            "interlock_dead_letters",
            "Messages moved to the dead-letter stream",
            ["reason"],
            registry=r,
        )
        self.redeliveries = PlainCounter(
            "interlock_redeliveries",
            "Messages delivered again to an orchestrator consumer",
            ["consumer"],
            registry=r,
        )
        self.append_conflicts = PlainCounter(
            "interlock_append_conflicts",
            "Optimistic run-log appends that lost a race and were decided again",
            registry=r,
        )
        self.events_unrouted = PlainCounter(
            "interlock_events_unrouted",
            "Inbound events that started or reached no run",
            registry=r,
        )
        self.events_deferred = PlainCounter(
            "interlock_events_deferred", "Inbound events deferred: a lane was full", registry=r
        )
        self.chains = ChainMetrics(r)
        self._keep_children(r)

    def _keep_children(self, r: CollectorRegistry) -> None:
        """Each labelled metric's children kept, and what each kind of record counts."""
        r.register(_ForeignMessages())
        self._triggers = TriggerFlowMetrics(r)
        self.answers_late = PlainCounter(
            "interlock_answers_late",
            "Answers to attempts the run itself stopped waiting for: dropped, not dead-lettered",
            ["reason"],
            registry=r,
        )
        self._started = _Kept(self.runs_started)
        self._completed = _Kept(self.runs_completed)
        self._failed = _Kept(self.runs_failed)
        self._cancelled = _Kept(self.runs_cancelled)
        self._run_took = _Kept(self.run_duration)
        self._entered = _Kept(self.states_entered)
        self._transitions = _Kept(self.transitions)
        self._guards = _Kept(self.guard_failures)
        self._requested = _Kept(self.actions_requested)
        self._dispatched = _Kept(self.actions_dispatched)
        self._action_took = _Kept(self.action_duration)
        self._dead_letters = _Kept(self.dead_letters)
        self._redeliveries = _Kept(self.redeliveries)
        self._answers_late = _Kept(self.answers_late)
        self._counts: dict[type, Callable[[RunView, Any], None]] = {
            ev.RunStarted: self._run_started,
            ev.StateEntered: self._state_entered,
            ev.TransitionFired: self._transition_fired,
            ev.GuardFailed: self._guard_failed,
            ev.ActionRequested: self._action_requested,
            **dict.fromkeys(ACTION_OUTCOMES, self._action_ended),
            **dict.fromkeys(RUN_STATUSES, self._run_ended),
            ev.RunContinued: self._run_continued,
        }
        """What each kind of record counts, by the record's type."""

    # -- hooks --------------------------------------------------------------------------

    def dispatched(self, record: ev.ActionRequested, headers: dict[str, str]) -> None:
        self._dispatched[action_target(record.data)].inc()

    def dead_lettered(self, reason: str) -> None:
        self._dead_letters[reason].inc()

    def answer_late(self, reason: str) -> None:
        self._answers_late[reason].inc()

    def unrouted(self, event_type: str) -> None:
        # No event-type label: publishers choose types, and labels must stay bounded.
        self.events_unrouted.inc()

    def redelivered(self, consumer: str) -> None:
        self._redeliveries[consumer].inc()

    def deferred(self) -> None:
        # No publisher label: lanes come from the types publishers choose.
        self.events_deferred.inc()

    def conflict(self) -> None:
        self.append_conflicts.inc()

    def trigger_flow(self, what: str, detail: str) -> None:
        self._triggers.count(what, detail)

    def history_near(self, run_id: str, workflow: str, limit: str) -> None:
        self.chains.near(workflow, limit)

    # -- records ------------------------------------------------------------------------

    def on_record(self, run: RunView, record: ev.AnyRecord) -> None:
        count = self._counts.get(type(record))
        if count is not None:
            count(run, record)

    def _run_started(self, run: RunView, record: ev.RunStarted) -> None:
        self._started[record.data.workflow].inc()

    def _state_entered(self, run: RunView, record: ev.StateEntered) -> None:
        self._entered[run.workflow or "unknown", record.data.state].inc()

    def _transition_fired(self, run: RunView, record: ev.TransitionFired) -> None:
        self._transitions[run.workflow or "unknown"].inc()

    def _guard_failed(self, run: RunView, record: ev.GuardFailed) -> None:
        self._guards[run.workflow or "unknown", record.data.state].inc()

    def _action_requested(self, run: RunView, record: ev.ActionRequested) -> None:
        self._requested[action_target(record.data)].inc()

    def _action_ended(
        self, run: RunView, record: ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled
    ) -> None:
        pending = run.pending.get(record.data.action_id)
        if pending is not None:
            self._action_took[pending.capability, ACTION_OUTCOMES[type(record)]].observe(
                _elapsed(pending.requested_at, record.time)
            )

    def _run_ended(
        self, run: RunView, record: ev.RunCompleted | ev.RunFailed | ev.RunCancelled
    ) -> None:
        workflow = run.workflow or "unknown"
        status = RUN_STATUSES[type(record)]
        if status == RunStatus.COMPLETED:
            self._completed[workflow].inc()
        elif status == RunStatus.FAILED:
            assert isinstance(record, ev.RunFailed)
            self._failed[workflow, record.data.error.error_class].inc()
        else:
            self._cancelled[workflow].inc()
        if run.started_at:
            self._run_took[workflow, status].observe(_elapsed(run.started_at, record.time))

    def _run_continued(self, run: RunView, record: ev.RunContinued) -> None:
        self.chains.continued(run.workflow or "unknown", record.data.reason)


class _Kept(dict[Any, Any]):
    """A labelled metric's children by their label values (one value, or a tuple of
    them in the order of the metric's label names), each looked up once: ``labels()``
    checks its arguments and turns each into text on every call. The children live as
    long as their metric does anyway, so keeping them costs no memory of its own."""

    def __init__(self, metric: Any) -> None:
        super().__init__()
        self._metric = metric

    def __missing__(self, key: Any) -> Any:
        child = self[key] = (
            self._metric.labels(*key) if isinstance(key, tuple) else self._metric.labels(key)
        )
        return child


_SECONDS: dict[str, float] = {}
"""Record times read lately, and their epoch seconds: a run's records share their times
(an action's answer and the next request, a run's last records), and so do runs' records
written in the same millisecond."""
_SECONDS_KEPT = 4096


def _seconds(text: str) -> float:
    seconds = _SECONDS.get(text)
    if seconds is None:
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        seconds = _SECONDS[text] = epoch_seconds(text)
    return seconds


def _elapsed(start: str, end: str) -> float:
    return max(_seconds(end) - _seconds(start), 0.0)


def orchestrator_telemetry(
    run_log: LogStore | None, registry: CollectorRegistry = REGISTRY, *extra: RunSink
) -> tuple[RunTracker, OrchestratorMetrics]:
    """A run tracker feeding fresh orchestrator metrics (and ``extra`` sinks)."""
    metrics = OrchestratorMetrics(registry)
    tracker = RunTracker(run_log, [metrics, *extra])
    return tracker, metrics
