"""Paused workflows: the new runs of a paused workflow wait until it is resumed.

The pauses bucket (``<prefix>_paused``) holds one key per paused workflow,
``wf.<namespace>.<name>``, written by ``interlock pause workflow`` (``POST
/workflows/{name}/pause``) and deleted by ``resume``. Whoever starts a run reads it (the
CLI and the gateway by one direct get, an orchestrator from the copy its watch keeps), and
a run started while its workflow is paused records ``run.queued`` with the slot
``<namespace>/<name>@paused`` first (:func:`interlock.core.limits.pause_claim`, size 0:
nobody ever holds it). The orchestrator puts such a run in that slot's line while the
workflow is paused; when the workflow is resumed, every orchestrator that sees it (its
watch) takes the runs out of that line and on, to their concurrency limits and their
admission, in order. A run whose ``run.queued`` is read after the resumption goes on at
once. Runs already admitted are not held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from interlock.core.vocabulary import InterlockError
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import jetstream
from interlock.transport.kvread import named_bucket_values
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.core import events as ev
    from interlock.core.definition import Definition
    from interlock.core.state import RunState

log = logging.getLogger("interlock.pausing")

Resumed = Callable[[str, str], Awaitable[None]]
"""Told (namespace, name) of a workflow resumed."""
CapabilityResumed = Callable[[str], Awaitable[None]]
"""Told the name of a capability resumed."""
_TIMEOUT = 5.0
CAPABILITY = "cap."
"""How a paused capability's key begins (``cap.<name>``; a workflow's is ``wf.``)."""


DAMAGED = "its stored pause is damaged: held as paused until resumed"
"""The reason shown for a pause whose value does not decode."""


def pause_key(namespace: str, name: str) -> str:
    return f"wf.{namespace}.{name}"


def capability_key(name: str) -> str:
    return f"{CAPABILITY}{name}"


class Pauses:
    """The pauses bucket: one workflow's pause read, written or removed; or, in an
    orchestrator, every pause followed by a watch."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._js = jetstream(nc)
        self._subjects = subjects
        self._kv: Any = None
        self._held: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._watched_from: datetime | None = None
        """When the watch began: a workflow not paused then had no pause before."""
        self._resumed_at: dict[str, datetime] = {}
        """When the watch saw each workflow's pause removed (its resumption)."""
        self._paused_here: dict[str, set[str]] = {}
        """The runs this process paused with their workflow, by workflow."""

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.paused_bucket)
        return self._kv

    def _pause_of(self, key: str, value: bytes | None, revision: int = 0) -> dict[str, Any]:
        """The pause ``value`` says (:func:`pause_of`); a damaged one reported (once per
        revision of its key)."""
        pause, damaged = pause_of(value)
        if damaged:
            from interlock.runtime.foreign import foreign_value

            bucket = self._subjects.paused_bucket
            foreign_value(bucket, key, damaged, revision, kept="read as a pause until resumed")
        return pause

    async def paused(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pause of a workflow (when and why), None when it is not paused."""
        return await self._read(pause_key(namespace, name))

    async def _read(self, key: str) -> dict[str, Any] | None:
        """One key's pause by one direct get of its subject (no bucket handle: binding one
        is a stream info request more, on every run started)."""
        bucket = self._subjects.paused_bucket
        api = f"{js_api(self._nc)}.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}"
        try:
            msg = await self._nc.request(api, b"", timeout=_TIMEOUT)
        except NoRespondersError:  # no bucket: made by a later version
            return None
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "404" or headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        if status:
            raise InterlockError(f"reading {bucket}/{key}: status {status}")
        return self._pause_of(key, msg.data, int(headers.get("Nats-Sequence") or 0))

    async def _values(self) -> dict[str, bytes]:
        """Every key's value: one stream info request, and direct gets when there are any."""
        try:
            return await named_bucket_values(self._js, self._subjects.paused_bucket)
        except NotFoundError:  # no bucket: made by a later version
            return {}

    async def pause(
        self, namespace: str, name: str, at: str, reason: str, *, runs: bool = False
    ) -> dict[str, Any] | None:
        """Pause a workflow; the pause already in force (kept: since when and why; asked
        with ``runs`` where it had none, its runs are paused from now on too), or None when
        this call paused it."""
        pause = {"workflow": f"{namespace}/{name}", "at": at, "reason": reason, "runs": runs}
        key = pause_key(namespace, name)
        kv = await self._bucket()
        try:
            await kv.create(key, json.dumps(pause).encode())
        except KeyWrongLastSequenceError:
            found = await self._read(key)
            if found is not None and not found.get("damaged"):
                if runs and not found.get("runs"):
                    await kv.put(key, json.dumps({**found, "runs": True}).encode())
                return found
            await kv.put(key, json.dumps(pause).encode())  # resumed meanwhile, or damaged
        return None

    async def every(self) -> dict[str, dict[str, Any]]:
        """Every paused workflow (``namespace/name``) with its pause, in one read."""
        values = await self._values()
        out = {}
        for key, value in values.items():
            pause = self._pause_of(key, value)
            if pause is not None and not key.startswith(CAPABILITY):
                out[key.removeprefix("wf.").replace(".", "/", 1)] = pause
        return out

    async def resume(self, namespace: str, name: str) -> bool:
        """Remove the pause; False when the workflow was not paused."""
        return await self._remove(pause_key(namespace, name))

    async def _remove(self, key: str) -> bool:
        if await self._read(key) is None:
            return False
        await (await self._bucket()).delete(key)
        return True

    async def capability_paused(self, name: str) -> dict[str, Any] | None:
        """The pause of a capability (when and why), None when it is not paused."""
        return await self._read(capability_key(name))

    async def pause_capability(self, name: str, at: str, reason: str) -> dict[str, Any] | None:
        """Pause a capability; the pause already in force (kept as it is: since when and
        why), or None when this call paused it."""
        body = json.dumps({"capability": name, "at": at, "reason": reason}).encode()
        key = capability_key(name)
        kv = await self._bucket()
        try:
            await kv.create(key, body)
        except KeyWrongLastSequenceError:
            found = await self._read(key)
            if found is not None and not found.get("damaged"):
                return found
            await kv.put(key, body)  # resumed meanwhile, or damaged: written over
        return None

    async def resume_capability(self, name: str) -> bool:
        """Remove the capability's pause; False when it was not paused."""
        return await self._remove(capability_key(name))

    async def all_paused(self) -> dict[str, dict[str, Any]]:
        """Every pause now, by key (``wf.<namespace>.<name>``, ``cap.<name>``)."""
        values = await self._values()
        return {key: self._pause_of(key, value) for key, value in values.items() if value}

    # -- an orchestrator's copy ---------------------------------------------------------

    def holds(self, namespace: str, name: str) -> bool:
        """Whether the watch has seen the workflow paused (no I/O)."""
        return bool(self._held) and f"{namespace}/{name}" in self._held

    async def holding(self, runs: Any, run_id: str) -> bool:
        """Whether the run's next decision is to check :meth:`paused_first`: a workflow is
        paused with its runs (no I/O otherwise), and the run was not resumed on its own
        (``resume run``) since its workflow's pause, which it then goes on despite.
        ``runs``: the orchestrator's :class:`~interlock.runtime.runs.Runs`."""
        if not any(p.get("runs") for p in self._held.values()):
            return False
        entry = await runs.load(run_id)
        if entry is None:
            return False
        state = entry.state  # (its workflow: the cached state may be behind the log)
        pause = self._held.get(f"{state.namespace}/{state.workflow}")
        if not pause or not pause.get("runs"):
            return False
        from interlock.core import events as ev
        from interlock.core.rfc3339 import parse_time

        since = parse_time(str(pause.get("at", "")))
        records, _ = await runs.log.read(run_id)
        resumed = (r for r in records if isinstance(r, ev.RunResumed))
        return not any(parse_time(r.time) >= since for r in resumed)

    def paused_first(self, definition: Definition, state: RunState, now: str) -> list[ev.AnyRecord]:
        """What a run's next decision records first when its workflow is paused with its
        runs (``pause workflow --runs``, as the watch has it) and the run is in flight and
        not paused: ``run.paused``, with the workflow. So a run the pause's list of runs
        did not show (started in the instant before the pause, or not yet in the run
        index) takes no transition either: it is paused at its next step, and what reached
        it is held. Nothing for any other run (one held in the pause's line waits there)."""
        if not self._held:
            return []
        pause = self._held.get(f"{definition.namespace}/{definition.name}")
        if not pause or not pause.get("runs") or state.paused is not None:
            return []
        from interlock.core.pauses import PAUSED
        from interlock.core.runpause import pause as pause_run

        if state.queued and any(c.limit.endswith(PAUSED) for c in state.slots or ()):
            return []
        reason = str(pause.get("reason") or "paused with its workflow")
        self._paused_here.setdefault(f"{definition.namespace}/{definition.name}", set()).add(
            state.run_id
        )
        return pause_run(state, reason=reason, now=now, workflow=True)

    def first(
        self, definition: Definition, state: RunState, now: str, *, holding: bool
    ) -> list[ev.AnyRecord]:
        """What a run's next decision records first: ``run.paused`` (``holding``: see
        :meth:`paused_first`), or the run's resumption (see :meth:`resumed_first`)."""
        if holding:
            return self.paused_first(definition, state, now)
        return self.resumed_first(definition, state, now)

    def resumed_first(
        self, definition: Definition, state: RunState, now: str
    ) -> list[ev.AnyRecord]:
        """What a run paused with its workflow (``pause workflow --runs``, not on its own)
        records first at its next decision once that pause has ended (the watch saw it
        removed after the run was paused, or the workflow was not paused when the watch
        began): ``run.resumed``, then the events it held decided on, as ``resume run``
        does. So a run ``resume workflow`` did not find (the run list is written behind
        the runs) goes on all the same. Nothing while the workflow is paused, nor for a run
        paused after the removal was seen (a new pause the watch has not seen yet)."""
        paused, since = state.paused, self._watched_from
        if paused is None or not paused.workflow or since is None:
            return []
        key = f"{definition.namespace}/{definition.name}"
        if key in self._held:
            return []
        from interlock.core.engine import resume
        from interlock.core.rfc3339 import parse_time

        ended = max(since, self._resumed_at.get(key, since))
        if parse_time(paused.at) >= ended:
            return []
        return resume(definition, state, now)

    async def resume_here(self, runs: Any, namespace: str, name: str, now: str) -> None:
        """The workflow was resumed: the runs this process paused with it at their next
        step (:meth:`paused_first`) are resumed now (:meth:`resumed_first`), those the
        run list did not show ``resume workflow`` included. ``runs``: the orchestrator's
        :class:`~interlock.runtime.runs.Runs`."""
        for run_id in sorted(self._paused_here.pop(f"{namespace}/{name}", ())):
            async with runs.locked(run_id):
                try:
                    await runs.apply(run_id, lambda d, s: self.resumed_first(d, s, now))
                # Resumed at its next decision instead.
                except Exception as exc:  # noqa: BLE001
                    log.warning("could not resume run %s with its workflow: %s", run_id, exc)

    def admitted(
        self, definition: Definition, state: RunState, now: str, *, holding: bool
    ) -> list[ev.AnyRecord]:
        """A queued run's ``run.admitted`` (:func:`interlock.core.limits.admitted`), or,
        ``holding`` (see :meth:`holding`), ``run.paused`` instead for a run its workflow's
        pause holds: a paused run is not admitted."""
        from interlock.core.engine import admit as admitted  # the engine: not for readers
        from interlock.core.state import fold

        first = self.first(definition, state, now, holding=holding)
        return [*first, *admitted(definition, fold(first, state) if first else state, now)]

    def holds_capability(self, name: str) -> bool:
        """Whether the watch has seen the capability paused (no I/O)."""
        return bool(self._held) and f"{CAPABILITY}{name}" in self._held

    async def start(
        self, resumed: Resumed, capability_resumed: CapabilityResumed | None = None
    ) -> None:
        """Follow the bucket: every pause now is known when this returns; each one removed
        later is told to ``resumed`` (a workflow's) or ``capability_resumed``."""
        kv = await self._bucket()
        # Every pause now is known once the watch has passed the bucket's last message:
        # the watcher's own "every current value has come" marker can come before values
        # already sent (nats-py decides it from a consumer info that may be answered before
        # the client has read what the server pushed), so the marker alone is not enough.
        last = int((await kv.status()).stream_info.state.last_seq or 0)
        self._watched_from = datetime.now(UTC)
        watcher = await kv.watchall()
        loaded = asyncio.get_running_loop().create_future()
        marked, seen = False, 0

        def check_loaded() -> None:
            if marked and seen >= last and not loaded.done():
                loaded.set_result(None)

        async def follow() -> None:
            nonlocal marked, seen
            async for entry in watcher:
                if entry is None:  # the watcher's marker: see above
                    marked = True
                    check_loaded()
                    continue
                seen = max(seen, entry.revision or 0)
                capability = entry.key.startswith(CAPABILITY)
                key = (
                    entry.key if capability else entry.key.removeprefix("wf.").replace(".", "/", 1)
                )
                pause = (
                    self._pause_of(entry.key, entry.value, entry.revision or 0)
                    if entry.value
                    else None
                )
                if pause is not None:
                    self._held[key] = pause
                elif self._held.pop(key, None) is not None:
                    self._resumed_at[key] = datetime.now(UTC)
                    namespace, _, name = key.partition("/")
                    # A resumption that fails is done again by the next start's sweep.
                    try:
                        if not capability:
                            await resumed(namespace, name)
                        elif capability_resumed is not None:
                            await capability_resumed(key.removeprefix(CAPABILITY))
                    except Exception as exc:  # noqa: BLE001
                        log.warning("could not resume what waited for %s: %s", key, exc)
                check_loaded()

        self._task = asyncio.create_task(follow())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(loaded), 10)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None


def pause_of(value: bytes | None) -> tuple[dict[str, Any], str]:
    """The pause a value of the bucket says, and, when it is damaged (not a JSON object),
    why; such a value is still a pause (as a ``pause`` wrote one there), with
    :data:`DAMAGED` for its reason and ``damaged`` set, until resumed."""
    try:
        found = json.loads(value or b"")
    except (ValueError, RecursionError):
        why = "not JSON"
    else:
        if isinstance(found, dict):
            return found, ""
        why = "not a JSON object"
    return {"at": "", "reason": f"{DAMAGED} ({why})", "damaged": True}, why
