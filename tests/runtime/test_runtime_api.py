"""The runtime's public names: what ``from interlock.runtime import ...`` offers, pinned."""

from __future__ import annotations

import subprocess
import sys

import interlock.runtime

EXPECTED = [
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


def test_public_names_are_pinned() -> None:
    assert interlock.runtime.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(interlock.runtime, name) is not None
    assert set(EXPECTED) <= set(dir(interlock.runtime))


def test_errors_share_the_root() -> None:
    from interlock.core import InterlockError

    for name in EXPECTED:
        value = getattr(interlock.runtime, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, InterlockError), name


def test_importing_the_facade_loads_nothing_yet() -> None:
    code = (
        "import sys, interlock.runtime; "
        "print(sorted(m for m in sys.modules if m.startswith('interlock.runtime.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
