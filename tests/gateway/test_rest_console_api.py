"""What the web console reads beyond the run basics, over REST against a real stack running
the console tests' ``review`` workflow: a stored version's workflow with its transitions, a
run's explanation (each guard weighed), a replay against another version, and runs filtered
by start time. (The ``catch`` and ``timeout`` edges are pinned in tests/test_views.py.)"""

from __future__ import annotations

import asyncio

import pytest

from interlock.transport.subjects import Subjects
from support.gateway import (
    HOOK,
    IDLE_AGENT,
    REVIEW,
    REVIEW_V2,
    UNSERVED,
    GatewayStack,
    gateway_stack,
    wait_status,
)

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [REVIEW]) as stack:
        yield stack


async def test_versions_explain_replay_and_time_filter(gs: GatewayStack) -> None:
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "review", "inputs": {"score": 7}})
        run_id = r.json()["run_id"]
        await wait_status(gs, run_id, "running", "approval")
        await gs.stack.apply(REVIEW_V2)

        v1 = (await http.get("/workflows/review", params={"version": 1})).json()
        newest = (await http.get("/workflows/default/review")).json()
        assert (v1["version"], newest["version"], newest["versions"]) == (1, 2, [1, 2])
        assert "result.score > 7" in str(v1["manifest"])
        assert "result.score >= 7" in str(newest["manifest"])
        assert v1["kinds"] == {
            "scoring": "normal",
            "approval": "human_in_the_loop",
            "merged": "terminal",
            "rejected": "terminal",
        }
        assert v1["transitions"] == [
            {
                "from": "scoring",
                "to": "merged",
                "kind": "on",
                "event": "task.completed",
                "guard": "result.score > 7",
                "index": 0,
            },
            {
                "from": "scoring",
                "to": "approval",
                "kind": "on",
                "event": "task.completed",
                "index": 1,
            },
            {
                "from": "approval",
                "to": "merged",
                "kind": "on",
                "event": "approval.granted",
                "index": 0,
            },
            {
                "from": "approval",
                "to": "rejected",
                "kind": "on",
                "event": "approval.denied",
                "index": 1,
            },
        ]
        assert (await http.get("/workflows/review", params={"version": 9})).status_code == 404
        assert (await http.get("/workflows/review", params={"version": "x"})).status_code == 400

        explained = (await http.get(f"/runs/{run_id}/explain")).json()
        checks = [c for step in explained["steps"] for c in step["checks"]]
        assert checks[0]["guard"] == "result.score > 7"
        assert checks[0]["outcome"] == "false"
        assert checks[0]["reads"] == {"result.score": 7}
        assert (await http.get(f"/runs/{run_id}/explain", params={"at": 999})).status_code == 400

        report = (await http.get(f"/runs/{run_id}/replay", params={"against": "2"})).json()
        assert report["agree"] is False
        assert report["replayed_end"] != report["recorded_end"]
        for bad in ("", "0", "review@1", "../../etc/passwd", "/etc/passwd"):
            r = await http.get(f"/runs/{run_id}/replay", params={"against": bad})
            assert r.status_code == 400, bad
        assert (await http.get("/runs/nope/explain")).status_code == 404

        started = (await http.get(f"/runs/{run_id}")).json()["started_at"]
        for _ in range(600):  # the run index is written behind the run
            since = (await http.get("/runs", params={"since": started})).json()["runs"]
            if since:
                break
            await asyncio.sleep(0.05)
        assert [x["run_id"] for x in since] == [run_id]
        assert (await http.get("/runs", params={"until": started})).json()["runs"] == []
        assert (await http.get("/runs", params={"since": "2999-01-01"})).json()["runs"] == []

    async with gs.http("reader") as reader:
        assert (await reader.get(f"/runs/{run_id}/explain")).status_code == 200
    async with gs.http(None) as nobody:
        assert (await nobody.get(f"/runs/{run_id}/explain")).status_code == 401
        assert (await nobody.get(f"/runs/{run_id}/replay?against=1")).status_code == 401


async def test_runs_say_what_they_wait_for_and_filter_by_it(gs: GatewayStack) -> None:
    await gs.stack.apply(IDLE_AGENT, UNSERVED, HOOK)
    async with gs.http() as http:
        started = {}
        for workflow, inputs in (("review", {"score": 1}), ("unserved", {}), ("hook", {})):
            r = await http.post("/runs", json={"workflow": workflow, "inputs": inputs})
            started[workflow] = r.json()["run_id"]
        await wait_status(gs, started["review"], "running", "approval")
        await wait_status(gs, started["unserved"], "running", "ask")
        await wait_status(gs, started["hook"], "running", "deploying")
        done = (
            await http.post("/runs", json={"workflow": "review", "inputs": {"score": 9}})
        ).json()
        await wait_status(gs, done["run_id"], "completed")

        # The run index is written behind the logs: until it has every run in its state.
        wanted = {started["review"], started["unserved"], started["hook"], done["run_id"]}
        for _ in range(600):
            listed = {r["run_id"]: r for r in (await http.get("/runs")).json()["runs"]}
            ready = {k for k, r in listed.items() if r["state"]}
            if wanted <= ready and listed[done["run_id"]]["status"] == "completed":
                break
            await asyncio.sleep(0.05)
        assert listed[started["review"]]["waiting"] == [
            {"kind": "approval", "name": "approval.granted"},
            {"kind": "approval", "name": "approval.denied"},
        ]
        assert listed[started["unserved"]]["waiting"] == [
            {"kind": "agent", "name": "nobody"},
            {"kind": "timer", "name": "gave-up"},
        ]
        assert listed[started["hook"]]["waiting"] == [{"kind": "event", "name": "deploy.finished"}]
        assert listed[done["run_id"]]["waiting"] == []

        async def waiting(value: str) -> list[str]:
            r = await http.get("/runs", params={"waiting": value})
            assert r.status_code == 200, r.text
            return [run["run_id"] for run in r.json()["runs"]]

        assert await waiting("approval") == [started["review"]]
        assert await waiting("agent") == [started["unserved"]]
        assert await waiting("agent:nobody") == [started["unserved"]]
        assert await waiting("agent:echo") == []
        assert await waiting("event:deploy.finished") == [started["hook"]]
        assert await waiting("timer") == [started["unserved"]]
        bad = await http.get("/runs", params={"waiting": "coffee"})
        assert bad.status_code == 400
        assert "waiting is KIND or KIND:NAME" in bad.json()["detail"]


COMMENTED = """\
# Who reviews what: kept as written.
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: commented   # the name runs list
spec:
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on:
        - {event: go, goto: done}   # a person says go
    done: {type: terminal}
"""


async def test_a_workflow_keeps_its_source_and_counts_runs_per_version(gs: GatewayStack) -> None:
    other = "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: other}\nspec:\n"
    other += "  initial_state: s\n  states:\n    s: {type: terminal}\n"
    await gs.stack.apply(other + "---\n" + COMMENTED)
    async with gs.http() as http:
        detail = (await http.get("/workflows/default/commented")).json()
        assert detail["source"] == COMMENTED
        assert (await http.get("/workflows/other")).json()["source"].startswith("apiVersion")
        assert detail["runs"] == []
        started = []
        for _ in range(2):
            r = await http.post("/runs", json={"workflow": "commented", "inputs": {}})
            started.append(r.json()["run_id"])
            await wait_status(gs, started[-1], "running", "wait")
        await http.post(f"/runs/{started[0]}/cancel", json={"reason": "counted"})
        await wait_status(gs, started[0], "cancelled")
        for _ in range(600):
            runs = (await http.get("/workflows/default/commented")).json()["runs"]
            if runs and runs[0]["cancelled"] == 1:
                break
            await asyncio.sleep(0.05)
        assert runs == [
            {
                "version": 1,
                "running": 1,
                "completed": 0,
                "failed": 0,
                "cancelled": 1,
                "continued": 0,
            }
        ]


LIMITED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: limited}
spec:
  concurrency:
    - {key: '"all"', limit: 1}
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on:
        - {event: go, goto: done}
    done: {type: terminal}
"""


async def test_a_run_queued_for_a_slot_says_so(gs: GatewayStack) -> None:
    await gs.stack.apply(LIMITED)
    async with gs.http() as http:
        first = (await http.post("/runs", json={"workflow": "limited"})).json()["run_id"]
        await wait_status(gs, first, "running", "wait")
        second = (await http.post("/runs", json={"workflow": "limited"})).json()["run_id"]

        async def waiting(run_id: str, kind: str) -> list[dict[str, str]]:
            for _ in range(600):
                listed = (await http.get("/runs", params={"waiting": kind})).json()["runs"]
                found = [r for r in listed if r["run_id"] == run_id]
                if found:
                    return found[0]["waiting"]
                await asyncio.sleep(0.05)
            raise AssertionError(f"{run_id} never listed as waiting for {kind}")

        slots = [{"kind": "slot", "name": "default/limited#1", "key": "all"}]
        assert await waiting(second, "slot") == slots  # the limit and the key it waits under
        slot = await http.get("/runs", params={"waiting": "slot:default/limited#1"})
        assert [r["run_id"] for r in slot.json()["runs"]] == [second]
        # The first ends: the second holds the slot and waits for its approval.
        await http.post(f"/runs/{first}/cancel", json={"reason": "make room"})
        await wait_status(gs, second, "running", "wait")
        assert await waiting(second, "approval") == [{"kind": "approval", "name": "go"}]


async def test_a_version_stored_before_outlines_said_what_states_ask_lists_its_agents(
    gs: GatewayStack,
) -> None:
    """An outline written by an older release has no ``asks``: the gateway compiles that
    version once to list the agents its runs wait for."""
    import json

    from interlock.core.compiler import compile_sources
    from interlock.views.outline import encode_outline, outline_of

    await gs.stack.apply(IDLE_AGENT)
    text = UNSERVED.replace("name: unserved", "name: older")
    [definition] = compile_sources([("older.yaml", text)], known_capabilities={"nobody"}).workflows
    outline = encode_outline(outline_of(definition))
    del outline["asks"], outline["timeouts"]
    kv = await gs.stack.js.key_value(gs.stack.subjects.workflows_bucket)
    body = {"version": 1, "spec_hash": definition.spec_hash, "outline": outline}
    body["manifest"] = dict(definition.manifest)
    await kv.create("wf.default.older.1", json.dumps(body).encode())
    pointer = {"version": 1, "spec_hash": definition.spec_hash}
    await kv.create("latest.default.older", json.dumps(pointer).encode())
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "older"})).json()["run_id"]
        await wait_status(gs, run_id, "running", "ask")
        for _ in range(600):
            found = (await http.get("/runs", params={"waiting": "agent:nobody"})).json()["runs"]
            if found:
                break
            await asyncio.sleep(0.05)
        assert [r["run_id"] for r in found] == [run_id]
        assert found[0]["waiting"] == [
            {"kind": "agent", "name": "nobody"},
            {"kind": "timer", "name": "gave-up"},
        ]
