"""The installation's history limits (``interlock serve --history-max-records``,
``--history-max-bytes``, ``--continue-as-new``): kept in the workflows bucket under
:data:`HISTORY_KEY`, so that whoever starts a run (the orchestrator, ``interlock start``,
a program through the client) records the same limits on its ``run.started``.

``serve`` writes the key when it starts (its flags, else the built-in defaults: the
orchestrator is the authority, give every replica the same); the orchestrator's registry
follows it with the bucket's watch, any other process reads it once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from interlock.core import events as ev
from interlock.core.history import DEFAULT

log = logging.getLogger("interlock.settings")

HISTORY_KEY = "settings.history"
"""The key of the installation's history limits in the workflows bucket."""

_decode = msgspec.json.Decoder(ev.HistoryLimits).decode


class HistorySetting:
    """The installation's history limits as this process knows them."""

    def __init__(self, bucket: Callable[[], Awaitable[KeyValue]]) -> None:
        self._bucket = bucket
        self._value: ev.HistoryLimits = DEFAULT
        self._known = False

    def take(self, value: bytes | None) -> None:
        """The key's value as the watch saw it (None or empty: deleted, the defaults)."""
        self._known = True
        if not value:
            self._value = DEFAULT
            return
        try:
            self._value = _decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("%s is not history limits (%s): the defaults apply", HISTORY_KEY, exc)
            self._value = DEFAULT

    async def get(self) -> ev.HistoryLimits:
        """The limits (read from the bucket the first time, unless the watch told)."""
        if not self._known:
            kv = await self._bucket()
            try:
                entry = await kv.get(HISTORY_KEY)
            except KeyNotFoundError:
                self.take(None)
            else:
                self.take(entry.value)
        return self._value

    async def put(self, limits: ev.HistoryLimits | None) -> None:
        """Make ``limits`` (None: the defaults) the installation's (``serve`` does, as it
        starts)."""
        limits = limits or DEFAULT
        kv = await self._bucket()
        await kv.put(HISTORY_KEY, msgspec.json.encode(limits))
        self.take(msgspec.json.encode(limits))
