"""Gauges polled from JetStream: what only the server knows (consumer lag, requests
waiting per capability, live workers, and, from the run index, how long runs sit in a
state). Every replica reports the same values (``max`` in PromQL)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from interlock.core.vocabulary import RunStatus
from interlock.runtime.buckets import count_workers
from interlock.runtime.pausing import CAPABILITY, Pauses
from interlock.runtime.runview import epoch_seconds
from interlock.runtime.slotlines import ENTRIES, SlotEntry
from interlock.runtime.triggerstate import scan_rates
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import connection
from interlock.transport.kvread import scan_bucket
from interlock.transport.partitions import read_map
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.metrics")

_decode = msgspec.json.decode
decode_slots = msgspec.json.Decoder(SlotEntry).decode


@dataclass(slots=True)
class _Limit:
    """One concurrency limit summed over its keys (no key is a label)."""

    running: int = 0
    queued: int = 0
    longest: int = 0
    """The longest line of any one key."""
    oldest: float | None = None
    """When the run waiting longest of any key was queued (seconds since the epoch)."""


@dataclass(slots=True)
class _Stay:
    workflow: str
    state: str
    since: float
    waits: str = "unknown"


class ClusterMetrics(Collector):
    """Gauges polled from JetStream: consumer lag, waiting requests, workers, stuck runs.

    Args:
        js: a JetStream context.
        subjects: the installation's names.
        capabilities: the capabilities workflows may request (for zero-worker gauges).
        waits: what a state waits on, ``work`` or ``event`` (``Registry.state_waits``:
            namespace, workflow, version, state), the stuck-run gauge's ``waits`` label.
        registry: where the gauges are registered (None: not registered).
        interval: seconds between two polls.
        clock: seconds since the epoch (tests pass a fixed one).
    """

    def __init__(
        self,
        js: Any,
        subjects: Subjects,
        *,
        capabilities: Callable[[], Iterable[str]] = tuple,
        waits: Callable[[str, str, int, str], str] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        interval: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._capabilities = capabilities
        self._waits = waits
        self._interval = interval
        self._clock = clock
        self._lag: dict[tuple[str, str], tuple[int, int]] = {}
        self._queued: dict[str, int] = {}
        self._workers: dict[str, int] = {}
        self._stays: dict[str, _Stay] = {}
        self._limits: dict[str, _Limit] = {}
        self._paused: list[str] = []
        """The capabilities paused (their requests wait until resumed)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.index_synced = asyncio.Event()
        if registry is not None:
            registry.register(self)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = False
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._poll_forever()), loop.create_task(self._follow())]

    async def stop(self) -> None:
        # The loops also check this flag: a cancellation that arrives as one of nats-py's
        # timed waits completes is lost by Python 3.11's ``asyncio.wait_for``, and the
        # loop would go round again instead of ending.
        self._stopping = True
        # Stopping: what ended the task was logged where it happened.
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    async def _poll_forever(self) -> None:
        while not self._stopping:
            try:
                await self.poll()
            # Telemetry must never stop the orchestrator.
            except Exception as exc:  # noqa: BLE001
                log.warning("polling JetStream for metrics failed: %s", exc)
            await asyncio.sleep(self._interval)

    async def poll(self) -> None:
        """Read consumer lag, waiting requests and live workers once."""
        s = self._subjects
        lag: dict[tuple[str, str], tuple[int, int]] = {}
        found, _ = await read_map(connection(self._js), s)
        runs = [s.runs_stream_of(p) for p in range(found.streams)]
        for stream in (s.events_stream, s.results_stream, *runs, s.tasks_stream):
            for info in await self._js.consumers_info(stream):
                name = info.name or (info.config.durable_name if info.config else "") or ""
                lag[(stream, name)] = (info.num_pending or 0, info.num_ack_pending or 0)
        self._lag = lag
        info = await self._js.stream_info(s.tasks_stream, subjects_filter=s.capabilities_all)
        prefix = s.capability("")
        self._queued = {
            subject.removeprefix(prefix): count
            for subject, count in (info.state.subjects or {}).items()
        }
        self._workers = await self._live_workers()
        self._limits = await self._concurrency()
        paused = await Pauses(connection(self._js), self._subjects).all_paused()
        self._paused = sorted(
            k.removeprefix(CAPABILITY) for k in paused if k.startswith(CAPABILITY)
        )

    async def _concurrency(self) -> dict[str, _Limit]:
        """Each concurrency limit's holders and waiters, summed over its keys, and each
        trigger's rate (``<trigger>@rate``: the runs it started in the last ``per`` and
        those waiting their turn)."""
        kv = await self._js.key_value(self._subjects.slots_bucket)
        # Each key's counts, not its entry: an entry outlines up to 256 lines of keys a
        # publisher names, and the bucket is read a bounded batch at a time.
        counts: dict[str, tuple[str, int, int, float | None]] = {}
        async for _, token, value in scan_bucket(kv, ENTRIES):
            try:
                entry = decode_slots(value)
            # What is not an entry is reported by the orchestrator's own reads.
            except msgspec.DecodeError:
                counts.pop(token, None)  # (a deleted entry's marker, or a foreign value)
                continue
            first = epoch_seconds(entry.oldest) if entry.oldest else None
            counts[token] = (entry.limit, len(entry.holders), entry.queued, first)
        now_ms = int(self._clock() * 1000)
        async for token, rate in scan_rates(self._js, self._subjects):
            if rate is None:
                counts.pop(token, None)
                continue
            queued, since = rate.line(now_ms)
            first = None if since is None else since / 1000
            counts[token] = (f"{rate.trigger}@rate", rate.running(now_ms), queued, first)
        limits: dict[str, _Limit] = {}
        for limit, running, queued, first in counts.values():
            found = limits.setdefault(limit, _Limit())
            found.running += running
            found.queued += queued
            found.longest = max(found.longest, queued)
            if first is not None and (found.oldest is None or first < found.oldest):
                found.oldest = first
        return limits

    async def _live_workers(self) -> dict[str, int]:
        """Each capability's live workers: the bucket read a bounded batch at a time, as
        large as agents' heartbeats make it (64 MiB at most), every poll."""
        kv = await self._js.key_value(self._subjects.workers_bucket)
        return await count_workers(scan_bucket(kv))

    async def _follow(self) -> None:
        """Follow the run index (a KV bucket) to know which running run is in which state."""
        while not self._stopping:
            try:
                kv = await self._js.key_value(self._subjects.runs_bucket)
                # The entries (one token: a run id), not the listing keys beside them.
                watcher = await kv.watch("*")
                try:
                    async for entry in watcher:
                        if entry is None:
                            self.index_synced.set()
                            continue
                        self._index(entry.key, entry.value)
                finally:
                    # Closing: a connection already gone leaves nothing to undo.
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            except asyncio.CancelledError:
                raise
            # Telemetry must never stop the orchestrator.
            except Exception as exc:  # noqa: BLE001
                log.warning("following the run index failed: %s", exc)
            await asyncio.sleep(self._interval)

    def _index(self, key: str, value: bytes | None) -> None:
        try:
            # msgspec reads JSON as json.loads does, several times faster: this runs for
            # every write of the run index (about one a run).
            current = _decode(value or b"{}")
        except ValueError:  # msgspec.DecodeError is one
            current = {}
        if current.get("status") != RunStatus.RUNNING or not current.get("state"):
            self._stays.pop(key, None)
            return
        since = epoch_seconds(str(current.get("updated_at") or current.get("started_at") or ""))
        workflow, state = str(current.get("workflow", "")), str(current["state"])
        version = current.get("version")
        waits = "unknown"
        if self._waits is not None and isinstance(version, int):
            namespace = str(current.get("namespace") or "default")
            waits = self._waits(namespace, workflow, version, state)
        self._stays[key] = _Stay(workflow, state, since, waits)

    # -- collection ---------------------------------------------------------------------

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def _families(self) -> list[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "interlock_consumer_lag_messages",
            "Messages of a stream not yet delivered to a durable consumer (num_pending)",
            labels=["stream", "consumer"],
        )
        ack = GaugeMetricFamily(
            "interlock_consumer_ack_pending_messages",
            "Messages delivered to a durable consumer and not yet acknowledged",
            labels=["stream", "consumer"],
        )
        for (stream, consumer), (pending, ack_pending) in sorted(self._lag.items()):
            lag.add_metric([stream, consumer], pending)
            ack.add_metric([stream, consumer], ack_pending)
        in_flight = GaugeMetricFamily(
            "interlock_actions_in_flight",
            "Capability requests stored and not yet settled by a worker (work-queue messages)",
            labels=["capability"],
        )
        workers = GaugeMetricFamily(
            "interlock_capability_workers",
            "Live agent worker processes serving a capability (heartbeats)",
            labels=["capability"],
        )
        known = set(self._queued) | set(self._workers) | set(self._capabilities())
        for capability in sorted(known):
            in_flight.add_metric([capability], self._queued.get(capability, 0))
            workers.add_metric([capability], self._workers.get(capability, 0))
        active = GaugeMetricFamily(
            "interlock_runs_active",
            "Running runs by their current state (from the run index)",
            labels=["workflow", "state"],
        )
        oldest = GaugeMetricFamily(
            "interlock_runs_state_age_max_seconds",
            "How long the running run that entered its current state first has been there "
            "(waits: work, for its actions; event, for an event or a person)",
            labels=["workflow", "state", "waits"],
        )
        now = self._clock()
        groups: dict[tuple[str, str, str], tuple[int, float]] = {}
        for stay in list(self._stays.values()):
            key = (stay.workflow, stay.state, stay.waits)
            count, earliest = groups.get(key, (0, now))
            groups[key] = (count + 1, min(earliest, stay.since))
        counts: dict[tuple[str, str], int] = {}
        for (workflow, state, waits), (count, earliest) in sorted(groups.items()):
            counts[(workflow, state)] = counts.get((workflow, state), 0) + count
            oldest.add_metric([workflow, state, waits], max(now - earliest, 0.0))
        for (workflow, state), count in sorted(counts.items()):
            active.add_metric([workflow, state], count)
        paused = GaugeMetricFamily(
            "interlock_capability_paused",
            "1 for a paused capability: its requests wait, undispatched, until it is resumed",
            labels=["capability"],
        )
        for capability in self._paused:
            paused.add_metric([capability], 1)
        families = [lag, ack, in_flight, workers, active, oldest, paused]
        return [*families, *self._limit_families(now)]

    def _limit_families(self, now: float) -> list[GaugeMetricFamily]:
        """Per concurrency limit (its name a label, its keys not): runs holding a slot,
        waiting, the longest line of one key, and the longest wait."""
        running = GaugeMetricFamily(
            "interlock_concurrency_running",
            "Runs (or a capability's requests) holding a slot of a concurrency limit (all "
            "its keys), or a trigger's runs started in its rate's last per (<trigger>@rate)",
            labels=["limit"],
        )
        queued = GaugeMetricFamily(
            "interlock_concurrency_queued",
            "Runs (or a capability's requests) waiting for a slot or a token of a limit, "
            "or for their turn under a trigger's rate (all its keys)",
            labels=["limit"],
        )
        longest = GaugeMetricFamily(
            "interlock_concurrency_queued_worst_key",
            "Runs or requests waiting for the limit's key with the longest line",
            labels=["limit"],
        )
        waited = GaugeMetricFamily(
            "interlock_concurrency_oldest_wait_seconds",
            "How long the run or request waiting longest for the limit (any key) has waited",
            labels=["limit"],
        )
        for name, limit in sorted(self._limits.items()):
            running.add_metric([name], limit.running)
            queued.add_metric([name], limit.queued)
            longest.add_metric([name], limit.longest)
            age = 0.0 if limit.oldest is None else max(now - limit.oldest, 0.0)
            waited.add_metric([name], age)
        return [running, queued, longest, waited]
