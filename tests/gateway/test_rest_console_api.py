"""What the web console reads beyond the run basics, over REST against a real stack running
the console tests' ``review`` workflow: a stored version's workflow with its transitions, a
run's explanation (each guard weighed), a replay against another version, and runs filtered
by start time. (The ``catch`` and ``timeout`` edges are pinned in tests/test_views.py.)"""

from __future__ import annotations

import pytest
from gw_support import REVIEW, REVIEW_V2, GatewayStack, gateway_stack, wait_status

from interlock.transport.subjects import Subjects

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
        assert [
            x["run_id"] for x in (await http.get("/runs", params={"since": started})).json()["runs"]
        ] == [run_id]
        assert (await http.get("/runs", params={"until": started})).json()["runs"] == []
        assert (await http.get("/runs", params={"since": "2999-01-01"})).json()["runs"] == []

    async with gs.http("reader") as reader:
        assert (await reader.get(f"/runs/{run_id}/explain")).status_code == 200
    async with gs.http(None) as nobody:
        assert (await nobody.get(f"/runs/{run_id}/explain")).status_code == 401
        assert (await nobody.get(f"/runs/{run_id}/replay?against=1")).status_code == 401
