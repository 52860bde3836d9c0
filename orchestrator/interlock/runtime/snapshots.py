"""Snapshots: a run's folded state kept beside its log, so that reading a long run costs
the records after the snapshot, not the whole log.

A snapshot is derived data, never trusted over the log. It is kept in the KV bucket
``<prefix>_snapshots`` under the run id, and holds the state folded up to one message of
the run's log: that message's stream sequence, the SHA-256 of its payload, and how many
messages of the run's subject there were up to it. Reading one (:func:`read_state`):

1. the run's log is read from that message on (batched direct gets), and, at the same
   time, how many messages the run's subject holds (one stream-info request): two
   requests after the snapshot's, in one round trip, however long the log;
2. the first message read must be at that sequence, on this run's subject, with that
   digest, and its last record must be the state's last position;
3. the subject must hold exactly the snapshot's count plus the messages read after that
   first one, so no message before the snapshot went missing (when it holds more, the
   run moved between the two answers: both are asked again, a few times at most);
4. the records after it are folded onto the snapshot's state.

A snapshot carries the record MAC of the run logs (:mod:`interlock.transport.logmac`:
``Interlock-Record-Mac`` over its KV subject and its bytes, under the log key): one
without it, or whose MAC does not check out, was not written by Interlock and is not used
(no one without the log key can make a snapshot the readers take, as no one can make a
record they fold). Anything else (no snapshot, one that does not decode, a digest, subject
or count that does not match) and the whole log is read and folded, as without
snapshots: a wrong or stale snapshot costs time, never a decision. Replay, export and
``explain`` read the log alone.

The orchestrator writes a run's snapshot after an append once :data:`EVERY` records
have been appended since the last one (short runs never get one), off the decision's path,
counting the run's messages as it reads and appends them; retention deletes it with the
run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError

from interlock.core import events as ev
from interlock.core.state import RunState, fold
from interlock.runtime.foreign import Foreign
from interlock.runtime.logstore import LogStore, RunLog
from interlock.transport.logmac import MAC_HEADER, LogKey
from interlock.transport.natsclient import js_api
from interlock.transport.streamconfigs import MARKER_KEPT_S
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.snapshots")

EVERY = 256
"""Records appended to a run since its last snapshot before it gets a new one."""
FOREIGN_KEPT = 100
"""Foreign messages a snapshot names (``describe`` warns of each)."""
_TIMEOUT = 5.0
_COUNT_ATTEMPTS = 3
"""Reads of the tail and the count that may disagree because the run moved in between,
before the snapshot is not used."""


class ForeignNote(msgspec.Struct, frozen=True):
    """A message of the log before the snapshot that is not a record Interlock wrote."""

    seq: int
    why: str


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A run's state folded up to the message at stream sequence ``seq``."""

    seq: int
    digest: str
    """SHA-256 (hex) of the payload of the message at ``seq``."""
    messages: int
    """Messages of the run's subject up to and including ``seq`` (foreign ones too)."""
    state: RunState
    foreign: list[ForeignNote] = []
    """The foreign messages found up to ``seq`` (at most :data:`FOREIGN_KEPT`)."""


_decode = msgspec.json.Decoder(Snapshot).decode


def digest_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True, slots=True)
class Read:
    """A run's state as read: folded up to stream sequence ``last``. ``records``: those
    read after the snapshot (at least the last message's), or the whole log when no
    snapshot was used; ``covered``: the log position the snapshot used covers (0: none)."""

    state: RunState
    last: int
    """The stream sequence of the last message read, foreign or not (what an append
    after this read expects)."""
    records: list[ev.AnyRecord]
    messages: int
    """Messages of the run's log up to ``last``, foreign ones too."""
    covered: int = 0
    foreign: list[Foreign] = field(default_factory=list)
    """The log's foreign messages, skipped (those before the snapshot as it names them)."""


class Snapshots:
    """The snapshots of one installation."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        write: bool = False,
        key: Callable[[], Awaitable[LogKey]] | None = None,
        where: Callable[[str], Awaitable[tuple[str, str]]] | None = None,
    ) -> None:
        """``write``: this process writes snapshots (the orchestrator); readers do not.
        ``key``: the log key (a run log's ``key``), which snapshots are written and
        checked with; None: none is (for logs in memory). ``where``: the (stream,
        subject) of a run's log (a run log's ``where``; None: the one stream's)."""
        self.writing = write
        self._key = key
        self._where = where
        self._nc = nc
        self._subjects = subjects
        self._stream = f"KV_{subjects.snapshots_bucket}"
        self._writes: set[asyncio.Task[None]] = set()
        self.rejected = 0
        """Snapshots found and not used (they did not match the log)."""

    async def where(self, run_id: str) -> tuple[str, str]:
        """The (stream, subject) of the run's log."""
        if self._where is not None:
            return await self._where(run_id)
        return self._subjects.runs_stream, self._subjects.run(run_id)

    async def messages(self, stream: str, subject: str) -> int:
        """How many messages ``stream`` holds on ``subject`` (a run's log)."""
        return await _messages(self._nc, stream, subject)

    def _key_subject(self, run_id: str) -> str:
        return f"$KV.{self._subjects.snapshots_bucket}.{run_id}"

    async def get(self, run_id: str) -> Snapshot | None:
        """The run's snapshot as stored (None: none, or one that does not decode)."""
        found = await _direct_get(
            self._nc, self._stream, {"last_by_subj": self._key_subject(run_id)}
        )
        if found is None or not found[2]:
            return None
        if self._key is not None:
            key, subject = await self._key(), self._key_subject(run_id)
            if key.refusal(subject, found[3], found[2]) is not None:
                self.rejected += 1
                log.warning("the snapshot of run %s is not one Interlock wrote: not used", run_id)
                return None
        try:
            return _decode(found[2])
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.rejected += 1
            log.warning("the snapshot of run %s does not decode: the log is read whole", run_id)
            return None

    def keep(
        self,
        run_id: str,
        state: RunState,
        seq: int,
        messages: int,
        foreign: Sequence[Foreign] = (),
    ) -> None:
        """Write the run's snapshot: ``state`` as folded up to the message at stream
        sequence ``seq``, the run's ``messages``-th. Off the caller's path: a snapshot not
        written only makes reads longer (logged)."""
        notes = [ForeignNote(f.seq, f.why) for f in foreign[-FOREIGN_KEPT:]]
        work = self._keep_logged(
            run_id, Snapshot(seq=seq, digest="", messages=messages, state=state, foreign=notes)
        )
        task = asyncio.get_running_loop().create_task(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _keep_logged(self, run_id: str, snapshot: Snapshot) -> None:
        try:
            await self.write(run_id, snapshot)
        # A snapshot not written only makes the next read longer.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not write the snapshot of run %s: %s", run_id, exc)

    async def write(self, run_id: str, snapshot: Snapshot) -> bool:
        """Write ``snapshot`` with the digest of the message at its sequence (see
        :meth:`keep`); False when it was not (that message is not the run's, or the state
        is too large to keep)."""
        stream, subject = await self.where(run_id)
        found = await _direct_get(self._nc, stream, {"seq": snapshot.seq})
        if found is None or found[1] != subject:
            return False
        data = msgspec.json.encode(msgspec.structs.replace(snapshot, digest=digest_of(found[2])))
        if len(data) > self._nc.max_payload // 2:
            return False  # too large to keep: this run is read whole
        subject = self._key_subject(run_id)
        headers = {MAC_HEADER: (await self._key()).mac(subject, data)} if self._key else None
        await self._nc.request(subject, data, headers=headers, timeout=_TIMEOUT)
        return True

    async def delete(self, run_id: str) -> None:
        await self._nc.request(
            self._key_subject(run_id),
            b"",
            headers={"KV-Operation": "DEL", "Nats-TTL": f"{MARKER_KEPT_S}s"},
            timeout=_TIMEOUT,
        )


async def read_state(
    log_store: LogStore, snapshots: Snapshots | None, run_id: str, *, consistent: bool = False
) -> Read | None:
    """The run's state: from its snapshot and the records after it where the snapshot
    matches the log, else by folding the whole log. None: no such run."""
    snapshot = None if snapshots is None else await snapshots.get(run_id)
    if snapshots is not None and snapshot is not None:
        found = await _from_snapshot(log_store, snapshots, run_id, snapshot, consistent)
        if found is not None:
            return found
        snapshots.rejected += 1
        log.warning("the snapshot of run %s does not match its log: the log is read whole", run_id)
    whole = await _read(log_store, run_id, 0, consistent=consistent)
    records = [r for _, data in whole.messages for r in ev.decode_batch(data)]
    if not records:
        return None
    return Read(fold(records), whole.last, records, whole.count, 0, whole.foreign)


async def _from_snapshot(
    log_store: LogStore, snapshots: Snapshots, run_id: str, snapshot: Snapshot, consistent: bool
) -> Read | None:
    """The run's state from ``snapshot`` and the messages after it, when the log agrees
    with the snapshot (None: it does not)."""
    stream, subject = await snapshots.where(run_id)
    for _ in range(_COUNT_ATTEMPTS):
        # The snapshot's own message is read with those after it, and the count asked
        # at the same time: one round trip, whatever the log's length.
        tail, count = await asyncio.gather(
            _read(log_store, run_id, snapshot.seq - 1, consistent=consistent),
            snapshots.messages(stream, subject),
        )
        ending = _ending(tail, snapshot)
        if ending is None:
            return None
        after = tail.count - 1
        if count < snapshot.messages + after:
            return None  # a message before the snapshot is gone
        if count > snapshot.messages + after:
            continue  # appended between the two answers: ask both again
        records = [r for _, data in tail.messages[1:] for r in ev.decode_batch(data)]
        before = [
            Foreign(stream, n.seq, subject, f"{n.why} (before the snapshot)")
            for n in snapshot.foreign
        ]
        return Read(
            fold(records, snapshot.state),
            tail.last,
            records or ending,
            snapshot.messages + after,
            snapshot.state.seq,
            [*before, *tail.foreign],
        )
    return None


def _ending(tail: _Tail, snapshot: Snapshot) -> list[ev.AnyRecord] | None:
    """The records of the message the snapshot ends with, when the first message of
    ``tail`` (read from the snapshot's sequence on) is that message: at that sequence,
    authenticated, with that digest, ending at the state's last position; else None."""
    if not tail.messages or tail.messages[0][0] != snapshot.seq:
        return None
    data = tail.messages[0][1]
    if digest_of(data) != snapshot.digest:
        return None
    batch = ev.decode_batch(data)
    if not batch or not batch[-1].id.endswith(f":{snapshot.state.seq}"):
        return None
    return batch


@dataclass(frozen=True, slots=True)
class _Tail:
    messages: list[tuple[int, bytes]]
    """The authenticated messages read."""
    last: int
    count: int
    """Messages read, foreign ones too."""
    foreign: list[Foreign]


async def _read(log_store: LogStore, run_id: str, after: int, *, consistent: bool) -> _Tail:
    """The run's messages after ``after``; ``consistent``: until the leader's last one is
    in (see :meth:`RunLog.read_checked`; a log in memory is always consistent)."""
    if isinstance(log_store, RunLog):
        found = await log_store.read_checked(run_id, after, consistent=consistent)
        count = len(found.messages) + len(found.foreign)
        return _Tail(found.messages, found.last, count, found.foreign)
    raw = await log_store.read_raw(run_id, after)
    return _Tail(raw, raw[-1][0] if raw else after, len(raw), [])


async def _direct_get(
    nc: Client, stream: str, body: dict[str, object]
) -> tuple[int, str, bytes, dict[str, str]] | None:
    """(sequence, subject, payload, headers) of one message by a direct get (None: not
    there)."""
    try:
        reply = await nc.request(
            f"{js_api(nc)}.DIRECT.GET.{stream}", json.dumps(body).encode(), timeout=_TIMEOUT
        )
    except NoRespondersError:
        return None  # no such stream (an installation not provisioned yet)
    headers = reply.headers or {}
    if headers.get("Status") or "Nats-Sequence" not in headers:
        return None
    if headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    return int(headers["Nats-Sequence"]), headers.get("Nats-Subject", ""), reply.data, headers


async def _messages(nc: Client, stream: str, subject: str) -> int:
    """How many messages the stream holds on ``subject``."""
    reply = await nc.request(
        f"{js_api(nc)}.STREAM.INFO.{stream}",
        json.dumps({"subjects_filter": subject}).encode(),
        timeout=_TIMEOUT,
    )
    info = json.loads(reply.data)
    return int(((info.get("state") or {}).get("subjects") or {}).get(subject, 0))
