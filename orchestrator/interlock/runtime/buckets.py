"""The workers bucket's heartbeats, read as the listings show them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
