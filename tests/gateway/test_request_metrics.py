"""The gateway's request metrics, read from its own /metrics over a real socket."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from interlock.transport.subjects import Subjects
from support.gateway import HELLO, gateway_stack


async def scrape(http: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await http.get("/metrics")).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("interlock_gateway_request"):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def count(
    before: dict[Any, float], after: dict[Any, float], route: str, method: str, status: int
) -> float:
    key = (
        "interlock_gateway_requests_total",
        (("method", method), ("route", route), ("status", str(status))),
    )
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_requests_are_counted_by_route_template_method_and_status(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        gateway_stack(nats_url, subjects, [HELLO]) as gs,
        gs.http("operator") as http,
        gs.http(None) as anonymous,
    ):
        before = await scrape(http)
        for _ in range(3):
            assert (await http.get("/runs")).status_code == 200
        assert (await http.get("/runs/r-none")).status_code == 404
        assert (await http.get("/runs/r-other")).status_code == 404
        assert (await anonymous.get("/runs")).status_code == 401
        assert (await http.get("/no/such/path/x1")).status_code == 404
        assert (await http.delete("/runs")).status_code == 405
        posted = await http.post(
            "/events",
            headers={
                "ce-specversion": "1.0",
                "ce-type": "com.example.greet",
                "ce-source": "test",
                "ce-id": "m1",
                "content-type": "application/json",
            },
            content=b'{"lang": "fr"}',
        )
        assert posted.status_code == 202
        after = await scrape(http)

    assert count(before, after, "/runs", "GET", 200) == 3
    assert count(before, after, "/runs", "GET", 401) == 1
    assert count(before, after, "/runs/{run_id}", "GET", 404) == 2  # one series, two paths
    assert count(before, after, "unmatched", "GET", 404) == 1
    assert count(before, after, "/runs", "DELETE", 405) == 1
    assert count(before, after, "/events", "POST", 202) == 1
    assert not any("r-none" in str(labels) or "x1" in str(labels) for _, labels in after)
    timed = (
        "interlock_gateway_request_duration_seconds_count",
        (("method", "GET"), ("route", "/runs")),
    )
    assert after[timed] - before.get(timed, 0.0) == 4
