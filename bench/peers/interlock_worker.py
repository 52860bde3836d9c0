"""Agent worker for the approval workflow on Interlock (see interlock_bench.py), written with the
public SDK and run as its own process, as a user would:

  PYTHONPATH=bench/peers interlock agent run interlock_worker:worker --concurrency 200 -s nats://...

Capabilities: review -> {"score": 8}, merge -> {"merged": true}, fix -> {"merged": false}.
"""

from interlock.sdk import Worker

worker = Worker("approval-agent", concurrency=200)


@worker.capability("review")
async def review(inp: dict) -> dict:
    return {"score": 8}


@worker.capability("merge")
async def merge(inp: dict) -> dict:
    return {"merged": True}


@worker.capability("fix")
async def fix(inp: dict) -> dict:
    return {"merged": False}
