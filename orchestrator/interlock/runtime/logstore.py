"""Run logs in JetStream: one subject per run, read in order, appended optimistically.

Each message on a run's subject holds the records of one decision as a JSON array of
CloudEvents (the CloudEvents batch format), so appending a decision is one publish and
atomic by construction. (JetStream's atomic batch publish gives the same guarantee across
several messages, but a file-backed stream stages every batch in a file store of its own,
with several syncs: 13 to 17 ms a batch here, see ``python -m bench batch``.) Appends are
guarded by ``Nats-Expected-Last-Subject-Sequence``: a writer with a stale view loses,
re-reads and decides again, which is what makes several orchestrator replicas safe without
locks.

Every append carries its record MAC (:mod:`interlock.transport.logmac`), and every read
checks it: a message on a run's subject that is not an authenticated record is foreign,
left out of what is read and reported (:mod:`interlock.runtime.foreign`), and what it
cost is only that it is skipped: the sequence of the last message read, foreign or not,
is still what the next optimistic append expects.

Reading uses batched direct gets (:mod:`interlock.transport.directget`: one request
returns up to a thousand messages of one subject), so rebuilding a run after a restart
costs one round trip per thousand decisions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError

from interlock.core import events as ev
from interlock.core.vocabulary import InterlockError
from interlock.runtime.foreign import Foreign, ForeignReport
from interlock.runtime.groupcommit import GroupCommit
from interlock.transport.appends import append_batch
from interlock.transport.directget import LogReadError, read_entries
from interlock.transport.errors import AppendConflict
from interlock.transport.logmac import MAC_HEADER, LogKey, load_log_key
from interlock.transport.natsclient import js_api
from interlock.transport.partitions import Placement
from interlock.transport.subjects import Subjects

_TIMEOUT = 5.0
LEADER_WAIT_S = 10.0
"""How long a read asked of a stream's leader waits for one while the stream has none
(an election takes 4 to 7 s after a node's loss, a leader handing over some 50 ms)."""
_LEADER_POLL_S = 0.05
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


class RecordsTooLarge(ValueError, InterlockError):
    """One decision's records do not fit in one NATS message; nothing was appended."""

    def __init__(self, run_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"run {run_id}: the records take {size:,} bytes; the server takes at most "
            f"{limit:,} in one message"
        )
        self.size = size
        self.limit = limit


@dataclass(slots=True)
class LogRead:
    """What a read of a run's log found."""

    messages: list[tuple[int, bytes]] = field(default_factory=list)
    """(stream sequence, encoded batch) of each authenticated message, in order."""
    last: int = 0
    """The stream sequence of the last message read, foreign or not (what an append
    after this read expects); ``after`` when there was none."""
    foreign: list[Foreign] = field(default_factory=list)
    """The messages skipped: not records Interlock wrote."""


class RunLog:
    """The run-log port over JetStream."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        group_commit: int = 0,
        foreign: ForeignReport | None = None,
        placement: Placement | None = None,
    ) -> None:
        """``group_commit``: send appends in atomic batches of at least this many when
        that many await their acknowledgement (0: never; see :mod:`groupcommit`).
        ``foreign``: told about each foreign message found (by default, a warning).
        ``placement``: where runs' logs are (by default, read from the partition map)."""
        self._nc = nc
        self._subjects = subjects
        self.placement = placement or Placement(nc, subjects)
        self.group = GroupCommit(nc, self._append_one, group_commit) if group_commit else None
        self.foreign = foreign or ForeignReport()
        self._key: LogKey | None = None
        self._loading: asyncio.Lock = asyncio.Lock()

    async def key(self) -> LogKey:
        """The installation's log key (read, or made, once).

        Raises:
            SecretDamaged: the stored key is damaged (see :mod:`interlock.transport.logmac`).
        """
        if self._key is None:
            async with self._loading:
                if self._key is None:
                    self._key = await load_log_key(self._nc, self._subjects)
        return self._key

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        """(stream sequence, encoded batch) of every authenticated message after stream
        sequence ``after`` (foreign ones left out, and reported)."""
        return (await self.read_checked(run_id, after)).messages

    async def read_checked(
        self, run_id: str, after: int = 0, *, limit: int | None = None, consistent: bool = False
    ) -> LogRead:
        """The messages after ``after`` (the first ``limit`` of them, foreign ones
        included, when given), each checked: :class:`LogRead`.

        ``consistent``: read until the leader's last message is in (on a replicated stream
        a direct get may come from a replica that has not applied the newest appends yet).
        """
        if consistent:
            # The leader's last sequence and the read, asked at once: one round trip.
            target, found = await asyncio.gather(
                self.last_seq(run_id), self._read_checked(run_id, after, limit)
            )
        else:
            target, found = 0, await self._read_checked(run_id, after, limit)
        for attempt in range(20):
            if found.last >= target or (limit is not None and _read_count(found) >= limit):
                break
            # A replica behind the leader answered: it catches up within milliseconds.
            await asyncio.sleep(0.01 * (attempt + 1))
            found = await self._read_checked(run_id, after, limit)
        return found

    async def where(self, run_id: str) -> tuple[str, str]:
        """(stream, subject) of the run's log (see :class:`Placement`)."""
        return self._at(run_id, await self.placement.locate(run_id))

    def _at(self, run_id: str, partition: int) -> tuple[str, str]:
        return self.placement.stream(partition), self.placement.subject(run_id, partition)

    async def _elsewhere(self, run_id: str, partition: int) -> tuple[str, str] | None:
        """(stream, subject) of the run's log when it was not found in ``partition`` but
        is in another (a layout set since the map was read here placed it there)."""
        other = await self.placement.relocate(run_id, partition)
        return None if other is None else self._at(run_id, other)

    async def _read_checked(self, run_id: str, after: int, limit: int | None) -> LogRead:
        partition = await self.placement.locate(run_id)
        stream, subject = self._at(run_id, partition)
        entries = await read_entries(self._nc, stream, subject, after, limit=limit)
        if not entries and not after:
            elsewhere = await self._elsewhere(run_id, partition)
            if elsewhere is not None:
                stream, subject = elsewhere
                entries = await read_entries(self._nc, stream, subject, after, limit=limit)
        found = LogRead(last=entries[-1][0] if entries else after)
        if not entries:
            return found
        key = self._key or await self.key()
        for seq, headers, data in entries:
            foreign = check_message(key, stream, subject, seq, headers, data)
            if foreign is None:
                found.messages.append((seq, data))
                continue
            found.foreign.append(foreign)
            self.foreign.saw(foreign)
        return found

    async def last_record(
        self, run_id: str, headers: dict[str, str] | None, data: bytes
    ) -> bytes | None:
        """The payload of the run's last authenticated message, given the run's last
        message as a direct get answered it (``headers`` and ``data``): that one when it
        is authenticated, else (it is foreign, and reported) the last one read back."""
        seq = int((headers or {}).get("Nats-Sequence", "0") or 0)
        stream, subject = await self.where(run_id)
        key = self._key or await self.key()
        found = check_message(key, stream, subject, seq, headers, data)
        if found is None:
            return data
        self.foreign.saw(found)
        raw = await self.read_raw(run_id)
        return raw[-1][1] if raw else None

    async def last_seq(self, run_id: str) -> int:
        """The stream sequence of the run's last message, as the stream leader knows it
        (0: no such run). Direct gets may be answered by a replica that is behind."""
        partition = await self.placement.locate(run_id)
        found = await self._last_seq(run_id, *self._at(run_id, partition))
        if found is None:
            elsewhere = await self._elsewhere(run_id, partition)
            if elsewhere is not None:
                found = await self._last_seq(run_id, *elsewhere)
        return found or 0

    async def _last_seq(self, run_id: str, stream: str, subject: str) -> int | None:
        """Asked of the stream's leader. While the stream has none (an election after a
        node's loss, a leader handing over) the server answers 503 or, for a request that
        reached the old leader as it stepped down, nothing: asked again, each time with a
        longer wait for the answer, for up to ``LEADER_WAIT_S``."""
        api = f"{js_api(self._nc)}.STREAM.MSG.GET.{stream}"
        body = json.dumps({"last_by_subj": subject}).encode()
        deadline = time.monotonic() + LEADER_WAIT_S
        wait = 0.5
        while True:
            left = deadline - time.monotonic()
            try:
                msg = await self._nc.request(api, body, timeout=max(0.1, min(wait, left)))
            except NatsTimeoutError:
                if left <= wait:
                    raise
                wait = min(wait * 2, _TIMEOUT)
                continue
            reply = json.loads(msg.data)
            error = reply.get("error")
            if not error:
                return int(reply["message"]["seq"])
            if error.get("code") == 404:
                return None
            if error.get("code") != 503 or left <= _LEADER_POLL_S:
                raise LogReadError(f"reading the last record of {run_id}: {error}")
            await asyncio.sleep(_LEADER_POLL_S)

    async def read(
        self, run_id: str, after: int = 0, *, consistent: bool = False
    ) -> tuple[list[ev.AnyRecord], int]:
        """The decoded records after ``after`` and the stream sequence of the last one.

        ``consistent``: read until the leader's last record is in (on a replicated stream a
        direct get may come from a replica that has not applied the newest appends yet).
        """
        found = await self.read_checked(run_id, after, consistent=consistent)
        records = [record for _, data in found.messages for record in ev.decode_batch(data)]
        return records, found.last

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
        placement = self.placement
        partition = await (
            placement.place_new(run_id) if not expected_last_seq else placement.locate(run_id)
        )
        subject = placement.subject(run_id, partition)
        key = self._key or await self.key()
        headers = {**_HEADERS, MAC_HEADER: key.mac(subject, payload)}
        if self.group is not None:
            return await self.group.append(subject, headers, payload, expected_last_seq)
        return await append_batch(self._nc, subject, [(headers, payload)], expected_last_seq)

    async def _append_one(
        self, subject: str, headers: dict[str, str], data: bytes, expected: int
    ) -> int:
        return await append_batch(self._nc, subject, [(headers, data)], expected)


def _read_count(found: LogRead) -> int:
    """Messages a read returned, foreign ones too."""
    return len(found.messages) + len(found.foreign)


def check_message(
    key: LogKey, stream: str, subject: str, seq: int, headers: dict[str, str] | None, data: bytes
) -> Foreign | None:
    """None when the message at ``seq`` of ``stream`` is a record Interlock wrote on the run
    log ``subject`` (its MAC checks out, or it predates the log key and decodes as
    records), else what is wrong with it."""
    # From before the key: records if they decode as records. Only the first partition's
    # stream (``<BASE>_RUNS``, the one stream before partitions) holds messages from then.
    before = seq <= key.signed_after and stream.endswith("_RUNS")
    why = _not_records(data) if before else key.refusal(subject, headers, data)
    if why is None:
        return None
    return Foreign(stream, seq, subject, why, _stored_headers(headers or {}), data)


def _not_records(data: bytes) -> str | None:
    """Why ``data`` is not a batch of records (None: it is one)."""
    try:
        ev.decode_batch(data)
    # Whatever the decoder says, it is not a batch of records.
    except Exception as exc:  # noqa: BLE001
        return f"it does not decode as records: {str(exc)[:200]}"
    return None


def _stored_headers(headers: dict[str, str]) -> dict[str, str]:
    """A foreign message's own headers (without those the direct get added)."""
    added = ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp")
    return {k: v for k, v in headers.items() if k not in added and not k.startswith("Nats-Num-")}


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
