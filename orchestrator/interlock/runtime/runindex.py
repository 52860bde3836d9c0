"""The run index: a projection of the run logs into a KV bucket (``interlock runs``).

One entry per run (workflow, version, status, state, times, error), derived from the
records the relay reads and rebuildable from the logs at any time. Records can come again,
and out of order (a redelivery after a crash, another replica): each entry remembers the
log position it reflects and only moves forward, and is written with compare-and-set.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from interlock.core import events as ev
from interlock.core.vocabulary import FINISHED, RunStatus
from interlock.runtime.foreign import index_entry
from interlock.runtime.runlisting import backfill, listing_key
from interlock.transport.appends import append_batch, append_soon
from interlock.transport.errors import AppendConflict
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

_KNOWN = 4_096
"""Entries remembered as last written (with their revisions), so the next update of a
running run is a compare-and-set with no read first."""
_WRITERS = 10
"""Compare-and-set attempts before giving up on an entry."""

_encode = msgspec.json.encode

INDEXED = (
    ev.RunStarted,
    ev.StateEntered,
    ev.RunCompleted,
    ev.RunFailed,
    ev.RunCancelled,
    ev.RunForked,
    ev.RunMigrated,
    ev.RunQueued,
    ev.RunAdmitted,
    ev.RunPaused,
    ev.RunResumed,
    ev.RunContinued,
)
"""The records an entry is made of; the others leave it as it is."""


class RunIndex:
    """The run index of one installation, written by the relay."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._kv: KeyValue | None = None
        self._known: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()
        self._subject_prefix = f"$KV.{subjects.runs_bucket}."

    async def start(self) -> None:
        self._kv = await jetstream(self._nc).key_value(self._subjects.runs_bucket)
        await backfill(self._nc, self._subjects)

    async def update(self, run_id: str, records: list[ev.AnyRecord]) -> None:
        """Bring the run's entry up to ``records`` (those of them it is made of)."""
        ordered = _ordered(records)
        if ordered:
            await self._write(run_id, ordered)

    def update_soon(
        self, run_id: str, records: list[ev.AnyRecord]
    ) -> tuple[Awaitable[None], bool] | None:
        """:meth:`update`, with its write sent now where it needs no read first (the
        entry's revision known, or a new run's): what to await for its end, and whether
        it is on its way already (it may then be awaited in turn with others; otherwise
        it has I/O to start). None: nothing to write."""
        ordered = _ordered(records)
        if not ordered:
            return None
        unread = _unread(run_id, ordered, self._known.get(run_id))
        if unread is None:
            return self._write(run_id, ordered), False
        current, revision = unread
        listed = listing_key(current) if revision is not None else None
        if not _apply(current, ordered):
            return None  # written already (what is remembered stays)
        moved = _moved(listed, current)
        js = jetstream(self._nc)
        # The listing key first: an entry is never written without it (a crash between
        # the two leaves a listing the readers check against the entry and skip).
        listing = js.request_ack_soon(self._subject(moved[1]), b"{}") if moved else None
        if moved and listing is None:
            return self._write(run_id, ordered), False
        sent = append_soon(self._nc, self._subject(run_id), _encode(current), revision or 0)
        if sent is None:
            return self._write(run_id, ordered), False
        self._known.pop(run_id, None)
        return self._written(run_id, ordered, current, sent, listing, moved), True

    async def _written(
        self,
        key: str,
        ordered: list[tuple[int, ev.AnyRecord]],
        current: dict[str, Any],
        sent: Callable[[], Awaitable[int]],
        listing: Awaitable[Any] | None,
        moved: tuple[str | None, str] | None,
    ) -> None:
        if listing is not None:
            jetstream(self._nc).acknowledged(await listing)
        try:
            revision = await sent()
        except AppendConflict:
            await self._write(key, ordered)  # written meanwhile: read again
            return
        if moved is not None:
            await self._unlist(moved[0])
        self._remember(key, current, revision)

    async def _write(self, key: str, ordered: list[tuple[int, ev.AnyRecord]]) -> None:
        unread = _unread(key, ordered, self._known.pop(key, None))
        for attempt in range(_WRITERS):
            if attempt == 0 and unread is not None:
                current, revision = unread
            else:
                current, revision = await self._read(key)
            listed = listing_key(current) if revision is not None else None
            if not _apply(current, ordered):
                if revision is not None:
                    self._remember(key, current, revision)
                return
            body = _encode(current)
            moved = _moved(listed, current)
            if moved is not None:
                await jetstream(self._nc).publish(self._subject(moved[1]), b"{}")
            try:
                # A compare-and-set put, straight on the bucket's stream (what KeyValue.update
                # does, without its per-call key check and JSON acknowledgement parsing).
                revision = await append_batch(
                    self._nc, self._subject(key), [({}, body)], revision or 0
                )
            except AppendConflict:
                continue  # written meanwhile: read again
            if moved is not None:
                await self._unlist(moved[0])
            self._remember(key, current, revision)
            return
        raise RuntimeError(f"run index entry {key}: too many concurrent writers")

    async def _unlist(self, key: str | None) -> None:
        """Remove a listing key the entry moved from: purged, so no marker stays."""
        if key is not None:
            await jetstream(self._nc).purge_stream(
                f"KV_{self._subjects.runs_bucket}", subject=self._subject(key)
            )

    def _subject(self, key: str) -> str:
        """The subject of the entry ``key`` on the bucket's stream."""
        return self._subject_prefix + key

    async def _read(self, key: str) -> tuple[dict[str, Any], int | None]:
        assert self._kv is not None, "RunIndex.start() first"
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError as exc:
            # Never written, or deleted by hand: then write over the tombstone.
            tombstone = getattr(exc, "entry", None)
            return {"run_id": key}, (tombstone.revision if tombstone is not None else None)
        current = (
            index_entry(self._subjects.runs_bucket, key, entry.value, entry.revision or 0)
            if entry.value
            else None
        )
        # Not an entry written here (reported): written over, as if there were none.
        return current or {"run_id": key}, entry.revision

    def _remember(self, key: str, current: dict[str, Any], revision: int) -> None:
        if current.get("status") in FINISHED:
            return  # no further update is expected
        self._known[key] = (current, revision)
        if len(self._known) > _KNOWN:
            self._known.popitem(last=False)


def _ordered(records: list[ev.AnyRecord]) -> list[tuple[int, ev.AnyRecord]]:
    """The records an entry is made of, with their positions, in log order."""
    ordered = [(position(r), r) for r in records if type(r) in _INDEXED]
    ordered.sort(key=_first)  # stable: records at one position stay in their order
    return ordered


def _moved(listed: str | None, current: dict[str, Any]) -> tuple[str | None, str] | None:
    """(the listing key to remove, the one to write) when the entry's changed."""
    now = listing_key(current)
    return None if now is None or now == listed else (listed, now)


def _first(pair: tuple[int, ev.AnyRecord]) -> int:
    return pair[0]


def _unread(
    key: str,
    ordered: list[tuple[int, ev.AnyRecord]],
    known: tuple[dict[str, Any], int] | None,
) -> tuple[dict[str, Any], int | None] | None:
    """The entry to build on without reading it: a copy of the one remembered
    (``known``), or a new run's (its start among ``ordered``: create, no read). None:
    read it first."""
    if known is not None:
        return dict(known[0]), known[1]
    if ordered[0][0] == 1:
        return {"run_id": key}, None
    return None


def position(record: ev.AnyRecord) -> int:
    """A record's position in its run's log (its id is ``<run id>:<position>``)."""
    try:
        return int(record.id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def _apply(current: dict[str, Any], ordered: list[tuple[int, ev.AnyRecord]]) -> bool:
    """Fold the records past the entry's position into it; whether anything changed."""
    changed = False
    seq = int(current.get("seq", 0))
    for at, record in ordered:
        if at <= seq:
            # Written already, except a run's start read after its later records (its
            # message came again after a crash while the later ones were written): the
            # entry would otherwise never name its workflow, and listings would miss it.
            if type(record) is ev.RunStarted and "workflow" not in current:
                _started(current, record, status=current.get("status"))
                changed = True
            continue
        _UPDATES[type(record)](current, record)
        current["updated_at"] = record.time
        current["seq"] = seq = at
        changed = True
    return changed


def _started(current: dict[str, Any], record: ev.RunStarted, status: str | None) -> None:
    current.update(
        workflow=record.data.workflow,
        namespace=record.data.namespace,
        version=record.data.version,
        status=status or str(RunStatus.RUNNING),
        started_at=record.time,
    )


_COMPLETED, _FAILED, _CANCELLED = (
    str(RunStatus.COMPLETED),
    str(RunStatus.FAILED),
    str(RunStatus.CANCELLED),
)


def _run_started(current: dict[str, Any], record: ev.RunStarted) -> None:
    _started(current, record, status=None)
    if record.data.continued_from is not None:
        current["continued_from"] = record.data.continued_from.run_id


def _run_continued(current: dict[str, Any], record: ev.RunContinued) -> None:
    current["status"] = str(RunStatus.CONTINUED)
    current["continued_to"] = record.data.run_id


def _state_entered(current: dict[str, Any], record: ev.StateEntered) -> None:
    current["state"] = record.data.state


def _run_forked(current: dict[str, Any], record: ev.RunForked) -> None:
    current["version"] = record.data.version
    origin: dict[str, Any] = {"run_id": record.data.origin_run_id, "seq": record.data.origin_seq}
    # The copied run.started carried the origin's start: the run list shows the fork's own
    # (the run began when it was forked), and the origin's stays with the origin.
    if isinstance(current.get("started_at"), str):
        origin["started_at"] = current["started_at"]
    current["forked_from"] = origin
    current["started_at"] = record.time


def _run_queued(current: dict[str, Any], record: ev.RunQueued) -> None:
    rate = [f"{record.data.rate.trigger}@rate"] if record.data.rate is not None else []
    current["queued"] = rate + sorted({c.limit for c in record.data.slots})
    # Each line's key, for the run list to say what the run waits for (a limit's own).
    keys = {c.limit: c.key for c in record.data.slots if c.key and not c.limit.endswith("@paused")}
    if record.data.rate is not None and record.data.rate.key:
        keys[rate[0]] = record.data.rate.key
    if keys:
        current["queued_keys"] = keys
    else:
        current.pop("queued_keys", None)


def _run_admitted(current: dict[str, Any], record: ev.RunAdmitted) -> None:
    current.pop("queued", None)
    current.pop("queued_keys", None)


def _run_migrated(current: dict[str, Any], record: ev.RunMigrated) -> None:
    current["migrated_from"] = record.data.from_version
    current["version"] = record.data.version


def _run_paused(current: dict[str, Any], record: ev.RunPaused) -> None:
    current["paused"] = {"at": record.time, "reason": record.data.reason}
    if record.data.workflow:
        current["paused"]["workflow"] = True


def _run_resumed(current: dict[str, Any], record: ev.RunResumed) -> None:
    current.pop("paused", None)


def _ended(current: dict[str, Any], status: str) -> None:
    current["status"] = status
    current.pop("paused", None)
    current.pop("queued", None)  # a run that ended while queued (skipped, cancelled...)
    current.pop("queued_keys", None)


def _run_completed(current: dict[str, Any], record: ev.RunCompleted) -> None:
    _ended(current, _COMPLETED)


def _run_failed(current: dict[str, Any], record: ev.RunFailed) -> None:
    _ended(current, _FAILED)
    current["error"] = {
        "class": record.data.error.error_class,
        "message": record.data.error.message,
    }


def _run_cancelled(current: dict[str, Any], record: ev.RunCancelled) -> None:
    _ended(current, _CANCELLED)


_UPDATES: dict[type, Callable[[dict[str, Any], Any], None]] = {
    ev.RunStarted: _run_started,
    ev.StateEntered: _state_entered,
    ev.RunForked: _run_forked,
    ev.RunMigrated: _run_migrated,
    ev.RunQueued: _run_queued,
    ev.RunAdmitted: _run_admitted,
    ev.RunPaused: _run_paused,
    ev.RunResumed: _run_resumed,
    ev.RunCompleted: _run_completed,
    ev.RunFailed: _run_failed,
    ev.RunCancelled: _run_cancelled,
    ev.RunContinued: _run_continued,
}
"""How each record an entry is made of changes it (beyond ``updated_at`` and ``seq``), by
the record's type: every record kind is a direct subclass of ``Record``."""
_INDEXED = frozenset(_UPDATES)
