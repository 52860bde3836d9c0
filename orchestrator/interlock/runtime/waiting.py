"""Waiting on any number of runs for the cost of one subscription.

Every append to a run's log is a publish on ``<prefix>.runs.<run id>``, and a plain NATS
subscription on ``<prefix>.runs.>`` sees each one as it is published. A :class:`RunWatcher`
holds that one subscription for its connection and hands each message to whoever watches
that run, so a program waiting on 5,000 runs costs the server one subscription and no
JetStream consumer at all (a consumer per wait hits the server's limit of 1,000 consumers).

What the subscription says is a hint, never the answer: a message also reaches subscribers
when the stream refuses it (an optimistic append that lost its race), a subscription
misses what was published while the connection was down, and a subscriber may see a
message before the stream has stored it. So a wait always reads the run's log itself (by
direct gets, from where it last read) when it starts, when a hint says the run may have
moved (again a few times soon after, while the hinted message is not readable yet), and
every ``recheck`` seconds in case a hint was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from interlock.core import events as ev
from interlock.runtime.errors import RunNotStarted, UnknownRun
from interlock.runtime.logstore import RunLog
from interlock.transport.directget import LogReadError
from interlock.transport.natsclient import js_api, round_trip
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.client")

RECHECK_S = 30.0
"""How often a wait reads its run's log even without a hint (a missed hint costs at most
this long)."""

REFUSED_RECHECK_S = 1.0
"""How often a wait reads its run's log when the subscription is refused."""
HINT_RETRIES_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""When a hinted message is not in the log yet, how long to wait before each re-read (the
stream stores a message a moment after subscribers see it; a refused append never
appears, so the re-reads stop after these and the ``recheck`` takes over)."""
READERS = 32
"""Log reads at once, per watcher (each holds a reply subscription while it lasts): the
whole-log reads of finished runs, follows' reads and ``Client.logs``' first read."""
ASKING = 256
"""Reads of a run's last record in flight at once, per watcher (they share the
connection's reply subscription): 5,000 waits starting together ask 256 at a time."""
READ_TIMEOUT_S = 5.0
"""How long one read waits for the server's answer before it is asked again (within
the wait's own deadline: a busy process can miss an answer a wait still has time for)."""

TOLD_S = 600.0
"""How long a run id an emit said it starts is remembered as told (see :class:`Told`)."""
TOLD_MAX = 10_000
"""The most run ids remembered as told, per watcher (the oldest forgotten first)."""

_T = TypeVar("_T")


class Told:
    """The run ids an emit of this client said it starts, for ``TOLD_S`` seconds: asked
    for before the orchestrator has started it, such a run is not started yet, not
    unknown (:class:`RunNotStarted`)."""

    def __init__(self) -> None:
        self._at: OrderedDict[str, float] = OrderedDict()

    def add(self, run_id: str) -> None:
        self._at[run_id] = time.monotonic()
        self._at.move_to_end(run_id)
        while len(self._at) > TOLD_MAX:
            self._at.popitem(last=False)

    def __contains__(self, run_id: object) -> bool:
        at = self._at.get(run_id) if isinstance(run_id, str) else None
        return at is not None and time.monotonic() - at < TOLD_S

    def unknown(self, run_id: str) -> UnknownRun:
        """What to raise for ``run_id`` found nowhere: not started yet, or unknown."""
        return RunNotStarted(run_id) if run_id in self else UnknownRun(run_id)


_TERMINAL_MARKERS = tuple(t.encode() for t in ev.TERMINAL_TYPES)


Listener = Callable[[bytes], None]


class RunWatcher:
    """One subscription on every run log of an installation, shared by all waits."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        log: RunLog,
        *,
        recheck: float = RECHECK_S,
        read_timeout: float = READ_TIMEOUT_S,
        asking: int = ASKING,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._log = log
        self._recheck = recheck
        self._prefix = subjects.runs_all[:-1]  # "<prefix>.runs."
        self._listeners: dict[str, list[Listener]] = {}
        self._sub: Subscription | None = None
        self._subscribing: asyncio.Lock = asyncio.Lock()
        self._reading = asyncio.Semaphore(READERS)
        self._asking = asyncio.Semaphore(asking)
        self._read_timeout = read_timeout
        self.told = Told()
        self.timed_out_reads = 0
        """Reads the server did not answer in time, each asked again (a busy process or
        server: they only cost time, within each wait's deadline)."""
        self.hinted = True
        """Whether appends are seen as they happen (False: the server refused the
        subscription, and waits poll)."""

    @property
    def watching(self) -> int:
        """How many runs have someone watching them now."""
        return len(self._listeners)

    async def start(self) -> None:
        """Subscribe (once; later calls return at once). Done before any log is read, so
        nothing appended after the read can go unseen."""
        if self._sub is not None:
            return
        async with self._subscribing:
            if self._sub is not None:
                return
            sub = await self._nc.subscribe(
                self._subjects.runs_all,
                cb=self._on_msg,
                # A busy installation appends thousands of messages a second: keep them
                # rather than drop them (a dropped hint only delays a wait by `recheck`).
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=512 * 1024 * 1024,
            )
            # The server has the subscription once it answered a round trip after it (and
            # has said so first if it refused it).
            before = self._nc.last_error
            await round_trip(self._nc)
            error = self._nc.last_error
            if error is not before and self._subjects.runs_all in str(error):
                log.warning(
                    "not allowed to subscribe to %s (%s): waits read each run's log every "
                    "%.0f s instead",
                    self._subjects.runs_all,
                    error,
                    REFUSED_RECHECK_S,
                )
                self.hinted = False
                self._recheck = min(self._recheck, REFUSED_RECHECK_S)
            self._sub = sub
        # Where runs are, read once now rather than by the first waits (read again when a
        # run is not where the map said).
        with contextlib.suppress(Exception):
            await self._log.placement.current()

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            # Closing: a connection already gone leaves nothing to undo.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_msg(self, msg: Msg) -> None:
        subject = msg.subject
        if not subject.startswith(self._prefix):
            return
        # In any partition: the run id is the subject's last token.
        listeners = self._listeners.get(subject.rpartition(".")[2])
        if not listeners:
            return
        for listener in list(listeners):
            listener(msg.data)

    @contextlib.contextmanager
    def listening(self, run_id: str, listener: Listener) -> Iterator[None]:
        """Hand every message appended to ``run_id``'s log to ``listener`` meanwhile."""
        self._listeners.setdefault(run_id, []).append(listener)
        try:
            yield
        finally:
            found = self._listeners.get(run_id)
            if found is not None:
                with contextlib.suppress(ValueError):
                    found.remove(listener)
                if not found:
                    del self._listeners[run_id]

    async def finished(
        self,
        run_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[ev.AnyRecord]:
        """The run's whole log once it has finished.

        Raises:
            UnknownRun: there is no such run (its log is empty).
            TimeoutError: it has not finished within ``timeout`` seconds.
        """
        return await self.finished_read(run_id, timeout, self._read_whole)

    async def finished_read(
        self,
        run_id: str,
        timeout: float | None,  # noqa: ASYNC109
        read: Callable[[str], Awaitable[_T]],
    ) -> _T:
        """``read(run_id)`` once the run has finished (a finished run's log no longer
        changes), a few reads at a time (each holds a reply subscription while it lasts),
        asked again when the server's answer does not come in time: the whole log
        (:meth:`finished`), or its state from its snapshot (``Client.result``).

        Raises:
            UnknownRun: there is no such run (its log is empty).
            TimeoutError: it has not finished within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        await self.until_finished(run_id, timeout)

        async def bounded(run_id: str) -> _T:
            async with self._reading:
                return await read(run_id)

        try:
            return await self._asked_again(deadline, bounded, run_id)
        except TimeoutError:
            raise TimeoutError(f"run {run_id} has not finished after {timeout}s") from None

    async def until_finished(
        self,
        run_id: str,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Until the run has finished (its last message ends it): what :meth:`finished`
        waits for, without reading the log (a reader of its state reads what it needs).

        Raises:
            UnknownRun: there is no such run (its log is empty).
            TimeoutError: it has not finished within ``timeout`` seconds.
        """
        await self.start()
        hint = asyncio.Event()

        def on_append(data: bytes) -> None:
            if any(marker in data for marker in _TERMINAL_MARKERS):
                hint.set()

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pace = _Pace(self._recheck)
        try:
            with self.listening(run_id, on_append):
                last = await self._last(run_id, deadline)
                if last is None:
                    raise UnknownRun(run_id)
                while not _ended(last):
                    # A terminal hint whose message is not readable yet: read again soon.
                    wait, soon = pace.next(unread_hint=hint.is_set())
                    if not soon:
                        hint.clear()
                    if deadline is not None:
                        left = deadline - loop.time()
                        if left <= 0:
                            raise TimeoutError  # noqa: TRY301 (said once, below)
                        wait = min(wait, left)
                    if soon:
                        await asyncio.sleep(wait)
                    else:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(hint.wait(), wait)
                    last = await self._last(run_id, deadline) or b""
        except TimeoutError:
            raise TimeoutError(f"run {run_id} has not finished after {timeout}s") from None

    async def _read_whole(self, run_id: str) -> list[ev.AnyRecord]:
        records, _ = await self._log.read(run_id)
        return records

    async def _asked_again(
        self, deadline: float | None, read: Callable[[str], Awaitable[_T]], run_id: str
    ) -> _T:
        """``read(run_id)``, asked again each time the server's answer does not come in
        time, until ``deadline`` (loop time; None: none), past which TimeoutError.

        A read's own timeout is not the caller's: thousands of waits reading at once in a
        process short of CPU can take longer than a read's timeout to take in their
        answers, and such a miss says nothing about the run."""
        async with asyncio.timeout_at(deadline):
            while True:
                try:
                    return await read(run_id)
                except nats.errors.TimeoutError:
                    self.timed_out_reads += 1
                    log.debug("a read of run %s timed out: reading it again", run_id)

    async def follow(self, run_id: str, after: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """(stream sequence, payload) of each message appended to the run's log after
        sequence ``after``, in order and as it is appended, until the one that ends the
        run. Each hint (or, without one, every ``recheck`` seconds) reads what is new by
        direct gets: following any number of runs costs no consumer."""
        await self.start()
        hint = asyncio.Event()
        hinted: list[bytes] = []  # the newest hinted payload not yet read back

        def on_append(data: bytes) -> None:
            hinted[:] = [data]
            hint.set()

        pace = _Pace(self._recheck)
        with self.listening(run_id, on_append):
            while True:
                hint.clear()  # before reading: an append during the read sets it again
                fresh = await self.read_raw(run_id, after)
                for seq, payload in fresh:
                    after = seq
                    if hinted and hinted[0] == payload:
                        hinted.clear()
                    yield seq, payload
                    if _ended(payload):
                        return
                wait, soon = pace.next(unread_hint=bool(hinted))
                if not soon:  # nothing hinted unread, or its re-reads are spent
                    hinted.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hint.wait(), wait)

    async def read_raw(self, run_id: str, after: int = 0) -> list[tuple[int, bytes]]:
        """(stream sequence, payload) of the run's log messages after sequence ``after``:
        one of the ``READERS`` reads this watcher makes at once (a reader past them waits
        for one to end)."""
        async with self._reading:
            return await self._log.read_raw(run_id, after)

    async def exists(self, run_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether the run's log has a record, waiting up to ``timeout`` seconds for one
        (a run a trigger event starts exists once the orchestrator has taken the event)."""
        await self.start()
        hint = asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # The run is most often not started yet: with one layout read a moment ago, the
        # first look does not read the map again for a layout set since (no map read per
        # run waited for); every later look (a hint, a second, the deadline) does.
        elsewhere = looked = not self._log.placement.lately_single()
        answered = False
        with self.listening(run_id, lambda _: hint.set()):
            while True:
                try:
                    if await self._last(run_id, deadline, elsewhere=elsewhere) is not None:
                        return True
                except TimeoutError:
                    break
                answered, looked = True, elsewhere
                left = deadline - loop.time()
                if left <= 0:
                    break
                elsewhere = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hint.wait(), min(left, 1.0))
                hint.clear()
        if looked or not answered:
            return False
        # Out of time before a look under a layout set since the map was read (and the
        # server answers): one now, within one read's time.
        try:
            return await self._last(run_id, loop.time() + self._read_timeout) is not None
        except TimeoutError:
            return False

    async def _last(
        self, run_id: str, deadline: float | None, *, elsewhere: bool = True
    ) -> bytes | None:
        """The payload of the run's last log message (None: no such run), by a direct get
        on the connection's shared reply subscription, asked again when its answer does
        not come in time, until ``deadline`` (loop time; None: none). A finished run's
        last message holds its terminal record. ``elsewhere``: when not there, look for it
        under a layout set since the map was read here (which reads the map again)."""
        ask = functools.partial(self._ask_last, elsewhere=elsewhere)
        return await self._asked_again(deadline, ask, run_id)

    async def _ask_last(self, run_id: str, *, elsewhere: bool = True) -> bytes | None:
        stream, subject = await self._log.where(run_id)
        api = f"{js_api(self._nc)}.DIRECT.GET.{stream}"
        body = json.dumps({"last_by_subj": subject}).encode()
        try:
            async with self._asking:
                reply = await self._nc.request(api, body, timeout=self._read_timeout)
        except NoRespondersError:
            return None  # no runs stream here at all: nothing was ever applied
        status = (reply.headers or {}).get("Status")
        if status in ("404", "503"):  # no such run; no runs stream at all
            # Unless a layout the map had not when it was read here placed it elsewhere.
            if (
                elsewhere
                and await self._log.last_seq(run_id)
                and await self._log.where(run_id)
                != (
                    stream,
                    subject,
                )
            ):
                return await self._ask_last(run_id)
            return None
        if status:
            raise LogReadError(f"reading the last record of {run_id}: status {status}")
        return await self._log.last_record(run_id, reply.headers, reply.data)


class _Pace:
    """When a wait or follow reads its run's log again: soon after a hint whose message
    was not readable yet (``HINT_RETRIES_S``), else at the next hint or after about
    ``recheck`` seconds (jittered, so many waits do not read at once)."""

    def __init__(self, recheck: float) -> None:
        self._recheck = recheck
        self._retries: Iterator[float] = iter(HINT_RETRIES_S)

    def next(self, *, unread_hint: bool) -> tuple[float, bool]:
        """(seconds to wait, whether it is a re-read soon after a hint)."""
        soon = next(self._retries, None) if unread_hint else None
        if soon is not None:
            return soon, True
        self._retries = iter(HINT_RETRIES_S)  # the next hint gets its re-reads again
        return self._recheck * random.uniform(0.8, 1.2), False


def _ended(payload: bytes) -> bool:
    if not any(marker in payload for marker in _TERMINAL_MARKERS):
        return False  # the common case, without decoding
    return any(ev.record_type(r) in ev.TERMINAL_TYPES for r in ev.decode_batch(payload))
