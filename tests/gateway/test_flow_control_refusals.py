"""The flow-control routes over a real socket, as each kind of caller tries them: no
token, a publisher's, a reader's (GET /queues only) are refused with a problem body and
change nothing; an operator's names that are no workflow, run or capability are
refused with a problem body too, never a 500."""

from __future__ import annotations

from interlock.transport.subjects import Subjects
from support.gateway import WAITING, gateway_stack

ACTS = [
    ("/workflows/default/waiting/pause", {"reason": "x"}),
    ("/workflows/default/waiting/resume", {}),
    ("/runs/{run}/pause", {"reason": "x"}),
    ("/runs/{run}/resume", {}),
    ("/capabilities/slow/pause", {"reason": "x"}),
    ("/capabilities/slow/resume", {}),
    # A fork takes slots of its own and a migration moves runs onto other limits.
    ("/runs/{run}/fork", {"at": 2, "run_id": "forked-by-a-stranger"}),
    ("/workflows/default/waiting/migrate", {"to": 1}),
]


def problem(response: object, status: int) -> None:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    assert response.headers["content-type"].startswith("application/problem+json")  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert body["status"] == status
    assert body["title"]
    assert body["detail"]


async def test_flow_control_is_refused_to_all_but_operators(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http() as operator:
        run = (await operator.post("/runs", json={"workflow": "waiting"})).json()["run_id"]
        for role, status in ((None, 401), ("publisher", 403), ("reader", 403)):
            async with gs.http(role) as http:
                for path, body in ACTS:
                    problem(await http.post(path.format(run=run), json=body), status)
                if role != "reader":
                    problem(await http.get("/queues"), status)
        async with gs.http("reader") as reader:
            assert (await reader.get("/queues")).status_code == 200
            described = (await reader.get(f"/runs/{run}")).json()
            assert described.get("paused") is None
            workflows = (await reader.get("/workflows")).json()
            assert not any(w.get("paused") for w in workflows), workflows
            assert (await reader.get("/runs/forked-by-a-stranger")).status_code == 404
            listed = {r["run_id"] for r in (await reader.get("/runs")).json()["runs"]}
            assert listed <= {run}, listed  # (the index may not list the run yet)


BAD_NAMES = [
    "/capabilities/a*b/pause",
    "/capabilities/a>/pause",
    "/capabilities/a%20b/pause",
    "/capabilities/a..b/resume",
    "/workflows/default/a*b/pause",
    "/workflows/def.ault/x/pause",
    "/runs/r*/pause",
    "/runs/a.b/resume",
]


async def test_an_operators_bad_names_are_problems(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects, [WAITING]) as gs, gs.http() as operator:
        for path in BAD_NAMES:
            got = await operator.post(path, json={"reason": "x"})
            assert 400 <= got.status_code < 500, (path, got.status_code, got.text)
            problem(got, got.status_code)
