"""The event loop of Interlock's long-running processes (``interlock serve``, ``interlock
agent run``, ``interlock dev``).

Where uvloop is installed (a dependency on Linux and macOS) they run on it: the same asyncio
API over libuv, with its event loop, callbacks and socket writes in C. The orchestrator
spends a quarter of its CPU in the event loop and its socket writes (``python -m bench
peers`` and docs/performance.md give the measurements); uvloop takes a good part of that
off each message. ``INTERLOCK_EVENT_LOOP=asyncio`` keeps the standard loop (to compare, or
to debug with asyncio's own tools); ``uvloop`` insists on it and fails where it is missing;
unset or ``auto`` takes uvloop where it can be imported and the standard loop elsewhere.

The same processes tune Python's cyclic garbage collector (:func:`collecting`). With its
defaults (a collection every 700 net allocations of container objects) the orchestrator
spent a fifth of its CPU collecting, and found almost nothing: its objects are records,
states and messages that plain reference counting frees, and the long-lived ones (the
modules, the caches of states) were traversed again at every older-generation collection.
So what exists when the loop starts (the imported modules, mostly) is frozen out of every
collection (``gc.freeze``), and the youngest generation is collected every
``INTERLOCK_GC_THRESHOLD`` allocations (20,000; 0 keeps Python's settings). Cycles are
still collected, a little later.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from interlock.core.vocabulary import InterlockError

T = TypeVar("T")

EVENT_LOOP_ENV = "INTERLOCK_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")
GC_ENV = "INTERLOCK_GC_THRESHOLD"
GC_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (Python's is 700)."""


class EventLoopError(ValueError, InterlockError):
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


def gc_threshold(raw: str | None = None) -> int:
    """The youngest generation's threshold ``raw`` (default: ``INTERLOCK_GC_THRESHOLD``)
    asks for: :data:`GC_THRESHOLD` when unset, 0 to keep Python's settings."""
    text = (os.environ.get(GC_ENV, "") if raw is None else raw).strip()
    if not text:
        return GC_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise EventLoopError(f"{GC_ENV} must be a whole number, 0 or more, got {text!r}")
    return value


@contextlib.contextmanager
def collecting(threshold: int) -> Iterator[None]:
    """While inside: the objects that exist now frozen out of the collector's work, and
    the youngest generation collected every ``threshold`` allocations (0: nothing
    changed). Both are undone on the way out."""
    if not threshold:
        yield
        return
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which loop a process runs on (logged at start)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks, with the collector
    tuned as :func:`gc_threshold` says (:func:`collecting`)."""
    try:
        factory = loop_factory()
        threshold = gc_threshold()
    except EventLoopError:
        main.close()
        raise
    with collecting(threshold), asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
