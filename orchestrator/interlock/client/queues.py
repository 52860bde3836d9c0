"""The concurrency limits as the orchestrator keeps them (the slots bucket): where a queued
run stands, and every limit and key's runs holding and waiting."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import msgspec

from interlock.client import capqueues
from interlock.core.limitdef import capacity_names
from interlock.core.names import WORKFLOW_REF
from interlock.core.pauses import PAUSED, check_reason
from interlock.core.rfc3339 import format_time
from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient
from interlock.runtime.concurrency import SlotEntry, Slots
from interlock.runtime.errors import UnknownWorkflow
from interlock.runtime.pausing import Pauses
from interlock.runtime.triggerstate import rate_entries, scan_windows
from interlock.runtime.versions import StoredWorkflow
from interlock.transport.clock import utc_now
from interlock.views.queueshape import QueueView
from interlock.views.shapes import RunDescription, SlotView

PLACE_SEGMENTS = 100
"""The segments of a line read for a run's place at most (20,000 waiters): a reader's
description of a run deep in a line a publisher's flood made read every segment before
it, at every request. Past them the place is not said (None)."""


async def with_places(
    ops: InterlockClient, described: RunDescription, state: RunState
) -> RunDescription:
    """``described`` with each slot of a queued run saying whether the run holds it, or
    its place in line (within the first :data:`PLACE_SEGMENTS` segments), and how many
    runs hold one (as the orchestrator keeps them)."""
    if not state.queued or not described.slots:
        return described
    slots = Slots(ops.nc, ops.subjects)
    fair = {(c.limit, c.key): c.fair for c in state.slots or []}
    seen: list[SlotView] = []
    for view in described.slots:
        paused_workflow = view.limit.endswith(PAUSED) and not view.limit.startswith("cap:")
        if paused_workflow and not await _still_paused(ops, view.limit):
            seen.append(msgspec.structs.replace(view, holding=True))  # resumed: past it
            continue
        lines = await slots.lines(view.limit, view.key)
        if lines is None:
            seen.append(msgspec.structs.replace(view, running=0))
            continue
        holding = lines.entry.holds(state.run_id)
        place = (
            None
            if holding
            else await lines.place(
                state.run_id, fair.get((view.limit, view.key), ""), segments=PLACE_SEGMENTS
            )
        )
        seen.append(
            msgspec.structs.replace(
                view, holding=holding, place=place, running=len(lines.entry.holders)
            )
        )
    return msgspec.structs.replace(described, slots=seen)


async def _still_paused(ops: InterlockClient, limit: str) -> bool:
    """Whether the workflow of a pause slot (``<namespace>/<name>@paused``) is paused now."""
    namespace, _, name = limit.removesuffix(PAUSED).partition("/")
    return await Pauses(ops.nc, ops.subjects).paused(namespace, name) is not None


async def list_queues(
    ops: InterlockClient, workflow: str | None = None, capability: str | None = None
) -> list[QueueView]:
    """Every concurrency limit and key with a run or a request holding or waiting, every
    capability's rate with tokens out or requests waiting, every paused workflow and
    capability, and the triggers' windows and rates, sorted by limit then key; with
    ``workflow`` (``name`` or ``namespace/name``), the limits it declares; with
    ``capability``, that capability's limits (each one, waited for or not)."""
    return (await _read(ops, workflow, capability, None, None)).lines()


async def queue_page(
    ops: InterlockClient,
    workflow: str | None = None,
    capability: str | None = None,
    *,
    limit: int,
    after: tuple[str, str] | None = None,
) -> tuple[list[QueueView], tuple[str, str] | None]:
    """:func:`list_queues` a page at a time: the first ``limit`` lines past ``after`` (a
    limit and key), and where the next page starts (None: this is the last). What is
    kept while reading is bounded by ``limit``; every line is read to find them."""
    kept = await _read(ops, workflow, capability, after, limit)
    page = kept.lines()
    if not kept.more():
        return page, None
    # (A page emptied by lines gone while it was read goes on from where it began.)
    return page, (page[-1].limit, page[-1].key) if page else (after or ("", ""))


def page_token(after: tuple[str, str]) -> str:
    """The text that names where a page starts (``--after``, ``?after=``): the limit and
    the key, each as the hex of its UTF-8, joined by a dot."""
    return ".".join(part.encode().hex() for part in after)


MAX_TOKEN = 4096
"""The longest page token read (a limit's name and a key of 256 characters)."""
TOKEN = re.compile(r"^(?:[0-9a-f]{2})*\.(?:[0-9a-f]{2})*$")
"""What a page token is (any such text names a place: lines sort after it)."""


def read_page_token(token: str) -> tuple[str, str] | None:
    """The limit and key a page token names; None when it is no page token."""
    if len(token) > MAX_TOKEN or not TOKEN.match(token):
        return None
    limit, _, key = token.partition(".")
    return (
        bytes.fromhex(limit).decode(errors="replace"),
        bytes.fromhex(key).decode(errors="replace"),
    )


async def _read(
    ops: InterlockClient,
    workflow: str | None,
    capability: str | None,
    after: tuple[str, str] | None,
    most: int | None,
) -> Kept:
    now = datetime.now(UTC)
    paused = await capqueues.paused_now(ops)
    names: set[str] | None = None
    if workflow is not None:
        names = await limit_names(ops, workflow)
    if capability is not None:
        await capqueues.declared(ops, capability)  # (UnknownAgent when none declares it)
        concurrency, rate = capacity_names(capability)
        own = {concurrency, rate, f"{concurrency}{PAUSED}"}
        names = own if names is None else names & own
    kept = Kept(names, after, most)
    # Each entry's line as it is read: an entry outlines up to 256 lines of keys a
    # publisher names, and the bucket is read a bounded batch at a time.
    async for token, e in Slots(ops.nc, ops.subjects).scan():
        line = None if e is None else capqueues.annotated(queue_view(e, now), e, now, paused)
        kept.offer(token, line)
    for i, view in enumerate(await trigger_views(ops, now)):
        kept.offer(f"trigger {i}", capqueues.annotated(view, None, now, paused))
    shown = list(kept.firsts.values())
    extra = capqueues.pause_lines(shown, paused)
    if capability is not None:
        mine = [*shown, *extra]
        extra += [
            v for v in await capqueues.capability_lines(ops, capability, mine) if v not in mine
        ]
    for i, view in enumerate(extra):
        kept.offer(f"added {i}", view)
    return kept


class Kept:
    """The lines a listing keeps as it reads: those of the limits ``names`` (None: all),
    past ``after``, the first ``most`` of them (None: all) in limit then key order; and
    the first line of each limit seen (what says which limits have lines)."""

    def __init__(
        self, names: set[str] | None, after: tuple[str, str] | None, most: int | None
    ) -> None:
        self._names, self._after, self._most = names, after, most
        self._lines: dict[str, QueueView] = {}
        self._cut = False
        """Whether lines past the first were let go (the page is not the last)."""
        self.firsts: dict[str, QueueView] = {}

    def offer(self, token: str, view: QueueView | None) -> None:
        """The line read for ``token`` now (None: gone)."""
        if view is None or (self._names is not None and view.limit not in self._names):
            self._lines.pop(token, None)
            return
        self.firsts.setdefault(view.limit, view)
        if self._after is not None and (view.limit, view.key) <= self._after:
            self._lines.pop(token, None)
            return
        self._lines[token] = view
        if self._most is not None and len(self._lines) > 2 * (self._most + 1):
            first = sorted(self._lines.items(), key=lambda item: _order(item[1]))
            self._lines, self._cut = dict(first[: self._most + 1]), True

    def lines(self) -> list[QueueView]:
        found = sorted(self._lines.values(), key=_order)
        return found if self._most is None else found[: self._most]

    def more(self) -> bool:
        """Whether lines past the first ``most`` were read."""
        return self._most is not None and (self._cut or len(self._lines) > self._most)


def _order(view: QueueView) -> tuple[str, str]:
    return view.limit, view.key


async def trigger_views(ops: InterlockClient, now: datetime) -> list[QueueView]:
    """The triggers' open windows (``<trigger>@debounce``, ``@batch``: the events
    gathered, since the first came) and rates (``<trigger>@rate``: the runs started in
    the last ``per``, of its ``limit``, the runs waiting their turn, and since when the
    first of them waits)."""
    windows: dict[str, QueueView] = {}
    # Each window's line as it is read, not the window: a batch's keeps its every event.
    async for token, entry in scan_windows(ops.js, ops.subjects):
        if entry is None:
            windows.pop(token, None)
            continue
        window = entry.open or entry.sealed
        assert window is not None
        waited = _waited(now, datetime.fromisoformat(window.opened_at))
        windows[token] = QueueView(
            limit=f"{entry.trigger}@{entry.kind}",
            key=entry.key,
            running=0,
            size=0,
            queued=window.count,
            oldest_queued_at=window.opened_at,
            oldest_wait_s=waited,
        )
    out = list(windows.values())
    now_ms = int(now.timestamp() * 1000)
    for rate in await rate_entries(ops.js, ops.subjects):
        queued, since = rate.line(now_ms)
        first = None if since is None else datetime.fromtimestamp(since / 1000, tz=UTC)
        out.append(
            QueueView(
                limit=f"{rate.trigger}@rate",
                key=rate.key,
                running=rate.running(now_ms),
                size=rate.limit,
                queued=queued,
                oldest_queued_at=None if first is None else format_time(first),
                oldest_wait_s=None if first is None else _waited(now, first),
            )
        )
    return out


def _waited(now: datetime, since: datetime) -> float:
    return round(max((now - since).total_seconds(), 0.0), 3)


def queue_view(entry: SlotEntry, now: datetime) -> QueueView:
    first = entry.oldest
    waited = None
    if first is not None:
        waited = max((now - datetime.fromisoformat(first)).total_seconds(), 0.0)
    return QueueView(
        limit=entry.limit,
        key=entry.key,
        running=len(entry.holders),
        size=entry.size,
        queued=entry.queued,
        oldest_queued_at=first,
        oldest_wait_s=None if waited is None else round(waited, 3),
    )


async def limit_names(ops: InterlockClient, workflow: str) -> set[str]:
    """The names of the limits the latest version of ``workflow`` declares (read from its
    stored manifest: nothing is compiled). Raises UnknownWorkflow."""
    stored = await _stored(ops, workflow)
    spec = stored.manifest.get("spec") or {}
    out = {f"{stored.namespace}/{stored.name}{PAUSED}"}
    for i, limit in enumerate(spec.get("concurrency") or []):
        scope = limit.get("scope") if isinstance(limit, dict) else None
        out.add(f"{stored.namespace}/{scope or f'{stored.name}#{i + 1}'}")
    for i, trigger in enumerate(spec.get("triggers") or []):
        for kind in ("debounce", "batch", "rate"):
            if isinstance(trigger, dict) and trigger.get(kind):
                out.add(f"{stored.namespace}/{stored.name}#trigger{i + 1}@{kind}")
    return out


async def pause_workflow(
    ops: InterlockClient, workflow: str, reason: str, *, runs: bool = False
) -> tuple[str, list[str], dict[str, Any] | None]:
    """Pause a workflow (its new runs wait until it is resumed) and, with ``runs``, its
    runs in flight (each paused with it); its ``namespace/name``, the runs paused, and the
    pause already in force (kept as it is; None: this call paused it). Raises
    UnknownWorkflow; ValueError for a reason over 1,024 characters (nothing is sent)."""
    check_reason(reason)
    stored = await _stored(ops, workflow)
    name = f"{stored.namespace}/{stored.name}"
    pauses = Pauses(ops.nc, ops.subjects)
    already = await pauses.pause(stored.namespace, stored.name, utc_now(), reason, runs=runs)
    paused: list[str] = []
    if runs:
        for item in await ops.list_runs(workflow=name, status="running"):
            run_id = str(item.get("run_id", ""))
            if await ops.pause_run(run_id, reason, workflow=True):
                paused.append(run_id)
    return name, paused, already


async def resume_workflow(ops: InterlockClient, workflow: str) -> tuple[str, bool, list[str]]:
    """Resume a workflow, and the runs paused with it: its ``namespace/name``, whether it
    was paused, and the runs resumed."""
    stored = await _stored(ops, workflow)
    name = f"{stored.namespace}/{stored.name}"
    pauses = Pauses(ops.nc, ops.subjects)
    pause = await pauses.paused(stored.namespace, stored.name) or {}
    removed = utc_now()
    done = await pauses.resume(stored.namespace, stored.name)
    resumed: list[str] = []
    # The orchestrators resume the runs they paused with it as they see the pause removed
    # (those the run list misses included): each run paused with it is resumed once, by
    # whichever comes first, and said here.
    for item in await ops.list_runs(workflow=name, status="running"):
        run_id = str(item.get("run_id", ""))
        state = await ops.state(run_id)
        if state.paused is not None and state.paused.workflow:
            if await ops.resume_run(run_id) or (await ops.state(run_id)).paused is None:
                resumed.append(run_id)
        elif done and pause.get("runs") and _resumed_since(await ops.read(run_id), removed):
            resumed.append(run_id)
    return name, done, resumed


def _resumed_since(records: list[Any], removed: str) -> bool:
    """Whether the run's last pause was with its workflow and ended at or after
    ``removed`` (its orchestrator resumed it as it saw the workflow resumed)."""
    from interlock.core import events as ev
    from interlock.core.rfc3339 import parse_time

    pause: Any = None
    for record in records:
        if isinstance(record, ev.RunPaused):
            pause = record
        elif isinstance(record, ev.RunResumed) and pause is not None:
            if pause.data.workflow and parse_time(record.time) >= parse_time(removed):
                return True
            pause = None
    return False


async def _stored(ops: InterlockClient, workflow: str) -> StoredWorkflow:
    if not WORKFLOW_REF.match(workflow):
        raise UnknownWorkflow(f"no workflow {workflow!r}: not NAME or NAMESPACE/NAME")
    return await ops.registry.stored_latest(workflow)
