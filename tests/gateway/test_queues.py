"""GET /queues over a real socket: each concurrency limit and key with the runs holding a
slot and waiting, the same as the client's and the CLI's; a reader may look, nobody
without a token may."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import Any

import msgspec

from interlock.client import Client
from interlock.runtime.cluster_metrics import ClusterMetrics
from interlock.transport.subjects import Subjects
from support.gateway import concurrency_gauges, gateway_stack
from support.runtime import cli_env, eventually, run_cli, yaml

LIMITED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: limited
    spec:
      inputs:
        customer: {type: string, required: true}
      concurrency:
        - {key: inputs.customer, limit: 1, scope: slow-api}
      initial_state: work
      states:
        work:
          actions: [{capability: slow}]
          on: [{event: task.completed, goto: done}]
        done: {type: terminal}
    """
)


async def test_queues_show_who_holds_and_who_waits(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects, [LIMITED]) as gs:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        runs = [await client.start("limited", {"customer": "acme"}) for _ in range(3)]
        runs.append(await client.start("limited", {"customer": "beta"}))

        async def settled() -> bool:
            found = await client.queues()
            return [(q.key, q.running, q.queued) for q in found] == [("acme", 1, 2), ("beta", 1, 0)]

        await eventually(settled, what="two acme runs waiting behind one")
        async with gs.http("reader") as http:
            listed = (await http.get("/queues")).json()
            assert [
                {k: q[k] for k in ("limit", "key", "running", "size", "queued")} for q in listed
            ] == [
                {"limit": "default/slow-api", "key": "acme", "running": 1, "size": 1, "queued": 2},
                {"limit": "default/slow-api", "key": "beta", "running": 1, "size": 1, "queued": 0},
            ]
            assert listed[0]["oldest_wait_s"] >= 0
            assert listed[1]["oldest_wait_s"] is None
            mine = (await http.get("/queues", params={"workflow": "limited"})).json()
            assert [q["key"] for q in mine] == ["acme", "beta"]
            unknown = await http.get("/queues", params={"workflow": "nope"})
            assert unknown.status_code == 404, unknown.text
            # A queued run's description says where it stands in line, asked twice.
            for _ in range(2):
                third = (await http.get(f"/runs/{runs[2]}")).json()
                assert third["queued"] is True
                assert third["slots"] == [
                    {
                        "limit": "default/slow-api",
                        "key": "acme",
                        "size": 1,
                        "place": 2,
                        "running": 1,
                    }
                ]
        async with gs.http(None) as anonymous:
            assert (await anonymous.get("/queues")).status_code == 401

        # The CLI, as an operator types it.
        env = cli_env(nats_url, subjects.prefix)
        shown = await asyncio.to_thread(run_cli, "queues", "--workflow", "limited", env=env)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].split() == ["LIMIT", "KEY", "RUNNING", "QUEUED", "OLDEST", "WAIT", "PAUSED"]
        assert lines[1].split()[:4] == ["default/slow-api", "acme", "1/1", "2"]
        as_json = await asyncio.to_thread(run_cli, "queues", "-o", "json", env=env)
        assert msgspec.json.decode(as_json.stdout)[0]["queued"] == 2
        missing = await asyncio.to_thread(run_cli, "queues", "--workflow", "nope", env=env)
        assert missing.returncode != 0
        assert "nope" in missing.stderr

        # Metrics: per limit, its keys summed, the worst key's line, the longest wait.
        metrics = ClusterMetrics(gs.stack.js, subjects, registry=None)
        await metrics.poll()
        values = concurrency_gauges(metrics)
        assert values[("interlock_concurrency_running", "default/slow-api")] == 2
        assert values[("interlock_concurrency_queued", "default/slow-api")] == 2
        assert values[("interlock_concurrency_queued_worst_key", "default/slow-api")] == 2
        assert values[("interlock_concurrency_oldest_wait_seconds", "default/slow-api")] >= 0

        gs.stack.recorder.release.set()
        for run_id in runs:
            assert (await client.result(run_id, wait=True, timeout=30)).status == "completed"
        # A run's slot is freed in the background once its end is appended.
        await eventually(lambda: _none(client.queues()), what="every slot freed")
        await metrics.poll()
        assert not [
            f for f in metrics.collect() if f.name.startswith("interlock_conc") and f.samples
        ]


async def test_an_operator_pauses_and_resumes_a_workflow_over_http(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [LIMITED]) as gs:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        async with gs.http("reader") as reader:
            refused = await reader.post("/workflows/default/limited/pause")
            assert refused.status_code == 403
        async with gs.http("operator") as http:
            paused = await http.post("/workflows/default/limited/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json() == {
                "workflow": "default/limited",
                "paused": True,
                "changed": True,
                "runs": [],  # (its runs in flight go on: no "runs": true)
            }
            # Paused already: the pause stays as it was (since when, why), nothing changed.
            again = await http.post("/workflows/default/limited/pause", json={"reason": "x"})
            assert again.json()["changed"] is False, again.text
            said = await asyncio.to_thread(
                run_cli, "pause", "workflow", "limited", env=cli_env(nats_url, subjects.prefix)
            )
            assert said.returncode == 0, said.stderr
            assert "default/limited is paused already (since " in said.stdout
            assert ": paused over HTTP)" in said.stdout
            listed = await asyncio.to_thread(
                run_cli, "workflows", env=cli_env(nats_url, subjects.prefix)
            )
            assert re.search(
                r"^paused: default/limited since \S+Z: paused over HTTP \(its new runs wait",
                listed.stdout,
                re.M,
            ), listed.stdout
            assert (await http.post("/workflows/default/nope/pause")).status_code == 404
            # Named without its namespace, as the CLI takes it: the path is GET's, and the
            # 405 says which path the pause wants, where it said "Method Not Allowed".
            bare = await http.post("/workflows/limited/pause")
            assert bare.status_code == 405
            assert bare.headers["content-type"] == "application/problem+json"
            assert bare.json()["detail"] == (
                "POST is not allowed on /workflows/limited/pause: it takes GET, HEAD (a "
                "workflow's pause names its namespace: POST /workflows/default/limited/pause)"
                "; see /openapi.json"
            )

            async def seen() -> bool:
                return gs.stack.orchestrator.flow.admission.pauses.holds("default", "limited")

            await eventually(seen, what="the orchestrator sees the pause")
            started = await http.post(
                "/runs", json={"workflow": "limited", "inputs": {"customer": "acme"}}
            )
            assert started.status_code in (200, 201, 202), started.text
            run_id = started.json()["run_id"]

            async def waiting() -> bool:
                return (await http.get(f"/runs/{run_id}")).json()["slots"][0]["limit"] == (
                    "default/limited@paused"
                )

            await eventually(waiting, what="the run waits for the workflow")
            (held,) = await client.queues()
            assert held.limit == "default/limited@paused"
            assert (held.paused, held.paused_reason) == (True, "paused over HTTP")
            (line,) = (await http.get("/queues")).json()
            assert line["paused_reason"] == "paused over HTTP"
            assert line["paused_since"] is not None
            resumed = await http.post("/workflows/default/limited/resume")
            assert resumed.json() == {
                "workflow": "default/limited",
                "paused": False,
                "changed": True,
                "runs": [],
            }
            gs.stack.recorder.release.set()
            assert (await client.result(run_id, wait=True, timeout=30)).status == "completed"
            again = await http.post("/workflows/default/limited/resume")
            assert again.json()["changed"] is False


async def test_an_operator_pauses_and_resumes_a_capability_over_http(
    nats_url: str, subjects: Subjects
) -> None:
    """POST /capabilities/{name}/pause holds every new request of the capability (a reader
    may not; an unknown capability is 404); GET /queues says so, and ?capability= lists
    that capability's lines; resume lets the held request go on."""
    async with gateway_stack(nats_url, subjects, [LIMITED]) as gs:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        gs.stack.recorder.release.set()
        async with gs.http("reader") as reader:
            assert (await reader.post("/capabilities/slow/pause")).status_code == 403
        async with gs.http("operator") as http:
            bad = await http.post("/capabilities/slow/pause", json={"reason": 5})
            assert bad.status_code == 400, bad.text
            assert "reason" in bad.json()["detail"]
            paused = await http.post("/capabilities/slow/pause", json={"reason": "vendor 429s"})
            assert paused.status_code == 200, paused.text
            assert paused.json() == {"capability": "slow", "paused": True, "changed": True}
            # Paused already: its pause stays (since when, why), nothing changed.
            again = await http.post("/capabilities/slow/pause", json={"reason": "other"})
            assert again.json() == {"capability": "slow", "paused": True, "changed": False}
            said = await asyncio.to_thread(
                run_cli, "pause", "capability", "slow", env=cli_env(nats_url, subjects.prefix)
            )
            assert said.returncode == 0, said.stderr
            assert "capability slow is paused already (since " in said.stdout
            assert "vendor 429s" in said.stdout
            assert (await http.post("/capabilities/nope/pause")).status_code == 404

            async def seen() -> bool:
                return gs.stack.orchestrator.flow.admission.pauses.holds_capability("slow")

            await eventually(seen, what="the orchestrator sees the pause")
            run_id = await client.start("limited", {"customer": "acme"})

            async def held() -> list[dict[str, object]] | None:
                found = (await http.get("/queues", params={"capability": "slow"})).json()
                return found if found and found[0]["queued"] == 1 else None

            (line,) = await eventually(held, what="the request held")
            keys = ("limit", "kind", "capability", "paused", "paused_reason")
            assert {k: line[k] for k in keys} == {
                "limit": "cap:slow@paused",
                "kind": "paused",
                "capability": "slow",
                "paused": True,
                "paused_reason": "vendor 429s",  # the first pause's: the second changed nothing
            }
            assert line["paused_since"].endswith("Z"), line
            everything = (await http.get("/queues")).json()
            assert {q["limit"] for q in everything} == {"default/slow-api", "cap:slow@paused"}
            # Metrics: the pause, and the request it holds, with no key as a label.
            metrics = ClusterMetrics(gs.stack.js, subjects, registry=None)
            await metrics.poll()
            values = {
                (family.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in metrics.collect()
                for sample in family.samples
            }
            assert values[("interlock_capability_paused", (("capability", "slow"),))] == 1
            held = ("interlock_concurrency_queued", (("limit", "cap:slow@paused"),))
            assert values[held] == 1
            resumed = await http.post("/capabilities/slow/resume")
            assert resumed.json() == {"capability": "slow", "paused": False, "changed": True}
            assert (await client.result(run_id, wait=True, timeout=30)).status == "completed"

            async def lines() -> list[object]:
                return list((await http.get("/queues")).json())

            await eventually(lambda: _none(lines()), what="the capability's slot freed")


async def _none(found: Awaitable[list[Any]]) -> bool:
    return await found == []
