"""Acting over HTTP, on a real socket, with each role's own token: forking a run and
migrating a workflow's running runs (each previewed first by a dry run that writes
nothing), and discarding dead letters (one, by reason, by age). Operators only."""

from __future__ import annotations

import asyncio

import pytest

from interlock.transport.subjects import Subjects
from support.gateway import REVIEW, REVIEW_V2, GatewayStack, gateway_stack, wait_status

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [REVIEW]) as stack:
        yield stack


async def test_fork_is_previewed_then_made(gs: GatewayStack) -> None:
    async with gs.http() as http, gs.http("reader") as reader:
        run_id = await http.post("/runs", json={"workflow": "review", "inputs": {"score": 3}})
        run_id = run_id.json()["run_id"]
        await wait_status(gs, run_id, "running", "approval")
        records = (await http.get(f"/runs/{run_id}")).json()["records"]

        preview = await http.post(
            f"/runs/{run_id}/fork", json={"at": records, "run_id": "preview1", "dry_run": True}
        )
        assert preview.status_code == 200, preview.text
        report = preview.json()
        assert report["dry_run"] is True
        assert (report["run_id"], report["state"], report["version"]) == ("preview1", "approval", 1)
        assert report["origin"] == {"run_id": run_id, "seq": records}
        assert report["records"][0]["type"] == "io.interlock.run.forked"
        assert (await http.get("/runs/preview1")).status_code == 404, "a dry run wrote a run"

        # Readers may look, not fork.
        refused = await reader.post(f"/runs/{run_id}/fork", json={"at": records, "dry_run": True})
        assert refused.status_code == 403
        assert "fork runs" in refused.json()["detail"]

        made = await http.post(f"/runs/{run_id}/fork", json={"at": records, "run_id": "forked1"})
        assert made.status_code == 201, made.text
        assert made.json()["dry_run"] is False
        await wait_status(gs, "forked1", "running", "approval")
        again = await http.post(f"/runs/{run_id}/fork", json={"at": records, "run_id": "forked1"})
        assert again.status_code == 409
        bad = await http.post(f"/runs/{run_id}/fork", json={"at": records + 50})
        assert bad.status_code == 409
        assert bad.json()["type"].endswith("/not-possible")
        assert (await http.post(f"/runs/{run_id}/fork", json={"at": 0})).status_code == 400
        assert (await http.post("/runs/nope/fork", json={"at": 1})).status_code == 404

        for _ in range(600):
            listed = {r["run_id"]: r for r in (await http.get("/runs")).json()["runs"]}
            if listed.get("forked1", {}).get("forked_from"):
                break
            await asyncio.sleep(0.05)
        origin = listed[run_id]["started_at"]
        assert listed["forked1"]["forked_from"] == {
            "run_id": run_id,
            "seq": records,
            "started_at": origin,
        }
        # Listed by its own start (when it was forked), not its origin's.
        described = (await http.get("/runs/forked1")).json()
        assert listed["forked1"]["started_at"] == described["started_at"] > origin
        assert described["forked_from"] == {"run_id": run_id, "seq": records, "started_at": origin}


async def test_migrate_is_previewed_then_made(gs: GatewayStack) -> None:
    async with gs.http() as http, gs.http("reader") as reader:
        run_id = await http.post("/runs", json={"workflow": "review", "inputs": {"score": 3}})
        run_id = run_id.json()["run_id"]
        await wait_status(gs, run_id, "running", "approval")
        await gs.stack.apply(REVIEW_V2)
        path = "/workflows/default/review/migrate"
        preview = await http.post(path, json={"to": 2, "dry_run": True})
        assert preview.status_code == 200, preview.text
        assert preview.json()["dry_run"] is True
        assert [r["run_id"] for r in preview.json()["moved"]] == [run_id]
        assert (await http.get(f"/runs/{run_id}")).json()["version"] == 1
        assert (await reader.post(path, json={"to": 2})).status_code == 403
        assert (await http.post(path, json={"to": 9})).status_code == 404

        moved = await http.post(path, json={"to": 2})
        assert moved.status_code == 200, moved.text
        assert [r["run_id"] for r in moved.json()["moved"]] == [run_id]
        assert (await http.get(f"/runs/{run_id}")).json()["version"] == 2
        for _ in range(600):
            listed = {r["run_id"]: r for r in (await http.get("/runs")).json()["runs"]}
            if listed[run_id].get("migrated_from"):
                break
            await asyncio.sleep(0.05)
        assert (listed[run_id]["version"], listed[run_id]["migrated_from"]) == (2, 1)


async def _letters(gs: GatewayStack, http, count: int) -> list[dict]:  # type: ignore[no-untyped-def]
    for _ in range(600):
        letters = (await http.get("/dead-letters")).json()
        if len(letters) >= count:
            return letters
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} dead letters never came")


async def test_dead_letters_are_discarded_one_by_reason_and_by_age(gs: GatewayStack) -> None:
    for n in range(3):
        await gs.stack.js.publish(gs.stack.subjects.event(f"com.example.bad{n}"), b"{not json")
    async with gs.http() as http, gs.http("reader") as reader:
        letters = await _letters(gs, http, 3)
        assert {d["reason"] for d in letters} == {"bad-json"}
        first = letters[0]["seq"]
        assert (await reader.delete(f"/dead-letters/{first}")).status_code == 403
        assert (
            await reader.delete("/dead-letters", params={"reason": "bad-json"})
        ).status_code == 403

        one = await http.delete(f"/dead-letters/{first}")
        assert one.status_code == 200, one.text
        assert one.json() == {"discarded": [first]}
        assert (await http.get(f"/dead-letters/{first}")).status_code == 404
        assert (await http.delete(f"/dead-letters/{first}")).status_code == 404

        none = await http.delete("/dead-letters")
        assert none.status_code == 400
        assert "name a reason" in none.json()["detail"]
        assert (
            await http.delete("/dead-letters", params={"older_than": "soon"})
        ).status_code == 400
        # Fresh letters are not an hour old; another reason keeps them too.
        kept = await http.delete("/dead-letters", params={"older_than": "1h"})
        assert kept.json() == {"discarded": []}
        other = await http.delete("/dead-letters", params={"reason": "too-large"})
        assert other.json() == {"discarded": []}
        assert len((await http.get("/dead-letters")).json()) == 2

        dropped = await http.delete(
            "/dead-letters", params={"reason": "bad-json", "older_than": "0s"}
        )
        assert dropped.status_code == 200
        assert sorted(dropped.json()["discarded"]) == sorted(d["seq"] for d in letters[1:])
        assert (await http.get("/dead-letters")).json() == []
