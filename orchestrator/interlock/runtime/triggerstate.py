"""Reading the triggers bucket as the listings show it (``interlock queues``): each key's
open window and each key's rate. Loads none of the compiler's modules.

A window keeps what its events brought (a batch's every event: up to half the server's
payload limit each, a key per value a publisher names), so the bucket is read a bounded
batch at a time (``kvread.scan_bucket``) and what reads it keeps what it makes of each
window, never the bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.js.errors import BucketNotFoundError

from interlock.core.windowing import RateEntry, WindowEntry, decode_entry, decode_rate
from interlock.transport.kvread import scan_bucket
from interlock.transport.subjects import Subjects


async def _scan(js: Any, subjects: Subjects, pattern: str) -> AsyncIterator[tuple[str, bytes]]:
    try:
        kv = await js.key_value(subjects.triggers_bucket)
    except BucketNotFoundError:
        return  # an installation provisioned before triggers had flow control
    async for _, key, value in scan_bucket(kv, pattern):
        yield key, value


async def scan_windows(
    js: Any, subjects: Subjects
) -> AsyncIterator[tuple[str, WindowEntry | None]]:
    """Each trigger key's entry as stored, one at a time (None: gone, no window open or
    closing, or not an entry); a key written again meanwhile may come twice, the later
    last."""
    async for key, value in _scan(js, subjects, "w.>"):
        try:
            entry = decode_entry(value) if value else None
        except msgspec.DecodeError:
            entry = None
        if entry is not None and entry.open is None and entry.sealed is None:
            entry = None
        yield key, entry


async def window_entries(js: Any, subjects: Subjects) -> list[WindowEntry]:
    """Every trigger key with a window open or closing (read without a consumer)."""
    found = {key: entry async for key, entry in scan_windows(js, subjects)}
    return [entry for entry in found.values() if entry is not None]


async def scan_rates(js: Any, subjects: Subjects) -> AsyncIterator[tuple[str, RateEntry | None]]:
    """Each trigger key's rate entry as stored, one at a time (None: gone, or not an
    entry); a key written again meanwhile may come twice, the later last."""
    async for key, value in _scan(js, subjects, "r.>"):
        try:
            yield key, decode_rate(value) if value else None
        except msgspec.DecodeError:
            yield key, None


async def rate_entries(js: Any, subjects: Subjects) -> list[RateEntry]:
    """Every trigger key with a start given in its last ``per`` or to come."""
    found = {key: entry async for key, entry in scan_rates(js, subjects)}
    return [entry for entry in found.values() if entry is not None]
