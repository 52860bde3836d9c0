"""The Interlock client: drive workflows and runs from a program.

    from interlock import Client

    async with await Client.connect("nats://127.0.0.1:4222") as client:
        run_id = await client.start("hello", {"message": "hi"})
        result = await client.result(run_id, wait=True, timeout=30)
        print(result.status, result.outputs)

The client talks to NATS like the CLI does, with the same connection options (and the same
``INTERLOCK_*`` environment variables); it never goes through the orchestrator process.
Everything it returns is a view of :mod:`interlock.views`, the shapes the CLI prints and
the HTTP API answers with. :class:`SyncClient` offers the same calls without ``await``.

Waiting scales: every wait of one client shares one subscription on the run logs (see
:mod:`interlock.runtime.waiting`), so 5,000 concurrent ``result(..., wait=True)`` calls
cost the server one subscription, not 5,000 consumers; ``logs(..., follow=True)`` shares it
too.

Reading runs and workflows (``describe`` and ``workflow`` included: they read the outline
stored when the workflow was applied) loads neither the compiler nor the engine: the calls
that compile (``apply``, ``emit``, ``signal``, the debugging calls) import them when first
called, so a program (or ``interlock runs``) that only reads starts fast.
"""

from __future__ import annotations

from interlock.client.client import Client
from interlock.client.errors import (
    ConnectionFailed,
    EventTooLarge,
    InvalidInputs,
    InvalidManifest,
    InvalidRunId,
    NotRedrivable,
    RunExists,
    RunNotEnded,
    UnknownAgent,
    UnknownDeadLetter,
    UnknownRun,
    UnknownWorkflow,
)
from interlock.client.sync import SyncClient

__all__ = [
    "Client",
    "ConnectionFailed",
    "EventTooLarge",
    "InvalidInputs",
    "InvalidManifest",
    "InvalidRunId",
    "NotRedrivable",
    "RunExists",
    "RunNotEnded",
    "SyncClient",
    "UnknownAgent",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnknownWorkflow",
]
