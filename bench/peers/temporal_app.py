"""Temporal workflow + activities for the approval workflow (worker side; see temporal_bench.py)."""

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def review(n: int) -> dict:
    return {"score": 8}


@activity.defn
async def merge() -> dict:
    return {"merged": True}


@activity.defn
async def fix() -> dict:
    return {"merged": False}


@workflow.defn
class Approval:
    @workflow.run
    async def run(self, inp: dict) -> dict:
        t = timedelta(seconds=60)
        r = await workflow.execute_activity(review, inp["n"], start_to_close_timeout=t)
        if r["score"] > 7:
            m = await workflow.execute_activity(merge, start_to_close_timeout=t)
        else:
            m = await workflow.execute_activity(fix, start_to_close_timeout=t)
        return {"merged": m["merged"]}
