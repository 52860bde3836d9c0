"""The health endpoint of ``interlock serve``: metrics, tracing and probes of one
orchestrator process (the endpoint itself: :mod:`interlock.transport.health`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from interlock.transport.health import (
    ALL_HOSTS,
    DEFAULT_AGENT_PORT,
    DEFAULT_SERVE_PORT,
    HealthServer,
    Liveness,
    nats_readiness,
)

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Iterator

    from opentelemetry.sdk.trace import TracerProvider

    from interlock.runtime.owners import OwnerDesk
    from interlock.runtime.ownership import Ownership
    from interlock.runtime.service import Orchestrator
    from interlock.runtime.sweep import Sweep

__all__ = [
    "DEFAULT_AGENT_PORT",
    "DEFAULT_SERVE_PORT",
    "OrchestratorInstrumentation",
    "consumers_alive",
]

log = logging.getLogger("interlock.health")


# --- wiring a process -----------------------------------------------------------------


def consumers_alive(orchestrator: Orchestrator) -> Liveness:
    """Alive while every consumer loop of ``orchestrator`` runs (or was stopped)."""

    return orchestrator.loop_failure


class _Partitions(Collector):
    """The run-log partitions this replica relays (its leases), and how often they moved."""

    def __init__(self, ownership: Ownership, counters: Counter[str], desk: OwnerDesk) -> None:
        self._ownership, self._counters, self._desk = ownership, counters, desk

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        held = GaugeMetricFamily(
            "interlock_partitions_held",
            "Run-log partitions this replica relays (holds the lease of; 0 with one partition)",
        )
        held.add_metric([], len(self._ownership.held))
        moves = CounterMetricFamily(
            "interlock_partition_moves",
            "Partition leases this replica took or let go",
        )
        moves.add_metric([], self._ownership.moves)
        handed = CounterMetricFamily(
            "interlock_handovers",
            "Messages for runs of partitions other replicas hold, by what became of them: "
            "handed (decided by the holder), unheld (no holder: decided here), unanswered "
            "(no reply in time: decided here)",
            labels=["outcome"],
        )
        for outcome in ("handed", "unheld", "unanswered"):
            handed.add_metric([outcome], self._counters[f"handovers_{outcome}"])
        taken = CounterMetricFamily(
            "interlock_handovers_taken",
            "Messages handed here by other replicas and decided here",
        )
        taken.add_metric([], self._desk.decided)
        return iter((held, moves, handed, taken))


class SweepMetrics(Collector):
    """What the sweep of slots taken at once gave back, and what it read to find them."""

    def __init__(self, sweeper: Sweep) -> None:
        self._sweeper = sweeper

    def collect(self) -> Iterator[CounterMetricFamily]:
        freed = CounterMetricFamily(
            "interlock_slots_swept",
            "Slots taken at once for an append that never came (its process killed between "
            "the take and the append, or the append refused), given back because no log asks "
            "for them: a run's, or a capability request's",
            labels=["kind"],
        )
        for kind in ("run", "request"):
            freed.add_metric([kind], self._sweeper.freed[kind])
        read = CounterMetricFamily(
            "interlock_slots_sweep_entries_read",
            "Slots entries the sweep read: those changed since its last round (every entry "
            "at its first)",
        )
        read.add_metric([], self._sweeper.read)
        return iter((freed, read))


class OrchestratorInstrumentation:
    """Metrics, tracing and health endpoints of one ``interlock serve`` process.

    Build it before :meth:`Orchestrator.start` (its observers must see the first
    decisions), :meth:`start` it after, :meth:`stop` it after the orchestrator stops.

    Args:
        orchestrator: the orchestrator to watch.
        port: the HTTP port (0: any free port; None: no endpoint, metrics still counted).
        host: the address it listens on.
        registry: where the metrics go.
        provider: a tracer provider (None: no spans).
        poll_interval: seconds between two polls of JetStream for the cluster gauges.
    """

    def __init__(
        self,
        orchestrator: Orchestrator,
        *,
        port: int | None,
        host: str = ALL_HOSTS,
        registry: CollectorRegistry = REGISTRY,
        provider: TracerProvider | None = None,
        poll_interval: float = 10.0,
    ) -> None:
        from interlock.runtime.cluster_metrics import ClusterMetrics
        from interlock.runtime.metrics import RunTracker, orchestrator_telemetry
        from interlock.runtime.tracing import orchestrator_tracer

        self.tracker: RunTracker
        self.tracker, self.metrics = orchestrator_telemetry(orchestrator.runs.log, registry)
        orchestrator.observers.add(self.tracker)
        orchestrator.observers.add(self.metrics)
        self.tracer = None
        if provider is not None:
            self.tracer = orchestrator_tracer(provider, self.tracker, orchestrator.subjects)
            orchestrator.observers.add(self.tracer)
        self.provider = provider
        self.cluster = ClusterMetrics(
            orchestrator.js,
            orchestrator.subjects,
            capabilities=orchestrator.registry.known_capabilities,
            waits=orchestrator.registry.state_waits,
            registry=registry,
            interval=poll_interval,
        )
        owners = orchestrator.owners
        registry.register(
            _Partitions(orchestrator.relay.ownership, orchestrator.counters, owners.desk)
        )
        registry.register(SweepMetrics(orchestrator.flow.at_once.sweeper))
        ready = nats_readiness(orchestrator.nc, orchestrator.subjects)
        alive = consumers_alive(orchestrator)
        self.server = (
            None
            if port is None
            else HealthServer(port, ready=ready, alive=alive, registry=registry, host=host)
        )

    async def start(self) -> None:
        self.cluster.start()
        if self.server is not None:
            try:
                await self.server.start()
            except OSError as exc:
                # Telemetry must not keep the orchestrator from running.
                # An expected failure: no traceback.
                log.error(  # noqa: TRY400
                    "cannot serve metrics on port %d: %s; running without /metrics, /healthz "
                    "and /readyz: give --metrics-port (INTERLOCK_METRICS_PORT) a free port, "
                    "0 for any, or --no-metrics for none",
                    self.server.port,
                    exc,
                )
                self.server = None

    async def stop(self) -> None:
        await self.cluster.stop()
        if self.server is not None:
            await self.server.stop()
        await self.tracker.drain()
        if self.provider is not None:
            self.provider.shutdown()
