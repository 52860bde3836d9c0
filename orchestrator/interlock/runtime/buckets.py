"""Reading a KV bucket whole: every key's current value in one pass."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec
from nats.js.kv import KeyValue

from interlock.core.ids import capability_token
from interlock.runtime.logstore import read_messages
from interlock.transport.cloudevents_model import InvalidCloudEvent, decode_json

log = logging.getLogger("interlock.workers")


async def bucket_values(kv: KeyValue) -> dict[str, bytes]:
    """Every key of a KV bucket with its current value, read in one pass.

    See :func:`_fold` for how; the read ends at the bucket's newest record, looked up
    first (a workflow just applied is there when ``start`` reads the bucket next).
    """
    newest = await newest_revision(kv)
    if newest is None:
        return {}
    return await _fold(kv, ">", newest)


async def stored_keys(kv: KeyValue, pattern: str) -> list[str]:
    """The keys matching ``pattern`` (a key filter: ``wf.default.echo.*``) that hold a
    value, sorted."""
    return sorted(await _fold(kv, pattern, None))


async def _fold(kv: KeyValue, pattern: str, newest: int | None) -> dict[str, bytes]:
    """The keys under ``pattern`` with their values: the bucket's records, oldest first,
    read by batched direct gets (:func:`~interlock.runtime.logstore.read_messages`), the
    last record of each key winning; a delete or purge marker (no value) removes its key.

    No consumer is made. A watch (an ordered consumer) stays on the server for its
    inactivity threshold after it is stopped, and a stream takes at most 1,000 consumers:
    one-shot reads as watches (``GET /agents``, the console, the CLI, the metrics) left
    that many behind within minutes of polling, and then every new watch of the bucket,
    the orchestrator's own among them, was refused. A watch's "nothing pending" marker
    can also come before the records, so a read that stopped there missed keys.

    ``newest``: the bucket's newest revision; the read goes on once if a replica that
    answered had not reached it yet (a record aged out since leaves it short, and that is
    all there is).
    """
    nc, stream, prefix = kv._js._nc, kv._stream, kv._pre
    records = await read_messages(nc, stream, f"{prefix}{pattern}")
    if newest is not None and records and records[-1][0] < newest:
        records += await read_messages(nc, stream, f"{prefix}{pattern}", records[-1][0])
    values: dict[str, bytes] = {}
    for _, subject, value in records:
        key = subject[len(prefix) :]
        if value:
            values[key] = value
        else:
            values.pop(key, None)
    return values


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
