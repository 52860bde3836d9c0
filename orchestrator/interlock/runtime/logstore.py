"""Run logs in JetStream: one subject per run, read in order, appended optimistically.

Each message on a run's subject holds the records of one decision as a JSON array of
CloudEvents (the CloudEvents batch format), so appending a decision is one publish and
atomic by construction. (JetStream's atomic batch publish gives the same guarantee across
several messages, but a file-backed stream stages every batch in a file store of its own,
with several syncs: 13 to 17 ms a batch here, see ``python -m bench batch``.) Appends are
guarded by ``Nats-Expected-Last-Subject-Sequence``: a writer with a stale view loses,
re-reads and decides again, which is what makes several orchestrator replicas safe without
locks.

Reading uses batched direct gets (:mod:`interlock.transport.directget`: one request
returns up to a thousand messages of one subject), so rebuilding a run after a restart
costs one round trip per thousand decisions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Protocol

from nats.aio.client import Client

from interlock.core import events as ev
from interlock.runtime.groupcommit import GroupCommit
from interlock.transport.directget import LogReadError, read_subject
from interlock.transport.errors import AppendConflict
from interlock.transport.provision import append_batch
from interlock.transport.subjects import Subjects

_TIMEOUT = 5.0
_HEADERS = {"Content-Type": ev.BATCH_CONTENT_TYPE}


class LogStore(Protocol):
    """The run-log port: one ordered log per run, appended optimistically.

    Positions are sequences of one stream shared by every run (increasing, with gaps
    where other runs' appends went). Contract suite: ``tests/runtime/test_logstore.py``,
    run against :class:`RunLog` (JetStream) and :class:`MemoryRunLog`.
    """

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        """(sequence, encoded batch) of every append to the run after ``after``."""
        ...

    async def last_seq(self, run_id: str) -> int:
        """The sequence of the run's last append (0: no such run)."""
        ...

    async def read(
        self, run_id: str, after: int = 0, *, consistent: bool = False
    ) -> tuple[list[ev.AnyRecord], int]:
        """The records after ``after`` and the sequence of the last append read."""
        ...

    async def append(
        self, run_id: str, records: Sequence[ev.Record], expected_last_seq: int
    ) -> int:
        """Append one decision's records, all or nothing; its sequence.

        Raises:
            AppendConflict: the run's last append is not at ``expected_last_seq``.
        """
        ...


RECORD_HEADROOM = 4 * 1024
"""Room kept below the server's payload limit for an append's headers."""


class RecordsTooLarge(ValueError):
    """One decision's records do not fit in one NATS message; nothing was appended."""

    def __init__(self, run_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"run {run_id}: the records take {size:,} bytes; the server takes at most "
            f"{limit:,} in one message"
        )
        self.size = size
        self.limit = limit


class RunLog:
    """The run-log port over JetStream."""

    def __init__(self, nc: Client, subjects: Subjects, *, group_commit: int = 0) -> None:
        """``group_commit``: send appends in atomic batches of at least this many when
        that many await their acknowledgement (0: never; see :mod:`groupcommit`)."""
        self._nc = nc
        self._subjects = subjects
        self.group = GroupCommit(nc, self._append_one, group_commit) if group_commit else None

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        """(stream sequence, encoded batch) of every message after stream sequence ``after``."""
        return await read_subject(
            self._nc, self._subjects.runs_stream, self._subjects.run(run_id), after
        )

    async def last_seq(self, run_id: str) -> int:
        """The stream sequence of the run's last message, as the stream leader knows it
        (0: no such run). Direct gets may be answered by a replica that is behind."""
        api = f"$JS.API.STREAM.MSG.GET.{self._subjects.runs_stream}"
        body = json.dumps({"last_by_subj": self._subjects.run(run_id)}).encode()
        reply = json.loads((await self._nc.request(api, body, timeout=_TIMEOUT)).data)
        error = reply.get("error")
        if error:
            if error.get("code") == 404:
                return 0
            raise LogReadError(f"reading the last record of {run_id}: {error}")
        return int(reply["message"]["seq"])

    async def read(
        self, run_id: str, after: int = 0, *, consistent: bool = False
    ) -> tuple[list[ev.AnyRecord], int]:
        """The decoded records after ``after`` and the stream sequence of the last one.

        ``consistent``: read until the leader's last record is in (on a replicated stream a
        direct get may come from a replica that has not applied the newest appends yet).
        """
        target = await self.last_seq(run_id) if consistent else 0
        raw = await self.read_raw(run_id, after)
        for attempt in range(20):
            if (raw[-1][0] if raw else after) >= target:
                break
            # A replica behind the leader answered: it catches up within milliseconds.
            await asyncio.sleep(0.01 * (attempt + 1))
            raw = await self.read_raw(run_id, after)
        last = raw[-1][0] if raw else after
        return [record for _, data in raw for record in ev.decode_batch(data)], last

    async def append(
        self, run_id: str, records: Sequence[ev.Record], expected_last_seq: int
    ) -> int:
        """Append one decision's records as one message; returns its stream sequence.

        Raises AppendConflict when the log moved past ``expected_last_seq``, and
        RecordsTooLarge (before sending anything) when they do not fit in one message.
        """
        payload = ev.encode_batch(records)
        limit = self._nc.max_payload - RECORD_HEADROOM
        if len(payload) > limit:
            raise RecordsTooLarge(run_id, len(payload), limit)
        subject = self._subjects.run(run_id)
        if self.group is not None:
            return await self.group.append(subject, _HEADERS, payload, expected_last_seq)
        return await append_batch(self._nc, subject, [(_HEADERS, payload)], expected_last_seq)

    async def _append_one(
        self, subject: str, headers: dict[str, str], data: bytes, expected: int
    ) -> int:
        return await append_batch(self._nc, subject, [(headers, data)], expected)


class MemoryRunLog:
    """The run-log port in memory, for tests and tools that need no server."""

    def __init__(self) -> None:
        self._messages: list[tuple[str, int, bytes]] = []
        self._last: dict[str, int] = {}

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        return [(seq, data) for rid, seq, data in self._messages if rid == run_id and seq > after]

    async def last_seq(self, run_id: str) -> int:
        return self._last.get(run_id, 0)

    async def read(
        self, run_id: str, after: int = 0, *, consistent: bool = False
    ) -> tuple[list[ev.AnyRecord], int]:
        raw = await self.read_raw(run_id, after)
        last = raw[-1][0] if raw else after
        return [record for _, data in raw for record in ev.decode_batch(data)], last

    async def append(
        self, run_id: str, records: Sequence[ev.Record], expected_last_seq: int
    ) -> int:
        if self._last.get(run_id, 0) != expected_last_seq:
            raise AppendConflict(f"runs.{run_id}", expected_last_seq)
        seq = len(self._messages) + 1
        self._messages.append((run_id, seq, ev.encode_batch(records)))
        self._last[run_id] = seq
        return seq
