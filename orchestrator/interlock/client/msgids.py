"""The ``Nats-Msg-Id`` an event is stored under.

The events stream drops an event whose id it stored in its duplicate window, whoever
stored the first, and a ``<source>:<id>`` is any publisher's to send: one of another team,
sending a guessed source and id first with an event of its own types, had an event posted
with them dropped (and learnt from the duplicate flag whether it had been sent). Where the
client holds the log key (an operator, the gateway for its callers) the id is a MAC of the
subject, the source and the id under it, which nobody without the key can send first.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError

from interlock.transport.cloudevents import CloudEvent
from interlock.transport.logmac import LogKey, LogKeyUnavailable
from interlock.transport.refusals import PermissionRefused, refusable

if TYPE_CHECKING:
    from interlock.runtime.client import InterlockClient

__all__ = ["dedupe_key", "message_id"]

_KEYS: weakref.WeakKeyDictionary[InterlockClient, LogKey | None] = weakref.WeakKeyDictionary()
_NOT_HELD = (PermissionRefused, NoRespondersError)
"""What a credential that may not read the log key is answered (a publisher's)."""
_NOT_NOW = (APIError, NatsTimeout, LogKeyUnavailable)
"""What a credential that may read it can be answered for a while (asked again next time)."""


async def dedupe_key(ops: InterlockClient) -> LogKey | None:
    """The key this credential's events are stored under: the log key where it holds it
    (operators, the gateway), else None (a publisher's credential: ``<source>:<id>``, as
    the contract has every publisher send). Read once per client; where it cannot be read
    for now (the bucket not answering), this event goes under ``<source>:<id>``."""
    if ops in _KEYS:
        return _KEYS[ops]
    try:
        key: LogKey | None = await refusable(ops.nc, ops.log.key())
    except _NOT_HELD:
        key = None
    except _NOT_NOW:
        return None
    _KEYS[ops] = key
    return key


def message_id(event: CloudEvent, subject: str, key: LogKey | None) -> str:
    """The ``Nats-Msg-Id`` ``event`` is stored under on ``subject``: ``<source>:<id>``
    without a key, else ``k:`` and the MAC under ``key`` of the subject, the source and the
    id (the same type, source and id give the same one)."""
    if key is None:
        return f"{event.source}:{event.id}"
    return "k:" + key.mac(f"dedupe {subject}", f"{event.source}\n{event.id}".encode())
