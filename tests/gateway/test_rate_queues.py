"""Runs waiting their turn under a trigger's rate, where queued things are shown: their
line's count and oldest wait in GET /queues (over a real socket) and ``interlock queues``
(an operator's credential), and the limit's gauges, summed over keys."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.rfc3339 import parse_time
from interlock.core.windowing import MAX_WAITS, RateEntry
from interlock.runtime.cluster_metrics import ClusterMetrics
from interlock.transport.subjects import Subjects
from support.gateway import GatewayStack, concurrency_gauges, gateway_stack
from support.runtime import cli_env, eventually, run_cli, yaml

CALLS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: calls}
    spec:
      triggers:
        - event: com.example.call
          rate: {limit: 2, per: 1h, key: data.customer}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on: [{event: go, goto: done}]
        done: {type: terminal}
    """
)
LINE = "default/calls#trigger1@rate"


async def _post(gs: GatewayStack, event_id: str, customer: str) -> None:
    event = {
        "specversion": "1.0",
        "id": event_id,
        "source": "/api",
        "type": "com.example.call",
        "datacontenttype": "application/json",
        "data": {"customer": customer},
    }
    async with gs.http("publisher") as http:
        posted = await http.post(
            "/events", json=event, headers={"Content-Type": "application/cloudevents+json"}
        )
    assert posted.status_code == 202, posted.text


async def _queued_at(gs: GatewayStack, event_id: str) -> datetime | None:
    definition, _ = await gs.stack.client.registry.latest("calls")
    run_id = derive_run_id(definition, "/api", event_id)
    try:
        records, _ = await gs.stack.client.runs.log.read(run_id)
    except Exception:  # noqa: BLE001 - not started yet
        return None
    queued = [r for r in records if isinstance(r, ev.RunQueued)]
    return parse_time(queued[0].time) if queued else None


async def _queued(gs: GatewayStack, event_id: str) -> datetime:
    found = await eventually(lambda: _queued_at(gs, event_id), what=f"{event_id} queued")
    assert isinstance(found, datetime)
    return found


async def test_runs_waiting_for_a_triggers_rate_are_counted_with_their_oldest_wait(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [CALLS]) as gs:
        before = datetime.now(UTC).replace(microsecond=0)
        for n in range(5):
            await _post(gs, f"a{n}", "acme")
        await _post(gs, "b0", "beta")
        # Two acme runs start now; three wait (1 h, 1 h, 2 h); beta's one starts.
        waits = [await _queued(gs, f"a{i}") for i in (2, 3, 4)]

        async def listed() -> list[dict[str, Any]] | None:
            async with gs.http("reader") as http:
                lines = (await http.get("/queues", params={"workflow": "calls"})).json()
            return lines if [q["queued"] for q in lines] == [3, 0] else None

        acme, beta = await eventually(listed, what="the rate's lines")
        assert (acme["limit"], acme["key"], acme["kind"]) == (LINE, "acme", "rate")
        assert (acme["running"], acme["size"]) == (2, 2)
        # The first in line came no earlier than its event was posted, no later than its
        # run was queued, and before the others waiting behind it.
        oldest = parse_time(acme["oldest_queued_at"])
        assert before <= oldest <= min(waits)
        assert acme["oldest_wait_s"] >= 0
        assert (beta["key"], beta["oldest_queued_at"], beta["oldest_wait_s"]) == (
            "beta",
            None,
            None,
        )

        # The CLI, as an operator types it: the line's count and its oldest wait.
        env = cli_env(nats_url, subjects.prefix)
        shown = await asyncio.to_thread(run_cli, "queues", "--workflow", "calls", env=env)
        assert shown.returncode == 0, shown.stderr
        line = shown.stdout.splitlines()[1].split()
        assert line[:4] == [LINE, "acme", "2/2", "3"], shown.stdout
        assert line[4] != "-", shown.stdout
        assert line[4].endswith("s"), shown.stdout

        # Metrics: the rate is a limit of its own (keys summed), its oldest wait as the
        # gauges say it half an hour after the first came.
        at = oldest.timestamp() + 1800
        metrics = ClusterMetrics(gs.stack.js, subjects, registry=None, clock=lambda: at)
        await metrics.poll()
        values = concurrency_gauges(metrics)
        assert values[("interlock_concurrency_queued", LINE)] == 3
        assert values[("interlock_concurrency_queued_worst_key", LINE)] == 3
        assert values[("interlock_concurrency_running", LINE)] == 3  # acme's 2, beta's 1
        assert values[("interlock_concurrency_oldest_wait_seconds", LINE)] == pytest.approx(1800)


def test_the_oldest_wait_is_exact_up_to_the_waits_kept_and_from_below_past_them() -> None:
    per = 1000
    entry = RateEntry(trigger="t", key="k", limit=1, per_s=per / 1000)
    for given in range(200):  # one a ms, each a per after the one before
        entry.waiting(given * per + per, given)
    assert len(entry.waits) <= MAX_WAITS
    assert entry.waits[0] == [per, 0]
    assert entry.waits[-1] == [200 * per, 199]
    # Run i starts at (i + 1) * per: at each time the first still waiting is known from below.
    truth = [(now, now // per) for now in range(0, 200 * per, 997)]
    for now, first in truth:
        since = entry.waited_since(now)
        assert since is not None
        assert first <= since < first + 4  # the kept arrivals are at most 4 apart
    few = RateEntry(trigger="t", key="k", limit=1, per_s=1.0)
    for given in range(MAX_WAITS):
        few.waiting(given * per + per, given)
    assert [few.waited_since(now) for now, _ in truth[:30]] == [f for _, f in truth[:30]]
    assert few.waited_since(10**9) is None
    assert RateEntry(trigger="t", key="k", limit=1, per_s=1.0).waited_since(0) is None
