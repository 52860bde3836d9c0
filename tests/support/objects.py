"""What the tests of values kept by reference share: a size over the threshold, and the
``pile`` capability that answers that many bytes (or a multiple)."""

from __future__ import annotations

from typing import Any

from interlock.sdk import Worker

SIZE = 300 * 1024
"""Over the threshold (256 KiB) above which a value is kept by reference."""

PILES_AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: piles}
spec:
  capabilities:
    - {name: pile, input_schema: {type: object}, output_schema: {type: object}}
"""
"""The AgentDef of ``pile`` (served by :func:`pile_worker`)."""


def pile_worker() -> Worker:
    """``pile``: answers ``{"blob": "p" * SIZE * n}`` for an input ``{"n": n}``."""
    worker = Worker("piles")

    @worker.capability("pile")
    async def pile(inp: dict[str, Any]) -> dict[str, Any]:
        return {"blob": "p" * (SIZE * int(inp["n"]))}

    return worker
