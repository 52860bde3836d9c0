"""Counters and histograms kept in plain Python numbers, exposed as prometheus_client's own.

The orchestrator updates its run metrics some fifteen times per run, from its event loop
alone. prometheus_client's :class:`~prometheus_client.Counter` and
:class:`~prometheus_client.Histogram` check the metric and take a lock on every update
(and a histogram's observation one lock for its sum, one for its bucket); here an update
adds to a float. The figures are read when the registry is collected (a scrape) and given
as the same metric family, samples, labels and values prometheus_client's classes give for
the same updates (``tests/observability/test_plaincounts.py`` compares the two), the
``_created`` series included unless prometheus_client was told to leave them out.

A scrape on another thread reads each figure as it is at that moment, as it would with
prometheus_client's classes (whose bucket, sum and count are locked one by one, not
together).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar, cast

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import metrics as _prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

_go_float = cast(Callable[[float], str], floatToGoString)
"""A float as Prometheus's text format writes it (how prometheus_client writes ``le``)."""


def _created_series() -> bool:
    """Whether prometheus_client gives ``_created`` samples (its environment variable
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` and ``disable_created_metrics()`` say)."""
    return bool(getattr(_prometheus_metrics, "_use_created", True))


class CounterChild:
    """One labelled series of a :class:`PlainCounter`."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self) -> None:
        """Add one."""
        self.value += 1.0


class HistogramChild:
    """One labelled series of a :class:`PlainHistogram`: a count per bucket (not
    cumulated until read) and the sum of the observations."""

    __slots__ = ("_bounds", "buckets", "created", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.buckets = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose upper bound it does not exceed."""
        self.sum += amount
        i = bisect_left(self._bounds, amount)
        if i < len(self._bounds) and amount <= self._bounds[i]:  # NaN: in no bucket
            self.buckets[i] += 1.0


Child = TypeVar("Child", "CounterChild", "HistogramChild")


class _Plain(Collector, Generic[Child]):
    _type = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        if registry is not None:
            registry.register(self)

    def _key(self, labelvalues: tuple[object, ...]) -> tuple[str, ...]:
        if not self._labelnames:
            msg = f"No label names were set when constructing {self._type}:{self._name}"
            raise ValueError(msg)
        if len(labelvalues) != len(self._labelnames):
            raise ValueError("Incorrect label count")
        return tuple(str(v) for v in labelvalues)

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _add_samples(self, metric: Metric, series: dict[str, str], child: Child) -> None:
        raise NotImplementedError

    def labels(self, *labelvalues: object) -> Child:
        key = self._key(labelvalues)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, self._type)]

    def collect(self) -> Iterable[Metric]:
        name, created = self._name, _created_series()
        metric = Metric(name, self._documentation, self._type)
        for labels, child in list(self._children.items()):
            series = dict(zip(self._labelnames, labels, strict=True))
            self._add_samples(metric, series, child)
            if created:
                metric.add_sample(name + "_created", dict(series), child.created)
        return [metric]


class PlainCounter(_Plain[CounterChild]):
    """A counter exposed as ``prometheus_client.Counter(name, documentation, labelnames)``.

    ``labels(*values)`` gives a series to ``inc()``; a counter without labels is counted
    with its own ``inc()``.
    """

    _type = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry)
        if not self._labelnames:
            self._children[()] = CounterChild()

    def inc(self) -> None:
        """Add one to a counter without labels."""
        child = None if self._labelnames else self._children[()]
        if child is None:
            msg = f"{self._type} metric is missing label values"
            raise ValueError(msg)
        child.inc()

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _add_samples(self, metric: Metric, series: dict[str, str], child: CounterChild) -> None:
        metric.add_sample(self._name + "_total", series, child.value)


class PlainHistogram(_Plain[HistogramChild]):
    """A histogram exposed as ``prometheus_client.Histogram(name, documentation,
    labelnames, buckets=buckets)``; ``labels(*values)`` gives a series to ``observe()``."""

    _type = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        if not labelnames:
            raise ValueError("a plain histogram has labels")
        self._bounds = bounds
        self._les = [_go_float(b) for b in bounds]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def _add_samples(self, metric: Metric, series: dict[str, str], child: HistogramChild) -> None:
        name, acc = self._name, 0.0
        for le, count in zip(self._les, list(child.buckets), strict=True):
            acc += count
            metric.add_sample(name + "_bucket", {**series, "le": le}, acc)
        metric.add_sample(name + "_count", dict(series), acc)
        if self._bounds[0] >= 0:
            metric.add_sample(name + "_sum", dict(series), child.sum)
