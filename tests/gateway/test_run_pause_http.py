"""Pausing a run over HTTP on a real socket: operators pause and resume it, its
description and the run list say it is paused (and how many events it holds), a reader may
not, and what it held is decided on when it is resumed."""

from __future__ import annotations

from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack
from support.runtime import eventually, yaml

SLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: slowone
    spec:
      initial_state: work
      states:
        work:
          actions: [{capability: slow}]
          on: [{event: task.completed, goto: done}]
        done: {type: terminal}
    """
)


async def test_an_operator_pauses_and_resumes_a_run_over_http(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [SLOW]) as gs:
        recorder = gs.stack.recorder
        async with gs.http() as http, gs.http("reader") as reader:
            started = await http.post("/runs", json={"workflow": "slowone"})
            run_id = started.json()["run_id"]
            await recorder.slow_started.get()
            refused = await reader.post(f"/runs/{run_id}/pause")
            assert refused.status_code == 403, refused.text
            bad = await http.post(f"/runs/{run_id}/pause", json={"why": "x"})
            assert bad.status_code == 400, bad.text
            assert (await http.post("/runs/nope/pause")).status_code == 404
            paused = await http.post(f"/runs/{run_id}/pause", json={"reason": "vendor"})
            assert paused.json() == {"run_id": run_id, "paused": True, "changed": True}
            again = await http.post(f"/runs/{run_id}/pause")
            assert again.json()["changed"] is False
            recorder.release.set()  # the answer comes while it is paused

            async def holds_one() -> dict | None:
                found = (await reader.get(f"/runs/{run_id}")).json()
                return found if (found.get("paused") or {}).get("held") == 1 else None

            described = await eventually(holds_one, what="the answer held")
            assert described["status"] == "running"
            assert described["state"] == "work"
            assert described["paused"]["reason"] == "vendor"

            async def listed_paused() -> bool:
                page = (await reader.get("/runs")).json()
                mine = [r for r in page["runs"] if r["run_id"] == run_id]
                return bool(mine) and (mine[0].get("paused") or {}).get("reason") == "vendor"

            await eventually(listed_paused, what="the run list says it is paused")
            assert (await reader.post(f"/runs/{run_id}/resume")).status_code == 403
            resumed = await http.post(f"/runs/{run_id}/resume")
            assert resumed.json() == {"run_id": run_id, "paused": False, "changed": True}
            result = await http.get(f"/runs/{run_id}/result", params={"timeout": 30})
            assert result.json()["status"] == "completed"
            assert (await reader.get(f"/runs/{run_id}")).json().get("paused") is None
