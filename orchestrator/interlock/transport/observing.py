"""One hook fanned out to several observers, each one's failure isolated.

The orchestrator's observers (:mod:`interlock.runtime.observe`) and an agent worker's
(:mod:`interlock.sdk.observe`) are told through a :class:`Fanout` each. It lives in the
transport, the layer both import, because the SDK may not import the runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

ObserverT = TypeVar("ObserverT")


class Fanout(Generic[ObserverT]):
    """Calls a hook on several observers in turn: an exception raised in one is logged
    (``observer <class> failed in <hook>``) and the next is called.

    Each observer's hooks are looked up once, when it is added, and a hook it leaves as
    ``base``'s (which does nothing) is not called at all: the hooks are called several
    times a run, or a task.
    """

    def __init__(
        self,
        base: type[ObserverT],
        hooks: Sequence[str],
        log: logging.Logger,
        observers: Iterable[ObserverT] = (),
    ) -> None:
        self._base = base
        self._log = log
        self._hooks: dict[str, list[tuple[str, Callable[..., None]]]] = {name: [] for name in hooks}
        for observer in observers:
            self.add(observer)

    def add(self, observer: ObserverT) -> None:
        for name, hooks in self._hooks.items():
            hook = getattr(observer, name)
            if getattr(hook, "__func__", None) is not getattr(self._base, name):
                hooks.append((type(observer).__name__, hook))

    def call(self, name: str, *args: object) -> None:
        """Call every observer's hook ``name`` with ``args``."""
        for owner, hook in self._hooks[name]:
            try:
                hook(*args)
            except Exception:  # noqa: BLE001 - logged below; the next observer is called
                self._log.exception("observer %s failed in %s", owner, name)
