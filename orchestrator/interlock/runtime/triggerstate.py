"""Reading the triggers bucket as the listings show it (``interlock queues``): each key's
open window and each key's rate. Loads none of the compiler's modules."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
from nats.js.errors import BucketNotFoundError

from interlock.core.windowing import RateEntry, WindowEntry, decode_entry, decode_rate
from interlock.transport.kvread import bucket_values
from interlock.transport.subjects import Subjects


async def _values(js: Any, subjects: Subjects, pattern: str) -> list[bytes]:
    try:
        kv = await js.key_value(subjects.triggers_bucket)
    except BucketNotFoundError:
        return []  # an installation provisioned before triggers had flow control
    return list((await bucket_values(kv, pattern)).values())


async def window_entries(js: Any, subjects: Subjects) -> list[WindowEntry]:
    """Every trigger key with a window open or closing (read without a consumer)."""
    out = []
    for value in await _values(js, subjects, "w.>"):
        with contextlib.suppress(msgspec.DecodeError):
            entry = decode_entry(value)
            if entry.open is not None or entry.sealed is not None:
                out.append(entry)
    return out


async def rate_entries(js: Any, subjects: Subjects) -> list[RateEntry]:
    """Every trigger key with a start given in its last ``per`` or to come."""
    out = []
    for value in await _values(js, subjects, "r.>"):
        with contextlib.suppress(msgspec.DecodeError):
            out.append(decode_rate(value))
    return out
