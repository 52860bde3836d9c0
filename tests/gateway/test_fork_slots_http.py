"""A fork over HTTP on a real socket moves no slot it does not hold: the fork of a run
holding the one slot of its limit copies the records of its admission, yet it takes a slot
of its own (it waits in line behind its origin), and once cancelled (its end frees the
slots its log names) its origin still holds the slot and the run waiting behind it still
waits. A reader may not fork."""

from __future__ import annotations

from interlock.runtime.concurrency import Slots
from interlock.transport.subjects import Subjects
from support.concurrency import ONE_SLOT
from support.gateway import gateway_stack, wait_status
from support.runtime import eventually


async def test_a_cancelled_fork_frees_nobody_elses_slot(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects, [ONE_SLOT]) as gs:
        slots = Slots(gs.stack.client.nc, subjects)

        async def line() -> tuple[list[str], list[str]]:
            found = await slots.lines("default/one#1", "k")
            if found is None:
                return [], []
            waiting = [w.run_id for w in found.entry.waiting]
            return [h.run_id for h in found.entry.holders], waiting

        async with gs.http() as http, gs.http("reader") as reader:
            r = await http.post("/runs", json={"workflow": "one", "run_id": "holder"})
            assert r.status_code == 201, r.text
            await wait_status(gs, "holder", "running", "wait")
            at = len((await http.get("/runs/holder/log")).json()["records"])
            refused = await reader.post("/runs/holder/fork", json={"at": at, "run_id": "f0"})
            assert refused.status_code == 403, refused.text
            r = await http.post("/runs/holder/fork", json={"at": at, "run_id": "fork"})
            assert r.status_code == 201, r.text
            r = await http.post("/runs", json={"workflow": "one", "run_id": "behind"})
            assert r.status_code == 201, r.text

            async def both_waiting() -> bool:
                return await line() == (["holder"], ["fork", "behind"])

            await eventually(both_waiting, what="the fork and the next run in line")
            r = await http.post("/runs/fork/cancel", json={"reason": "a stranger's"})
            assert r.status_code == 200, r.text

            async def fork_gone() -> bool:
                return "fork" not in (await line())[1]

            await eventually(fork_gone, what="the cancelled fork out of line")
            assert await line() == (["holder"], ["behind"])
            assert (await reader.get("/runs/behind")).json()["state"] in ("", None)
            r = await http.post("/runs/holder/signals/go?wait=0")
            assert r.status_code in (200, 202), r.text
            await wait_status(gs, "behind", "running", "wait")
