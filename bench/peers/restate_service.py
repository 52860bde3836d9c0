"""Restate Python service for the approval workflow (served by hypercorn, see restate_bench.py).

Approval/run: ctx.run("review") -> if score > 7: ctx.run("merge") else ctx.run("fix").
Each ctx.run result is journaled by restate-server before the handler continues.
"""

import restate

approval = restate.Service("Approval")


async def review(n: int) -> dict:
    return {"score": 8}


async def merge() -> dict:
    return {"merged": True}


async def fix() -> dict:
    return {"merged": False}


@approval.handler()
async def run(ctx: restate.Context, inp: dict) -> dict:
    r = await ctx.run_typed("review", review, restate.RunOptions(type_hint=dict), inp["n"])
    if r["score"] > 7:
        m = await ctx.run_typed("merge", merge, restate.RunOptions(type_hint=dict))
    else:
        m = await ctx.run_typed("fix", fix, restate.RunOptions(type_hint=dict))
    return {"merged": m["merged"]}


app = restate.app(services=[approval])
