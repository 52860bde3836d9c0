"""Answers by request and reply: the orchestrator's side of ``<prefix>.answer.>``.

An agent sends its answer as a core-NATS request; the orchestrator checks it exactly as an
answer read from the results stream (:mod:`interlock.runtime.answers`), appends it to the
run's log, and replies only once that append is acknowledged. The agent acknowledges its
task after the reply, so an answer is stored once (in the log) instead of twice (results
stream, then log), and reaches its run at once instead of at the results consumer's next
fetch. Nothing here is the only way in: an agent that gets no reply, or ``failed``,
publishes the same answer to the results stream, which works with no orchestrator up.

The reply goes only to an inbox of the requester (``_INBOX.``, or the ``_R_.`` subject the
server makes for a request from another account, which leads back to the requester's own
inbox): a request naming any other reply subject is dead-lettered (``reply-refused``) and
neither decided on nor answered. The reply is published with the orchestrator's rights,
and a requester that chose it could otherwise have it written anywhere the orchestrator
may write (a JetStream API request: purge a stream; a run log; a bucket's key).

Every orchestrator replica subscribes in one queue group, so each request reaches one of
them. Requests are handled concurrently (different runs in parallel; one run's answers
wait for each other on its lock), at most ``limit`` at a time: beyond that they wait their
turn (at most ``BACKLOG`` of them; past that a request gets no reply), and an agent that
waits too long sends its answer the other way. Each request is taken from the
connection's read loop straight into a task of its own (a direct subscription), without
a subscription queue and its task in between.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from interlock.core.events import FreedSlots
from interlock.core.objects import ObjectError
from interlock.runtime.answers import (
    LATE_REFUSALS,
    AnswerKey,
    AnswerRefused,
    Answers,
    answers_taken,
    late_reason,
)
from interlock.runtime.flow import to_incoming
from interlock.runtime.logstore import RunLog
from interlock.runtime.observe import Observers
from interlock.transport import tasks
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent, decode_message
from interlock.transport.natsclient import NatsClient, direct_subscriber
from interlock.transport.partitions import Placement
from interlock.transport.subjects import Subjects, is_inbox

log = logging.getLogger("interlock.answering")

QUEUE = "interlock-orchestrator"
"""The queue group every orchestrator replica serves answer requests in."""
IN_FLIGHT = 1024
"""Answer requests handled at once by one orchestrator."""
BACKLOG = 16_384
"""Answer requests waiting for one of the ``IN_FLIGHT`` places (beyond, one is dropped:
its agent gets no reply and sends the answer to the results stream)."""

AnswerReply = tuple[str, str | None, str | None]
"""The reply's ``Interlock-Answer`` value, and for ``refused`` the dead letter's reason and
detail."""
REPLY_REFUSED = "reply-refused"
"""The dead-letter reason of a request whose reply subject is not the requester's inbox."""

SETTLED_KEPT = 4096
"""Attempts no longer awaited whose verdict an orchestrator keeps (each a few ids)."""
DUPLICATE = "duplicate"
"""An answer decided already (the log holds it): replied to as recorded, never a dead letter."""
Refuse = Callable[[Msg, str, str], Awaitable[None]]
"""Dead-letters a message with a reason and a detail."""


class AnswerRouting:
    """Which runs' answer requests this replica takes, with more than one partition: those
    of the runs in the partitions it holds (``held``), each located exactly. A run not seen
    here yet under a map of several layouts may be in any of its live layouts' partitions,
    held by different replicas: it is located by a read of the streams first (remembered),
    so that one replica only, the holder of the partition it is in, takes the request."""

    def __init__(self, placement: Placement, held: Callable[[], Collection[int]]) -> None:
        self._placement, self._held = placement, held

    def mine(self, run_id: str) -> bool | None:
        """Whether ``run_id`` is in a partition held here, as known without a read (None:
        not seen yet, and one of the partitions it may be in is held here)."""
        placement, held = self._placement, self._held()
        if len(placement.map.layouts) == 1 or placement.located(run_id):
            return placement.known(run_id) in held
        if any(p in held for p in placement.map.live_candidates(run_id)):
            return None
        return False

    async def locate(self, run_id: str) -> bool:
        """Whether ``run_id`` is in a partition held here, read where it is."""
        return await self._placement.locate(run_id) in self._held()


class AnswerDesk:
    """Serves answer requests with ``handle`` (which never raises for a refused answer: it
    dead-letters it and says ``refused``)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        handle: Callable[[Msg], Awaitable[AnswerReply]],
        refuse: Refuse,
        *,
        limit: int = IN_FLIGHT,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._handle = handle
        self._refuse = refuse
        self._free = limit
        self._backlog: collections.deque[tuple[Msg, bool]] = collections.deque()
        self._sub: Subscription | None = None
        self._open = False
        self._working: set[asyncio.Task[None]] = set()
        self._routing: AnswerRouting | None = None

    async def start(self) -> None:
        self._open = True
        await self._subscribe()

    async def _subscribe(self) -> None:
        subject = self._subjects.answers_all
        # One of the replicas in the queue group takes each request; with partitions every
        # replica hears every request and takes those of the runs it relays.
        queue = QUEUE if self._routing is None else ""
        direct = direct_subscriber(self._nc)
        if direct is not None:
            self._sub = await direct(subject, self._take, queue=queue)
        else:
            self._sub = await self._nc.subscribe(subject, queue=queue, cb=self._on_request)

    async def route(self, routing: AnswerRouting | None) -> None:
        """Take the requests of the runs ``routing`` says from now on, or (None) one
        request in turn with the other replicas, as with one partition. A request that
        comes while the subscription changes, or whose run cannot be located, gets no
        reply: its agent sends the answer to the results stream after its timeout."""
        self._routing = routing
        if self._sub is None:
            return
        old, self._sub = self._sub, None
        with contextlib.suppress(Exception):
            await old.unsubscribe()
        if self._open:
            await self._subscribe()

    async def stop(self, grace: float = 2.0) -> None:
        """No new request is taken; those in hand get ``grace`` seconds (an agent that gets
        no reply sends its answer to the results stream)."""
        self._open = False
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        self._backlog.clear()  # their agents get no reply: they send them the other way
        if self._working:
            _, late = await asyncio.wait(set(self._working), timeout=grace)
            await cancel_and_wait(*late)

    async def _on_request(self, msg: Msg) -> None:
        self._take(msg)

    def _take(self, msg: Msg) -> None:
        # Each request is handled in a task of its own, so a slow append does not hold up
        # the answers of other runs.
        if not self._open:
            return  # stopping: the agent sends it the other way
        check = False
        if self._routing is not None:
            verdict = self._routing.mine(msg.subject.rpartition(".")[2])
            if verdict is False:
                return  # another replica's run
            check = verdict is None  # located first
        if self._free > 0:
            self._free -= 1
            self._begin(msg, check)
        elif len(self._backlog) < BACKLOG:
            self._backlog.append((msg, check))
        else:
            log.warning("answer on %s dropped: too many waiting", msg.subject)

    def _begin(self, msg: Msg, check: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(msg, check))
        self._working.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._working.discard(task)
        if self._backlog and self._open:
            self._begin(*self._backlog.popleft())
        else:
            self._free += 1

    async def _here(self, msg: Msg) -> bool:
        """Whether the run of ``msg`` is in a partition held here (read where it is)."""
        if self._routing is None:
            return True
        run_id = msg.subject.rpartition(".")[2]
        try:
            return await self._routing.locate(run_id)
        # Not taken: its holder takes it, or the agent sends it the other way.
        except Exception as exc:  # noqa: BLE001
            log.info("cannot locate run %s for its answer on %s: %s", run_id, msg.subject, exc)
            return False

    async def _answer(self, msg: Msg, check: bool = False) -> None:
        if check and not await self._here(msg):
            return  # another replica's run: its holder replies
        if msg.reply and not is_inbox(msg.reply):
            why = (
                f"the reply subject {msg.reply[:200]!r} is not an inbox of the requester: "
                "answers are replied to on _INBOX. subjects only"
            )
            log.warning("refused an answer on %s: %s", msg.subject, why)
            try:
                await self._refuse(msg, REPLY_REFUSED, why)
            except Exception:  # logged by the dead-lettering
                log.debug("could not dead-letter the answer on %s", msg.subject, exc_info=True)
            return
        try:
            status, reason, detail = await self._handle(msg)
        # Whatever went wrong, the agent still has the answer: it sends it the other way.
        except Exception as exc:  # noqa: BLE001
            log.warning("answer on %s not taken (sent to the results stream): %s", msg.subject, exc)
            status, reason, detail = tasks.ANSWER_FAILED, None, None
        if not msg.reply:
            return  # published, not requested: nobody to tell
        headers = {tasks.ANSWER_HEADER: status}
        if reason:
            headers[tasks.ANSWER_REASON_HEADER] = reason
        if detail:
            headers[tasks.ANSWER_DETAIL_HEADER] = header_text(detail, tasks.ANSWER_DETAIL_MAX)
        nc = self._nc
        try:
            if not (isinstance(nc, NatsClient) and nc.publish_nowait(msg.reply, headers=headers)):
                await nc.publish(msg.reply, b"", headers=headers)
        # The agent that gets no reply sends the answer to the results stream.
        except Exception:
            log.debug("cannot reply to the answer on %s", msg.subject, exc_info=True)


Deliver = Callable[..., Awaitable[bool]]
"""Decides on an incoming event for a run: ``deliver(run_id, incoming, answer=key)``."""
Stopped = Callable[[str, FreedSlots], Awaitable[None]]
"""Told a run and the slots of its cancelled attempt whose worker has stopped."""


def header_text(text: str, limit: int) -> str:
    """``text`` as a header value: printable ASCII (anything else escaped as Python
    escapes it), at most ``limit`` characters."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text[:limit])[:limit]


def still_running(event: CloudEvent) -> bool:
    """Whether a failure answer says the handler had not ended when it was sent (a
    cancelled handler that ignored its cancellation)."""
    data = event.data
    error = data.get("error") if isinstance(data, dict) else None
    return isinstance(error, dict) and error.get("code") == tasks.HANDLER_RUNNING


class AnswerTaking:
    """Checks an agent's answer (from the results stream or a request) and decides on it;
    a refused one is dead-lettered with its reason, a late one dropped and counted."""

    def __init__(
        self,
        answers: Answers,
        deliver: Deliver,
        refuse: Refuse,
        log_store: RunLog,
        observers: Observers,
        counters: collections.Counter[str],
        stopped: Stopped | None = None,
    ) -> None:
        """``stopped``: told the slots of a cancelled attempt whose worker has answered
        it (its handler has ended), which were held while it stopped."""
        self._answers, self._deliver, self._refuse = answers, deliver, refuse
        self._log, self._observers, self._counters = log_store, observers, counters
        self._stopped = stopped
        self._settled: collections.OrderedDict[
            tuple[str, str, int], tuple[frozenset[str], str | None]
        ] = collections.OrderedDict()
        """What the log says of attempts no longer awaited (the answers it took, why the
        run stopped waiting), :data:`SETTLED_KEPT` of them: see :meth:`_late`."""

    async def take(self, msg: Msg) -> AnswerReply:
        """Decide on the answer ``msg``; what to reply. Raises when it cannot be taken now."""
        try:
            event = decode_message(msg.headers, msg.data)
        except InvalidCloudEvent as exc:
            await self._refuse(msg, exc.reason, str(exc))
            return tasks.ANSWER_REFUSED, exc.reason, str(exc)
        key: AnswerKey | None = None
        try:
            key = self._answers.key_of(msg.subject, event, msg.headers)
            await self._deliver(key.run_id, to_incoming(event), answer=key)
        except (AnswerRefused, ObjectError) as exc:
            late = await self._late(key, exc, event)
            if late == DUPLICATE:
                log.debug("answer on %s taken already: %s", msg.subject, exc.detail)
                self._counters["answers_duplicate"] += 1
                return tasks.ANSWER_RECORDED, None, None
            if late is not None:
                log.debug("late answer on %s dropped (%s): %s", msg.subject, late, exc.detail)
                self._counters[f"answers_late:{late}"] += 1
                self._observers.answer_late(late)
                return tasks.ANSWER_LATE, late, None
            log.warning("refused an answer on %s: %s", msg.subject, exc.detail)
            await self._refuse(msg, exc.reason, exc.detail)
            return tasks.ANSWER_REFUSED, exc.reason, exc.detail
        return tasks.ANSWER_RECORDED, None, None

    async def _late(
        self, key: AnswerKey | None, refused: AnswerRefused | ObjectError, event: CloudEvent
    ) -> str | None:
        """Why the run stopped waiting for the attempt an authentic answer speaks for, when
        it did so itself, or :data:`DUPLICATE` when this very answer is in the log (None: a
        dead letter). Reads the run's log: refusals are rare. The answer of an attempt
        cancelled once dispatched says its worker has stopped: the slots held meanwhile
        go (unless it says its handler still runs)."""
        if key is None or refused.reason not in LATE_REFUSALS:
            return None
        settled = self._settled.get((key.run_id, key.action_id, key.attempt))
        if settled is not None:
            # Known already: an answer to an attempt no longer awaited is sent again (a
            # worker's retry, or an agent replaying a task it once had, whose token stays
            # good): read the whole log once per attempt, not at every copy.
            self._settled.move_to_end((key.run_id, key.action_id, key.attempt))
            answered, late = settled
            return DUPLICATE if event.id in answered else late
        records, _ = await self._log.read(key.run_id)
        answered = answers_taken(records, key)
        late = late_reason(records, key)
        if answered or late is not None:  # what the log says of it now is for good
            self._settled[(key.run_id, key.action_id, key.attempt)] = (answered, late)
            if len(self._settled) > SETTLED_KEPT:
                self._settled.popitem(last=False)
        if event.id in answered:
            return DUPLICATE
        if late is not None and self._stopped is not None and not still_running(event):
            from interlock.core.capacity import stopping  # the engine: not for readers

            slots = stopping(records, key.action_id, key.attempt)
            if slots is not None:
                await self._stopped(key.run_id, slots)
        return late
