"""Correlation: later events reach runs by a declared key, through an index, never a scan.

When a run of a workflow with ``correlate`` starts, its key is recorded in the run's first
record and indexed in KV: ``<namespace>.<workflow>.<key hash>`` -> the runs with that key.
An inbound event of a type named in ``correlate.events`` computes the same key, looks the
runs up and is decided on by each. When none of them takes it (no run has that key yet, or
the run is not waiting for that event yet), the event is parked on
``<prefix>.parked.<namespace>.<workflow>.<key hash>`` (kept 15 minutes) and offered again
each time a run with that key enters a state.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from interlock.runtime.foreign import bucket_list, foreign_value
from interlock.transport.cloudevents import CloudEvent, encode_structured, from_dict
from interlock.transport.directget import read_subject
from interlock.transport.jetstream import jetstream
from interlock.transport.kvbatch import delete_key
from interlock.transport.streamconfigs import MARKER_KEPT_S
from interlock.transport.subjects import Subjects


def key_token(namespace: str, workflow: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"{namespace}.{workflow}.{digest}"


class CorrelationIndex:
    """The (workflow, key) -> runs index and the parked events."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._js = jetstream(nc)
        self._subjects = subjects
        self._kv: Any = None

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.correlation_bucket)
        return self._kv

    async def add(self, namespace: str, workflow: str, key: str, run_id: str) -> None:
        kv = await self._bucket()
        token = key_token(namespace, workflow, key)
        for _ in range(20):
            try:
                entry = await kv.get(token)
                runs = self._runs_of(token, entry)
                revision = entry.revision
            except KeyNotFoundError:
                runs, revision = [], None
            if run_id in runs:
                return
            body = json.dumps([*runs, run_id]).encode()
            try:
                if revision is None:
                    await kv.create(token, body)
                else:
                    await kv.update(token, body, last=revision)
            except KeyWrongLastSequenceError:
                continue
            except Exception as exc:  # create() on a key someone just made
                if "wrong last sequence" not in str(exc).lower():
                    raise
            else:
                return

    async def remove(self, namespace: str, workflow: str, key: str, run_id: str) -> None:
        """Take a finished run out of the index (the key goes when no run is left)."""
        kv = await self._bucket()
        token = key_token(namespace, workflow, key)
        for _ in range(20):
            try:
                entry = await kv.get(token)
            except KeyNotFoundError:
                return
            runs = [r for r in self._runs_of(token, entry) if r != run_id]
            try:
                if runs:
                    await kv.update(token, json.dumps(runs).encode(), last=entry.revision)
                else:
                    await delete_key(kv, token, kept_s=MARKER_KEPT_S, last=entry.revision)
            except KeyWrongLastSequenceError:
                continue
            else:
                return

    async def runs(self, namespace: str, workflow: str, key: str) -> list[str]:
        kv = await self._bucket()
        try:
            token = key_token(namespace, workflow, key)
            entry = await kv.get(token)
        except KeyNotFoundError:
            return []
        return self._runs_of(token, entry)

    def _runs_of(self, token: str, entry: Any) -> list[str]:
        """The run ids a correlation entry holds (what else it holds is left out, reported)."""
        found = bucket_list(self._subjects.correlation_bucket, token, entry.value, entry.revision)
        runs = [r for r in found if isinstance(r, str)]
        if len(runs) != len(found):
            foreign_value(self._subjects.correlation_bucket, token, "not a list of run ids")
        return runs

    async def park(self, namespace: str, workflow: str, key: str, event: CloudEvent) -> None:
        headers, payload = encode_structured(event)
        headers["Nats-Msg-Id"] = (
            f"parked:{key_token(namespace, workflow, key)}:{event.source}:{event.id}"
        )
        await self._js.publish(
            self._subjects.parked(key_token(namespace, workflow, key)), payload, headers=headers
        )

    async def parked(self, namespace: str, workflow: str, key: str) -> list[CloudEvent]:
        subject = self._subjects.parked(key_token(namespace, workflow, key))
        raw = await read_subject(self._nc, self._subjects.parked_stream, subject)
        events = []
        for seq, data in raw:
            try:
                events.append(from_dict(json.loads(data)))
            # Not an event Interlock parked: left out, reported.
            except Exception:  # noqa: BLE001
                foreign_value(self._subjects.parked_stream, subject, "not a CloudEvent", seq)
        return events
