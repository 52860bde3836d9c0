"""Reading a KV bucket whole: every key's current value in one pass."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import msgspec
import nats.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from interlock.core.ids import capability_token
from interlock.transport.cloudevents_model import InvalidCloudEvent, decode_json

log = logging.getLogger("interlock.workers")

_READ_TIMEOUT = 5.0
"""Seconds :func:`bucket_values` waits for the next value before it gives up."""


async def bucket_values(kv: KeyValue) -> dict[str, bytes]:
    """Every key of a KV bucket with its current value, read in one pass (one ordered
    consumer over the bucket's last values, not one request per key).

    The read ends at the bucket's newest record, looked up before the watch starts: the
    watcher's own "nothing pending" marker comes from a pending count the server can
    report before every value has been delivered, and a read that stopped there would
    miss keys (a workflow just applied reported as unknown). Deletes are read too, so the
    newest record is seen even when it removed its key.
    """
    newest = await newest_revision(kv)
    if newest is None:
        return {}
    values: dict[str, bytes] = {}
    watcher = await kv.watchall()
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=_READ_TIMEOUT)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                # The newest record went away (aged out) before the watch reached it,
                # or the server stopped answering: what was read is all there is.
                latest = await newest_revision(kv)
                if latest is None or latest <= newest:
                    return values
                newest = latest
                continue
            if entry is None:
                continue
            if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                values.pop(entry.key, None)
            else:
                values[entry.key] = entry.value
            if entry.revision is not None and entry.revision >= newest:
                return values
    finally:
        # Closing: a connection already gone leaves nothing to undo.
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]


async def stored_keys(kv: KeyValue, pattern: str) -> list[str]:
    """The keys matching ``pattern`` (a key filter: ``wf.default.echo.*``) that hold a
    value, sorted.

    The stream's subjects under the pattern, counted by the server in one stream-info
    request, say which keys have records; a watch over their last records then says
    which of those were deleted, and it ends once every one of them has been seen. The
    watcher's own "nothing pending" marker is not waited for: the server can report
    nothing pending before every record has reached the watcher, and a read that stopped
    there would miss keys (a version just applied left out of the list).
    """
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{kv._pre}{pattern}")
    unseen = {subject[len(kv._pre) :] for subject in info.state.subjects or {}}
    if not unseen:
        return []
    held: set[str] = set()
    watcher = await kv.watch(pattern, meta_only=True)
    try:
        while unseen:
            try:
                entry = await watcher.updates(timeout=_READ_TIMEOUT)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                break  # the rest were removed (aged out) before the watch reached them
            if entry is None:
                continue
            unseen.discard(entry.key)
            if entry.operation in (KV_DEL, KV_PURGE):
                held.discard(entry.key)
            else:
                held.add(entry.key)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return sorted(held)


async def newest_revision(kv: KeyValue) -> int | None:
    """The stream sequence of the bucket's newest stored record (None when it is empty).

    Every record of a bucket is on its stream's subjects, so the stream's last sequence is
    the newest record's revision; the bucket's status (a stream info request, which binding
    the bucket already makes) holds it.
    """
    state = (await kv.status()).stream_info.state
    return state.last_seq if state.messages else None


def live_workers(heartbeats: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The workers of the workers bucket's heartbeats (key: value), one per process, each
    with the ``capabilities`` its keys vouch for.

    A worker heartbeats under one key per capability it serves
    (``<capability>.<instance>``, :func:`~interlock.transport.tasks.heartbeat_key`), and an
    agent may write only its own capabilities' keys, but whatever bytes it likes there. So
    a value that is not a JSON object nesting at most 64 levels is left out (logged), and
    a heartbeat counts only for the capability of its key: an agent naming others in its
    value shows as no worker of theirs. One agent's heartbeats neither hide the other
    workers nor fail the listing."""
    workers: dict[tuple[str, str], dict[str, Any]] = {}
    vouched: dict[tuple[str, str], set[str]] = {}
    for key, value in heartbeats.items():
        try:
            record = decode_json(value, "a heartbeat")
        except (InvalidCloudEvent, msgspec.DecodeError) as exc:
            log.warning("heartbeat %s is not JSON; left out: %s", key, exc)
            continue
        if type(record) is not dict:
            log.warning("heartbeat %s is not a JSON object; left out", key)
            continue
        caps = record.get("capabilities")
        record["capabilities"] = [c for c in caps if type(c) is str] if type(caps) is list else []
        worker = (str(record.get("name")), str(record.get("instance")))
        workers.setdefault(worker, record)
        token = key.split(".", 1)[0]
        vouched.setdefault(worker, set()).update(
            c for c in record["capabilities"] if capability_token(c) == token
        )
    for worker, record in workers.items():
        record["capabilities"] = [c for c in record["capabilities"] if c in vouched[worker]]
    return list(workers.values())
