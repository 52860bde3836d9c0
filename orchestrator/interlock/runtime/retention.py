"""Retention: a finished run is deleted once it is older than its workflow's ``retention``
(or the installation's default), its log archived first where an ``archive`` is set.

No sweep over the runs: when the relay sees a run end it schedules a durable timer (the
TIMERS stream's message scheduling, as for any timer) for the moment the run's retention
runs out, with the timer id ``<run id>:retention``. When it fires, :func:`delete_run`:

1. reads the run's log and refuses a run that has not ended (deleting never touches a
   live run; an ended run gets no more records);
2. writes the log, in the format of ``interlock export`` (payloads kept by reference
   loaded into their places), to the archive (an Object Store bucket, or a directory of
   the orchestrator's host), replacing a copy left by an attempt that was cut short;
3. records the deletion in the audit stream (``<prefix>.audit.deleted.<run id>``, with a
   message id, so a repeated attempt records it once);
4. purges the run's subject from the run-log stream, then deletes the run's objects
   (the payloads its log references, which the audit record names, so a repetition after
   the purge still finds them), then its run-index entry and its snapshot.

Each step can be repeated, and the timer's message is acknowledged only after the last,
so a process killed anywhere leaves the timer to fire again and finish the work: nothing
is deleted before it is archived, and a run is never half-deleted for good. A run whose
log is empty already (a repetition after the purge) only has its index entry removed.
``interlock runs delete`` calls the same function for one run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError

from interlock.core import events as ev
from interlock.core.definition import ArchiveDef, Definition
from interlock.core.objects import ObjectRef
from interlock.core.rfc3339 import parse_time
from interlock.core.state import RunState, fold
from interlock.core.step import plus_seconds, seconds_text
from interlock.core.vocabulary import FINISHED, RunStatus
from interlock.runtime.errors import RunNotEnded, UnknownWorkflow
from interlock.runtime.logstore import LogStore, RunLog
from interlock.runtime.payloads import Payloads, run_objects
from interlock.transport.jetstream import jetstream
from interlock.transport.kvbatch import delete_key
from interlock.transport.objects import Objects
from interlock.transport.streamconfigs import MARKER_KEPT_S
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.runtime.registry import Registry
    from interlock.runtime.timers import Timers

log = logging.getLogger("interlock.retention")

RETENTION = "retention"
"""The last part of a retention timer's id (``<run id>:retention``)."""


def retention_timer(run_id: str) -> str:
    """The id of the timer that deletes ``run_id`` when its retention runs out."""
    return f"{run_id}:{RETENTION}"


def is_retention_timer(run_id: str, timer_id: str) -> bool:
    return timer_id == retention_timer(run_id)


@dataclass(frozen=True, slots=True)
class Policy:
    """The installation's defaults, for workflows that set no ``retention`` / ``archive``."""

    retention_s: float | None = None
    archive: ArchiveDef | None = None

    def of(self, definition: Definition | None) -> tuple[float | None, ArchiveDef | None]:
        """How long runs of ``definition`` are kept (None: forever), and their archive."""
        if definition is None:
            return self.retention_s, self.archive
        kept = definition.retention_s if definition.retention_s is not None else self.retention_s
        return kept, definition.archive or self.archive

    @property
    def may_apply(self) -> bool:
        """Whether any run could be deleted without its workflow saying so."""
        return self.retention_s is not None


@dataclass(frozen=True, slots=True)
class Deleted:
    """What :func:`delete_run` did."""

    run_id: str
    records: int
    """Records deleted (0: the log was gone already)."""
    archived_to: str | None
    status: str | None
    chain: tuple[str, ...] = ()
    """Every run deleted with it, first to last, when it was one of a chain of runs
    continued as new (its records and status are then the chain's)."""


def audit_entry(
    run_id: str,
    records: list[ev.AnyRecord],
    *,
    by: str,
    reason: str,
    archived_to: str | None,
    objects: Sequence[ObjectRef] = (),
) -> dict[str, Any]:
    state = fold(records)
    return {
        "action": "run.deleted",
        "run_id": run_id,
        "namespace": state.namespace,
        "workflow": state.workflow,
        "version": state.version,
        "status": state.status,
        "ended_at": records[-1].time if records else None,
        "records": len(records),
        "by": by,
        "reason": reason,
        "archived_to": archived_to,
        "objects": [{"bucket": o.bucket, "name": o.name, "size": o.size} for o in objects],
    }


def export_lines(records: list[ev.AnyRecord]) -> bytes:
    """A log in the format of ``interlock export``: one CloudEvent per line."""
    return b"".join(ev.encode(record) + b"\n" for record in records)


async def archive_log(
    nc: Client, run_id: str, records: list[ev.AnyRecord], archive: ArchiveDef
) -> str:
    """Write the run's log to ``archive``; where it went (``bucket/object`` or a path)."""
    data = export_lines(records)
    name = f"{run_id}.jsonl"
    if archive.bucket is not None:
        js = jetstream(nc)
        try:
            store = await js.object_store(archive.bucket)
        except (BucketNotFoundError, NotFoundError):
            store = await js.create_object_store(archive.bucket)
        await store.put(name, data)
        return f"{archive.bucket}/{name}"
    assert archive.directory is not None
    return await asyncio.to_thread(_write_file, Path(archive.directory), name, data)


def _write_file(folder: Path, name: str, data: bytes) -> str:
    """Write ``data`` to ``folder/name`` whole or not at all (a file beside it, synced, then
    renamed over it)."""
    folder = folder.expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{name}.", delete=False) as tmp:
        tmp.write(data)
        tmp.flush()
        os.fsync(tmp.fileno())
    Path(tmp.name).replace(target)
    return str(target)


async def delete_run(
    nc: Client,
    subjects: Subjects,
    log: LogStore,
    run_id: str,
    *,
    by: str,
    reason: str,
    archive: ArchiveDef | None,
    records: list[ev.AnyRecord] | None = None,
) -> Deleted:
    """Archive (where ``archive`` says), record in the audit stream, and delete one ended
    run: its log, its objects (payloads kept by reference) and its run-index entry. Raises
    :class:`RunNotEnded` for a run that has not ended (nothing is touched). Repeating it
    after a crash finishes the work. ``records``: the run's log as just read (else it is
    read here)."""
    if records is None:
        records, _ = await log.read(run_id, consistent=True)
    js = jetstream(nc)
    status = fold(records).status if records else None
    if records and status not in FINISHED:
        raise RunNotEnded(run_id, str(status))
    archived_to = None
    objects = Objects(nc)
    if records:
        refs = await run_objects(subjects, records, run_id)
        if archive is not None:
            # The archive holds the payloads themselves: it replays with no server.
            loaded = await Payloads(objects, subjects).loaded(records) if refs else records
            archived_to = await archive_log(nc, run_id, loaded, archive)
        entry = audit_entry(
            run_id, records, by=by, reason=reason, archived_to=archived_to, objects=refs
        )
        await js.publish(
            subjects.audit_deleted(run_id),
            json.dumps(entry, separators=(",", ":")).encode(),
            headers={"Nats-Msg-Id": f"deleted:{run_id}"},
        )
        stream, subject = (
            await log.where(run_id)
            if isinstance(log, RunLog)
            else (subjects.runs_stream, subjects.run(run_id))
        )
        await js.purge_stream(stream, subject=subject)
    else:  # a repetition after the purge: the objects the audit record names
        refs = await _audited_objects(js, subjects, run_id)
    for ref in refs:
        await objects.delete(ref)
    await delete_key(await js.key_value(subjects.runs_bucket), run_id, kept_s=MARKER_KEPT_S)
    await js.purge_stream(
        f"KV_{subjects.runs_bucket}", subject=f"$KV.{subjects.runs_bucket}.L.*.*.*.{run_id}"
    )
    await delete_key(await js.key_value(subjects.snapshots_bucket), run_id, kept_s=MARKER_KEPT_S)
    return Deleted(run_id, len(records), archived_to, None if status is None else str(status))


async def _audited_objects(js: Any, subjects: Subjects, run_id: str) -> list[ObjectRef]:
    """The objects the audit record of the run's deletion names (none: no record)."""
    try:
        msg = await js.get_last_msg(subjects.audit_stream, subjects.audit_deleted(run_id))
    except NotFoundError:
        return []
    named = json.loads(msg.data).get("objects", [])
    # Deleting needs no digest: any one of the right shape names the object.
    return [
        ObjectRef(bucket=o["bucket"], name=o["name"], size=o.get("size", 0), digest="")
        for o in named
    ]


async def chain_of(log: LogStore, run_id: str) -> list[tuple[str, list[ev.AnyRecord]]]:
    """Every run of ``run_id``'s chain of runs continued as new, with its log, first to
    last (``run_id`` alone when it is in none; a run whose log is gone ends the walk)."""
    records, _ = await log.read(run_id, consistent=True)
    links = [(run_id, records)]
    state = fold(records) if records else None
    chain = None if state is None else state.chain
    previous = None if chain is None else chain.previous
    while previous is not None:
        before, _ = await log.read(previous, consistent=True)
        if not before:
            break  # deleted already, by an attempt cut short (the first runs go first)
        links.insert(0, (previous, before))
        earlier = fold(before).chain
        previous = None if earlier is None else earlier.previous
    nxt = None if chain is None else chain.next
    while nxt is not None:
        after, _ = await log.read(nxt, consistent=True)
        if not after:
            break  # not started yet
        links.append((nxt, after))
        later = fold(after).chain
        nxt = None if later is None else later.next
    return links


async def delete_chain(
    nc: Client,
    subjects: Subjects,
    log: LogStore,
    run_id: str,
    *,
    by: str,
    reason: str,
    archive: ArchiveDef | None,
    links: list[tuple[str, list[ev.AnyRecord]]] | None = None,
) -> Deleted:
    """:func:`delete_run` of ``run_id`` and, when it is one of a chain of runs continued
    as new, of every run of the chain, first to last, once the last has ended (else
    :class:`RunNotEnded`, nothing touched). A repetition after a crash finds the runs not
    deleted yet: the first ones go first, and the walk back stops at one gone."""
    links = links if links is not None else await chain_of(log, run_id)
    if len(links) == 1:
        return await delete_run(
            nc, subjects, log, run_id, by=by, reason=reason, archive=archive, records=links[0][1]
        )
    last_id, last = links[-1]
    status = fold(last).status
    if status not in FINISHED or status == RunStatus.CONTINUED:
        raise RunNotEnded(run_id, str(status), newest=last_id)
    done = [
        await delete_run(
            nc, subjects, log, link, by=by, reason=reason, archive=archive, records=records
        )
        for link, records in links
    ]
    return Deleted(
        run_id,
        sum(d.records for d in done),
        done[-1].archived_to,
        str(status),
        tuple(link for link, _ in links),
    )


class Retainer:
    """The orchestrator's side: schedules each ended run's deletion, and deletes it when
    its timer fires (see the module's docstring)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        log: LogStore,
        registry: Registry,
        timers: Timers,
        clock: Callable[[], str],
        policy: Policy,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._log = log
        self._registry = registry
        self._timers = timers
        self._clock = clock
        self.policy = policy

    @property
    def active(self) -> bool:
        """Whether a run's end may need a deletion scheduled (else nothing is looked up)."""
        return self.policy.may_apply or self._registry.retaining

    async def _kept(self, state: RunState) -> tuple[float | None, ArchiveDef | None]:
        try:
            definition = await self._registry.definition(
                state.namespace, state.workflow, state.version
            )
        except UnknownWorkflow:
            definition = None
        return self.policy.of(definition)

    async def ended(self, run_id: str, ended_at: str, state: RunState) -> None:
        """A run ended at ``ended_at``: its deletion scheduled, if it is not kept forever.
        A run that continued as new is deleted with its chain, once its last run ends."""
        if state.status == RunStatus.CONTINUED:
            return
        kept, _ = await self._kept(state)
        if kept is not None:
            await self._timers.schedule(
                run_id, retention_timer(run_id), plus_seconds(ended_at, kept)
            )

    async def due(self, run_id: str) -> Deleted | None:
        """The run's retention timer fired: delete it if it has ended and is still past its
        retention (which may have changed since it was scheduled); None when kept."""
        records, _ = await self._log.read(run_id, consistent=True)
        if not records:
            return await delete_run(
                self._nc,
                self._subjects,
                self._log,
                run_id,
                records=[],
                by="retention",
                reason="retention",
                archive=None,
            )
        state = fold(records)
        if state.status not in FINISHED or state.status == RunStatus.CONTINUED:
            # (A run that continued is deleted with its chain, by its last run's timer.)
            log.warning("retention: run %s is %s, not ended: kept", run_id, state.status)
            return None
        kept, archive = await self._kept(state)
        if kept is None:
            return None
        due = plus_seconds(records[-1].time, kept)
        if parse_time(due) > parse_time(self._clock()):
            await self._timers.schedule(run_id, retention_timer(run_id), due)
            return None
        deleted = await delete_chain(
            self._nc,
            self._subjects,
            self._log,
            run_id,
            by="retention",
            reason=f"retention {seconds_text(kept)}",
            archive=archive,
        )
        log.info(
            "retention: deleted run %s (%d records%s)",
            run_id,
            deleted.records,
            f"; with its chain {', '.join(deleted.chain)}" if deleted.chain else "",
        )
        return deleted
