"""Starts one run of a limited workflow as an orchestrator does, and dies (SIGKILL) after
its slot is taken and before its first append is sent: the crash that leaves a slot held
for a run no log has. ``python -m support.atonce_crash URL PREFIX WORKFLOW RUN_ID INPUTS``
(``PYTHONPATH=tests``); prints ``TAKEN <holders>`` as it dies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import nats

from interlock.runtime.service import Orchestrator
from interlock.transport.subjects import Subjects


async def main(url: str, prefix: str, workflow: str, run_id: str, inputs: str) -> None:
    nc = await nats.connect(url)
    orchestrator = Orchestrator(nc, Subjects(prefix))
    runs = orchestrator.runs
    definition, version = await runs.registry.latest(workflow)

    async def append(run: str, records: Sequence[Any], expected: int) -> int:
        slots = orchestrator.flow.admission.slots
        held = [h.run_id for e in await slots.entries() for h in e.holders]
        print("TAKEN", " ".join(held), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached")

    runs.log.append = append  # type: ignore[method-assign]
    await runs.start(definition, version, run_id, json.loads(inputs))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
