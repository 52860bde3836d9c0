"""The workers bucket's heartbeats, read as the listings show them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Mapping
from typing import Any

import msgspec

from interlock.core.ids import capability_token
from interlock.transport.cloudevents_model import InvalidCloudEvent, decode_json

log = logging.getLogger("interlock.workers")


def live_workers(heartbeats: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The workers of the workers bucket's heartbeats (key: value), one per process, each
    with the ``capabilities`` its keys vouch for.

    A worker heartbeats under one key per capability it serves
    (``<capability>.<instance>``, :func:`~interlock.transport.tasks.heartbeat_key`), and an
    agent may write only its own capabilities' keys, but whatever bytes it likes there. So
    a value that is not a JSON object nesting at most 64 levels is left out (logged), and
    a heartbeat counts only for the capability of its key: an agent naming others in its
    value shows as no worker of theirs. One agent's heartbeats neither hide the other
    workers nor fail the listing. A worker is its name, its instance and the capabilities
    its record lists (the same record under each of its keys): by name and instance alone,
    an agent that wrote a heartbeat naming another team's worker, older than that worker's
    own, had its record listed in that worker's place, with its own capabilities."""
    workers: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}
    vouched: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
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
        named = (str(record.get("name")), str(record.get("instance")))
        worker = (*named, tuple(record["capabilities"]))
        workers.setdefault(worker, record)
        token = key.split(".", 1)[0]
        vouched.setdefault(worker, set()).update(
            c for c in record["capabilities"] if capability_token(c) == token
        )
    for worker, record in workers.items():
        record["capabilities"] = [c for c in record["capabilities"] if c in vouched[worker]]
    return list(workers.values())


MAX_COUNTED = 10_000
"""Live workers of one capability counted at most by :func:`count_workers`: a gauge at
this value says "at least". What an agent's flood under its own capability's keys costs
the count is that many names kept, and its further heartbeats are not decoded."""


async def count_workers(
    records: AsyncIterable[tuple[int, str, bytes]], most: int | None = None
) -> dict[str, int]:
    """The live workers of each capability, as :func:`live_workers` counts them, from the
    workers bucket's records (revision, key, value) read a batch at a time
    (:func:`~interlock.transport.kvread.scan_bucket`). What is held is one batch and, per
    capability, a hash of each worker counted, at most ``most`` (default
    :data:`MAX_COUNTED`), whatever the names' lengths; a capability's token with that many
    has its further heartbeats skipped undecoded. A heartbeat written again during the
    read may come twice: its worker is counted once. Heartbeats that are no JSON object
    are left out, and counted in one log line per read."""
    most = MAX_COUNTED if most is None else most
    counted: dict[str, set[int]] = {}
    full: set[str] = set()
    left_out, first_left_out = 0, ""
    async for _, key, value in records:
        token = key.split(".", 1)[0]
        if not value or token in full:
            continue
        try:
            record = decode_json(value, "a heartbeat")
        except (InvalidCloudEvent, msgspec.DecodeError):
            record = None
        if type(record) is not dict:
            left_out, first_left_out = left_out + 1, first_left_out or key
            continue
        caps = record.get("capabilities")
        worker = hash((str(record.get("name")), str(record.get("instance"))))
        for capability in caps if type(caps) is list else []:
            if type(capability) is str and capability_token(capability) == token:
                workers = counted.setdefault(capability, set())
                workers.add(worker)
                if len(workers) >= most:
                    full.add(token)
    if left_out:
        log.warning(
            "%d heartbeat(s) are no JSON object, left out (the first: %s)",
            left_out,
            first_left_out,
        )
    return {capability: len(workers) for capability, workers in counted.items()}
