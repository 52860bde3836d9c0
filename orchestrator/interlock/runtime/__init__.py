"""The orchestrator side of Interlock: what a program needs to run one, or to drive runs.

    from interlock.runtime import Orchestrator, EmbeddedNats, ConnectOptions, connect

    server = EmbeddedNats(data_dir, port=0)
    server.start()
    nc = await connect(ConnectOptions.resolve(server.url))
    orchestrator = Orchestrator(nc, Subjects())
    await orchestrator.start()

Programs that start and watch runs use the client (``from interlock import Client``); the
names below are for running the orchestrator itself, embedding a server, testing with a
manual clock, or reading run logs. They are loaded on first use; everything else in the
submodules may change without notice (``tests/runtime/test_runtime_api.py`` pins this list).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interlock.runtime.answers import AnswerRefused
    from interlock.runtime.embedded import EmbeddedNats
    from interlock.runtime.errors import InvalidInputs, UnknownRun, UnknownWorkflow
    from interlock.runtime.health import OrchestratorInstrumentation
    from interlock.runtime.logstore import LogStore, MemoryRunLog, RunLog
    from interlock.runtime.service import Orchestrator
    from interlock.runtime.timers import ClockTimers, JetStreamTimers, ManualClock, Timers
    from interlock.transport.connection import ConnectOptions, connect
    from interlock.transport.errors import (
        AppendConflict,
        ConnectionFailed,
        NatsServerFailed,
        NatsServerNotFound,
    )
    from interlock.transport.subjects import Subjects

_HOME: dict[str, str] = {
    "Orchestrator": "interlock.runtime.service",
    "OrchestratorInstrumentation": "interlock.runtime.health",
    "EmbeddedNats": "interlock.runtime.embedded",
    "Timers": "interlock.runtime.timers",
    "JetStreamTimers": "interlock.runtime.timers",
    "ClockTimers": "interlock.runtime.timers",
    "ManualClock": "interlock.runtime.timers",
    "LogStore": "interlock.runtime.logstore",
    "RunLog": "interlock.runtime.logstore",
    "MemoryRunLog": "interlock.runtime.logstore",
    "AnswerRefused": "interlock.runtime.answers",
    "InvalidInputs": "interlock.runtime.errors",
    "UnknownRun": "interlock.runtime.errors",
    "UnknownWorkflow": "interlock.runtime.errors",
    "ConnectOptions": "interlock.transport.connection",
    "connect": "interlock.transport.connection",
    "Subjects": "interlock.transport.subjects",
    "AppendConflict": "interlock.transport.errors",
    "ConnectionFailed": "interlock.transport.errors",
    "NatsServerFailed": "interlock.transport.errors",
    "NatsServerNotFound": "interlock.transport.errors",
}

__all__ = [
    "AnswerRefused",
    "AppendConflict",
    "ClockTimers",
    "ConnectOptions",
    "ConnectionFailed",
    "EmbeddedNats",
    "InvalidInputs",
    "JetStreamTimers",
    "LogStore",
    "ManualClock",
    "MemoryRunLog",
    "NatsServerFailed",
    "NatsServerNotFound",
    "Orchestrator",
    "OrchestratorInstrumentation",
    "RunLog",
    "Subjects",
    "Timers",
    "UnknownRun",
    "UnknownWorkflow",
    "connect",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'interlock.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups find it without calling here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
