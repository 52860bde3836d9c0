"""Failed attempts per capability over the last hour, read from the run logs.

At start the gateway reads back the last hour of the run logs (the RUNS stream from the
first message stored at or after the hour's start, by batched direct gets: no consumer,
and at most ``READ_BACK`` messages, the newest), and follows every append from then on with
one core NATS subscription (the same subjects its readers may read). It notes which
capability each requested action asks for and counts each ``action.failed`` record against
that capability, by the record's own time, keeping the last hour's. So the counts are the
same whichever gateway answers and however recently it started: they come from the logs,
not from what one process happened to see. A failure is counted once (by run, action and
attempt) however often it is read; one whose request is older than what was read back is
matched from the run's log. ``since`` says from when the counts are complete: the hour's
start, or, when the hour held more than ``READ_BACK`` messages, the first one read back
(the gateway's start until the read back is done).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from interlock.core import events as ev
from interlock.core.cel_text import plain_cel_error
from interlock.core.rfc3339 import format_time
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.clock import utc_now
from interlock.transport.logmac import LogKey
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.gateway.runlogs import RunLogs

log = logging.getLogger("interlock.gateway")

WINDOW_S = 3600.0
"""How far back failures are counted."""
REMEMBERED = 100_000
"""Requested actions remembered (their capability), the oldest forgotten first."""
KEPT = 10_000
"""Failures kept per capability within the window."""
READ_BACK = 50_000
"""Messages of the run logs read back at start at most (the newest of the window)."""
_BATCH = 1000
_TIMEOUT = 5.0


class LastFailure(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    action_id: str
    attempt: int
    error: str
    """The error's class (``timeout``, ``tool_error``...)."""
    message: str
    at: str
    will_retry: bool


class CapabilityFailures(msgspec.Struct, frozen=True, kw_only=True):
    capability: str
    failed: int
    """Failed attempts in the window (timeouts and failure answers; retried or not)."""
    last: LastFailure


class FailureReport(msgspec.Struct, frozen=True, kw_only=True):
    """Failed attempts per capability over the last ``window_s`` seconds, read from the run
    logs (complete from ``since`` when that is later than the window's start), most
    failures first."""

    since: str
    window_s: float
    capabilities: list[CapabilityFailures]


def _epoch(at: str) -> float:
    try:
        moment = datetime.fromisoformat(at)
    except ValueError:
        return time.time()
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class Failures:
    """Counts failed attempts per capability from the run logs: the last hour read back at
    start, then each append."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        logs: RunLogs,
        *,
        window_s: float = WINDOW_S,
        read_back: int = READ_BACK,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._logs = logs
        self._window = window_s
        self._read_back_max = read_back
        self._prefix = subjects.runs_all[:-1]
        self._asked: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._failed: dict[str, dict[tuple[str, str, int], tuple[float, LastFailure]]] = {}
        self._sub: Subscription | None = None
        self._lookups: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Task[None] | None = None
        self.since = utc_now()
        self.read_back = 0
        """Messages read back at start."""
        self._key: LogKey | None = None
        """The log key: only records that check out are counted (none until it is read)."""

    async def start(self) -> None:
        self.since = utc_now()
        # Following first: an append after the read back started is seen here if not there
        # (and counted once either way).
        self._sub = await self._nc.subscribe(self._subjects.runs_all, cb=self._on_append)
        self._reading = asyncio.create_task(self._read_back())

    async def settled(self) -> None:
        """Until the read back of the last hour is done."""
        if self._reading is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._reading)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        tasks = [*self._lookups, *([self._reading] if self._reading else [])]
        await cancel_and_wait(*tasks)

    # -- reading back ------------------------------------------------------------------------

    async def _direct_get(self, stream: str, request: dict[str, object]) -> Msg | None:
        api = f"{js_api(self._nc)}.DIRECT.GET.{stream}"
        msg = await self._nc.request(api, json.dumps(request).encode(), timeout=_TIMEOUT)
        status = (msg.headers or {}).get("Status")
        if status == "404":
            return None
        if status:
            raise RuntimeError(f"reading {stream} back: status {status}")
        return msg

    async def _read_back(self) -> None:
        # The log key first (before the window's last message is asked for: what is
        # appended after it is counted as it comes); asked again while it cannot be read
        # (no secrets bucket yet; a damaged key is reported where logs are read).
        while self._key is None:
            try:
                self._key = await self._logs.run_log.key()
            except Exception:  # noqa: BLE001
                await asyncio.sleep(2.0)
        try:
            await self._read_back_window()
        except Exception:  # the counts are then complete from the gateway's start only
            log.warning("could not read the last hour of the run logs back", exc_info=True)

    async def _read_back_window(self) -> None:
        began = time.time() - self._window
        start = format_time(datetime.fromtimestamp(began, UTC))
        found = await self._logs.run_log.placement.load()
        since = start
        for partition in range(found.streams):
            since = max(since, await self._read_back_stream(partition, start))
        self.since = since

    async def _read_back_stream(self, partition: int, start: str) -> str:
        """Read one partition's stream back from ``start``; from when its counts are
        complete."""
        stream = self._subjects.runs_stream_of(partition)
        subject = self._subjects.runs_all
        first = await self._direct_get(stream, {"start_time": start, "next_by_subj": subject})
        last = await self._direct_get(stream, {"last_by_subj": subject})
        if first is None or last is None:
            return start
        first_seq = int((first.headers or {})["Nats-Sequence"])
        last_seq = int((last.headers or {})["Nats-Sequence"])
        seq = max(first_seq, last_seq - self._read_back_max + 1)
        since, read = start, 0
        api = f"{js_api(self._nc)}.DIRECT.GET.{stream}"
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        try:
            while seq <= last_seq:
                batch = min(_BATCH, last_seq - seq + 1)
                request = {"seq": seq, "next_by_subj": subject, "batch": batch}
                await self._nc.publish(api, json.dumps(request).encode(), reply=inbox)
                got = 0
                while True:
                    msg = await sub.next_msg(timeout=_TIMEOUT)
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status in ("204", "404"):
                        break
                    if status:
                        raise RuntimeError(f"reading {subject} back: status {status}")
                    at = int(headers["Nats-Sequence"])
                    if at > last_seq:
                        continue  # appended since: the subscription counts it
                    if read == 0 and at > first_seq:
                        # More than READ_BACK messages in the hour: complete from here.
                        stamp = headers.get("Nats-Time-Stamp")
                        since = format_time(datetime.fromisoformat(stamp)) if stamp else start
                    self.read_back += 1
                    read += 1
                    got += 1
                    seq = at + 1
                    # Only the first partition holds messages from before the log key.
                    signed_at = at if partition == 0 else None
                    self._take(headers.get("Nats-Subject", ""), msg.data, headers, signed_at)
                if got < batch or status == "404":
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return since

    # -- counting -----------------------------------------------------------------------------

    async def _on_append(self, msg: Msg) -> None:
        self._take(msg.subject, msg.data, msg.headers, None)

    def _take(
        self, subject: str, data: bytes, headers: dict[str, str] | None, seq: int | None
    ) -> None:
        """Count what ``data`` (a run-log message, at stream sequence ``seq`` when read back;
        None: appended just now) says, when it is records Interlock wrote."""
        if not subject.startswith(self._prefix) or self._key is None:
            return
        # A message from before the key (read back) is counted when it decodes.
        signed = seq is None or seq > self._key.signed_after
        if signed and self._key.refusal(subject, headers, data) is not None:
            return  # foreign: reported by the readers of its log, counted nowhere
        run_id = subject.rpartition(".")[2]  # in any partition
        try:
            records = ev.decode_batch(data)
        except Exception:  # noqa: BLE001 - not a batch of records: not ours to judge
            return
        for record in records:
            if isinstance(record, ev.ActionRequested) and record.data.workflow is None:
                self._asked[(run_id, record.data.action_id)] = record.data.capability
                self._asked.move_to_end((run_id, record.data.action_id))
                while len(self._asked) > REMEMBERED:
                    self._asked.popitem(last=False)
            elif isinstance(record, ev.ActionFailed):
                capability = self._asked.get((run_id, record.data.action_id))
                if capability is not None:
                    self._count(capability, run_id, record)
                elif len(self._lookups) < 100:
                    task = asyncio.create_task(self._look_up(run_id, record))
                    self._lookups.add(task)
                    task.add_done_callback(self._lookups.discard)

    async def _look_up(self, run_id: str, failed: ev.ActionFailed) -> None:
        """The capability of an action asked for before what was read: from the log."""
        try:
            cached = await self._logs.log(run_id)
        except Exception:  # noqa: BLE001 - a failure not counted is better than none read
            log.debug("failure of %s/%s: its request was not found", run_id, failed.data.action_id)
            return
        for record in cached.records:
            if (
                isinstance(record, ev.ActionRequested)
                and record.data.action_id == failed.data.action_id
                and record.data.workflow is None
            ):
                self._count(record.data.capability, run_id, failed)
                return

    def _count(self, capability: str, run_id: str, record: ev.ActionFailed) -> None:
        d = record.data
        at = _epoch(record.time)
        if at < time.time() - self._window:
            return
        last = LastFailure(
            run_id=run_id,
            action_id=d.action_id,
            attempt=d.attempt,
            error=d.error.error_class,
            message=plain_cel_error(d.error.message),
            at=record.time,
            will_retry=d.will_retry,
        )
        kept = self._failed.setdefault(capability, {})
        key = (run_id, d.action_id, d.attempt)
        if key not in kept and len(kept) >= KEPT:
            self._expire(kept)
            if len(kept) >= KEPT:
                del kept[min(kept, key=lambda k: kept[k][0])]
        kept[key] = (at, last)

    def _expire(self, kept: dict[tuple[str, str, int], tuple[float, LastFailure]]) -> None:
        cut = time.time() - self._window
        for key in [k for k, (at, _) in kept.items() if at < cut]:
            del kept[key]

    def report(self) -> FailureReport:
        out = []
        for capability, kept in list(self._failed.items()):
            self._expire(kept)
            if not kept:
                del self._failed[capability]
                continue
            _, last = max(kept.values(), key=lambda v: v[0])
            out.append(CapabilityFailures(capability=capability, failed=len(kept), last=last))
        out.sort(key=lambda c: (-c.failed, c.capability))
        return FailureReport(since=self.since, window_s=self._window, capabilities=out)
