"""The orchestrator's plain counters and histograms are exposed as prometheus_client's own
classes expose the same updates: the same families, samples, labels and values, in the same
order, in the text format and in OpenMetrics, with and without ``_created`` series."""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from interlock.runtime.metrics import DURATION_BUCKETS, RUN_BUCKETS
from interlock.runtime.plaincounts import PlainCounter, PlainHistogram

LABEL_VALUES = ("wf", "review", "", "a b", 'quo"te', "back\\slash", "new\nline", "é", "0", "1.5")
AMOUNTS = (0.0, 0.005, 0.01, 1, 2.5, 1800, 86400, 1e9, -0.5, -1e-12, math.inf, math.nan)


def amount(rng: random.Random, bounds: tuple[float, ...]) -> float:
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(AMOUNTS)
    if roll < 0.5:
        return float(rng.choice(bounds))  # on a bucket's bound
    return rng.expovariate(1 / rng.choice((0.01, 1.0, 100.0)))


def both(rng: random.Random) -> tuple[CollectorRegistry, CollectorRegistry]:
    """Two registries given the same random updates, one through prometheus_client's
    classes, one through the plain ones."""
    generic, plain = CollectorRegistry(), CollectorRegistry()
    shapes: list[tuple[str, tuple[str, ...], tuple[float, ...] | None]] = [
        ("t_counter", ("workflow",), None),
        ("t_pairs", ("workflow", "state"), None),
        ("t_lone", (), None),
        ("t_single_total", (), None),
        ("t_runs_seconds", ("workflow", "status"), RUN_BUCKETS),
        ("t_actions_seconds", ("capability",), DURATION_BUCKETS),
        ("t_below_zero", ("x",), (-1.0, 0.0, 1.0)),
        ("t_one_bucket", ("x",), (math.inf, math.inf)),
    ]
    pairs: list[tuple[Any, Any, tuple[float, ...] | None]] = []
    for name, labels, bounds in shapes:
        doc = f"help of {name}: with a \\ and a\nnew line"
        if bounds is None:
            pairs.append(
                (
                    Counter(name, doc, labels, registry=generic),
                    PlainCounter(name, doc, labels, registry=plain),
                    None,
                )
            )
        else:
            pairs.append(
                (
                    Histogram(name, doc, labels, buckets=bounds, registry=generic),
                    PlainHistogram(name, doc, labels, buckets=bounds, registry=plain),
                    bounds,
                )
            )
    for _ in range(rng.randrange(300)):
        reference, ours, bounds = rng.choice(pairs)
        values = [rng.choice(LABEL_VALUES) for _ in reference._labelnames]
        if bounds is None:
            (reference.labels(*values) if values else reference).inc()
            (ours.labels(*values) if values else ours).inc()
        else:
            x = amount(rng, bounds)
            reference.labels(*values).observe(x)
            ours.labels(*values).observe(x)
    return generic, plain


def without_created(text: str) -> str:
    return re.sub(r"^(\S+_created(?:\{.*\})?) \S+$", r"\1 T", text, flags=re.MULTILINE)


def created_values(registry: CollectorRegistry) -> Iterator[float]:
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                yield s.value


@pytest.mark.parametrize("seed", range(30))
def test_plain_metrics_are_exposed_as_prometheus_clients_own(seed: int) -> None:
    before = time.time()
    generic, plain = both(random.Random(seed))
    after = time.time()
    for expose in (generate_latest, openmetrics_latest):
        ours, theirs = expose(plain).decode(), expose(generic).decode()
        assert without_created(ours) == without_created(theirs)
    ours_families, their_families = list(plain.collect()), list(generic.collect())
    assert [(f.name, f.documentation, f.type, f.unit) for f in ours_families] == [
        (f.name, f.documentation, f.type, f.unit) for f in their_families
    ]
    for o, t in zip(ours_families, their_families, strict=True):
        assert [(s.name, s.labels, s.timestamp, s.exemplar) for s in o.samples] == [
            (s.name, s.labels, s.timestamp, s.exemplar) for s in t.samples
        ]
        for os_, ts in zip(o.samples, t.samples, strict=True):
            if os_.name.endswith("_created"):
                assert before <= os_.value <= after
            elif math.isnan(ts.value):
                assert math.isnan(os_.value)
            else:
                assert os_.value == ts.value, os_
    assert all(before <= c <= after for c in created_values(generic))


def test_without_created_series_as_prometheus_client_is_told() -> None:
    prometheus_metrics.disable_created_metrics()
    try:
        generic, plain = both(random.Random(99))
        text = generate_latest(plain).decode()
        assert text == generate_latest(generic).decode()
        assert "_created" not in text
    finally:
        prometheus_metrics.enable_created_metrics()


def test_misuse_is_refused_as_prometheus_client_refuses_it() -> None:
    registry = CollectorRegistry()
    labelled = PlainCounter("t_labelled", "h", ["a"], registry=registry)
    lone = PlainCounter("t_alone", "h", registry=registry)
    with pytest.raises(ValueError, match="label count"):
        labelled.labels("x", "y")
    with pytest.raises(ValueError, match="missing label values"):
        labelled.inc()
    with pytest.raises(ValueError, match="No label names"):
        lone.labels("x")
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PlainCounter("t_labelled", "h", ["a"], registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("t_alone_total", "h", registry=registry)
    with pytest.raises(ValueError, match="sorted order"):
        PlainHistogram("t_h", "h", ["a"], buckets=(2, 1), registry=registry)
