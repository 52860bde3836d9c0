"""Interlock: an event-sourced workflow orchestrator on NATS JetStream.

``from interlock import Client`` to drive it from a program (see docs/client.md). The
names below load on first use, so importing the package (and running ``interlock --help``)
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CloudEvent",
    "ConnectOptions",
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
    "__version__",
    "views",
]

_FROM = {
    "CloudEvent": "interlock.transport.cloudevents",
    "ConnectOptions": "interlock.transport.connection",
    "views": "interlock.views",
}
"""Where each export lives (``interlock.client`` unless named here)."""

if TYPE_CHECKING:
    from interlock import views
    from interlock.client import (
        Client,
        ConnectionFailed,
        EventTooLarge,
        InvalidInputs,
        InvalidManifest,
        InvalidRunId,
        NotRedrivable,
        RunExists,
        RunNotEnded,
        SyncClient,
        UnknownAgent,
        UnknownDeadLetter,
        UnknownRun,
        UnknownWorkflow,
    )
    from interlock.transport.cloudevents import CloudEvent
    from interlock.transport.connection import ConnectOptions


def __getattr__(name: str) -> Any:
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'interlock' has no attribute {name!r}")
    loaded = importlib.import_module(_FROM.get(name, "interlock.client"))
    value = loaded if name == "views" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
