"""The event loop of Interlock's long-running processes (``interlock serve``, ``interlock
agent run``, ``interlock dev``).

Where uvloop is installed (a dependency on Linux and macOS) they run on it: the same asyncio
API over libuv, with its event loop, callbacks and socket writes in C. The orchestrator
spends a quarter of its CPU in the event loop and its socket writes (``python -m bench
peers`` and docs/architecture.md give the measurements); uvloop takes a good part of that
off each message. ``INTERLOCK_EVENT_LOOP=asyncio`` keeps the standard loop (to compare, or
to debug with asyncio's own tools); ``uvloop`` insists on it and fails where it is missing;
unset or ``auto`` takes uvloop where it can be imported and the standard loop elsewhere.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOP_ENV = "INTERLOCK_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


class EventLoopError(ValueError):
    """``INTERLOCK_EVENT_LOOP`` names a loop that is unknown or not installed."""


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the loop ``choice`` (default: ``INTERLOCK_EVENT_LOOP``) asks for: uvloop's
    factory, or None for the standard loop."""
    raw = os.environ.get(EVENT_LOOP_ENV, "") if choice is None else choice
    name = raw.strip().lower() or "auto"
    if name not in CHOICES:
        raise EventLoopError(f"{EVENT_LOOP_ENV} must be one of {', '.join(CHOICES)}, got {raw!r}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise EventLoopError(
                f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed (pip install uvloop)"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which loop a process runs on (logged at start)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    try:
        factory = loop_factory()
    except EventLoopError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
