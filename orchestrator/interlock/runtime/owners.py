"""Messages for a run decided by the replica that holds the run's partition.

With more than one partition, each partition is held by one replica at a time
(:mod:`ownership`), which keeps its runs' states warm. Events addressed to a run, answers
on the results stream and fired timers still come through the shared durable consumers
(``ingress``, ``results``, ``timers``) that every replica reads. A replica that takes one
for a run of a partition it does not hold hands it to the holder, by request on
``<prefix>.owner.<partition>.<kind>.<run_id>`` (:class:`Handover`): the holder, which
subscribes to the subjects of the partitions it holds (:class:`OwnerDesk`), decides it as
if it had read it and replies how that went. Not in a queue group: a replica that lost a
lease while paused keeps its subscription until its next round, and a queue group would
send it a share of the requests, each waiting out the timeout; without one, every
subscriber hears the request, the live holder replies first, and the late one decides
nothing new (the run has taken the message). The replica that read the message settles
it in JetStream as usual, only after the reply: acknowledged once the holder decided it
(or dead-lettered it), deferred or retried as the holder says. When no replica holds the
partition (between two holders), or the holder does not reply within
:data:`HAND_TIMEOUT_S` (gone, paused, overloaded), the message is decided where it was
read, as with one partition: a lease is never what keeps a log right, the optimistic
append is, and the run ignores an event, answer or timer it has taken already.

Nothing is lost in a handover because nothing is settled before it is decided: a replica
killed while holding a message leaves it unacknowledged, and JetStream hands it out again
after its ack wait. Nothing is doubled because the decision is idempotent (a second
delivery of a taken answer is late, of a fired timer stale, of an event a duplicate).

An event that reaches runs by their correlation key is routed where it was read (triggers
start runs on any replica) and handed to each run's holder as the run takes it
(:meth:`Owners.deliver`): the reply says whether the run took it.

With one partition nothing is handed over: every replica decides what it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from contextvars import ContextVar
from typing import NamedTuple

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from interlock.core.ids import is_run_id
from interlock.core.incoming import Incoming
from interlock.core.windowing import is_window_timer
from interlock.runtime.capacity import is_stop_timer
from interlock.runtime.fairness import Deferred
from interlock.runtime.handling import FINAL, final_reason
from interlock.runtime.ratetokens import is_rate_timer
from interlock.runtime.retention import is_retention_timer
from interlock.runtime.timers import fired_message, read_fired
from interlock.transport.jetstream import delivered_elsewhere
from interlock.transport.natsclient import NatsClient, direct_subscriber
from interlock.transport.partitions import Placement
from interlock.transport.subjects import Subjects, is_inbox

log = logging.getLogger("interlock.orchestrator")

EVENT, RESULT, TIMER, INCOMING = "event", "result", "timer", "incoming"
"""What is handed over: an event addressed to a run, an answer read from the results
stream, a fired timer (each as it was read), an event for a run its correlation key
reached it by (as the run takes it)."""
TAKEN = "taken"
"""The detail of a reply about an event the run took."""
HAND_TIMEOUT_S = 5.0
"""How long a replica waits for the holder's reply before it decides the message itself."""

OUTCOME = "Interlock-Owner-Outcome"
"""The reply's header: :data:`DONE`, :data:`DEFERRED`, :data:`FAILED`, or :data:`GONE`
(the replica no longer takes them: the reader decides it)."""
DETAIL = "Interlock-Owner-Detail"
"""The deferral's delay in seconds, or why it failed."""
SUBJECT = "Interlock-Owner-Subject"
"""The subject the message was read on (what it may reach is decided from it)."""
ACK = "Interlock-Owner-Ack"
"""The JetStream reply subject of the message's delivery (its stream, sequence and
deliveries: a dead letter about it is stored once, however often it comes)."""
DONE, DEFERRED, FAILED, GONE = "done", "deferred", "failed", "gone"

Handler = Callable[[Msg], Awaitable[object]]
DeadLetter = Callable[[Msg, str, str], Awaitable[None]]


def run_timer(run_id: str, timer_id: str) -> bool:
    """Whether a timer is a run's own (decided by the run), not a trigger window's, a
    rate's, a stopping attempt's or a retention's (kept by key, decided by any
    replica)."""
    return not (
        is_window_timer(timer_id)
        or is_rate_timer(run_id, timer_id)
        or is_stop_timer(run_id, timer_id)
        or is_retention_timer(run_id, timer_id)
    )


class HandedFailed(Exception):
    """The holder could not decide a message now: it is retried, like a local failure."""


class Handover:
    """The reading side: hands a run's message to its partition's holder."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        placement: Placement,
        held: Callable[[], Collection[int]],
        counters: Counter[str],
        *,
        timeout: float = HAND_TIMEOUT_S,
    ) -> None:
        """``held``: the partitions this replica holds now."""
        self._nc, self._subjects, self._placement = nc, subjects, placement
        self._held, self._counters, self._timeout = held, counters, timeout

    async def hand(self, kind: str, run_id: str, msg: Msg) -> str | None:
        """What the holder of ``run_id``'s partition said once it decided ``msg`` (settle
        it as handled); None: decide it here (one partition, this replica's own, or no
        reply). Raises :class:`Deferred` or :class:`HandedFailed` as the holder says."""
        placement = self._placement
        if placement.map.relayed <= 1 or not is_run_id(run_id):
            return None
        try:
            partition = await placement.locate(run_id)
        # Where a run is could not be read: decided here, as before partitions.
        except Exception as exc:  # noqa: BLE001
            log.debug("cannot locate run %s to hand it over: %s", run_id, exc)
            return None
        if partition in self._held():
            return None
        headers = dict(msg.headers or {})
        headers[SUBJECT] = msg.subject
        if msg.reply:
            headers[ACK] = msg.reply
        else:
            headers.pop(ACK, None)
        subject = self._subjects.owner(partition, kind, run_id)
        try:
            reply = await self._nc.request(subject, msg.data, self._timeout, headers=headers)
        except NoRespondersError:
            self._counters["handovers_unheld"] += 1
            return None
        except NatsTimeoutError:
            self._counters["handovers_unanswered"] += 1
            log.info("partition %d: no reply from its holder about run %s", partition, run_id)
            return None
        # Too large with the headers added, a connection between two servers: here.
        except Exception as exc:  # noqa: BLE001
            log.info("partition %d: cannot hand a message of run %s: %s", partition, run_id, exc)
            return None
        outcome = (reply.headers or {}).get(OUTCOME)
        detail = (reply.headers or {}).get(DETAIL, "")
        if outcome == DONE:
            self._counters["handovers_handed"] += 1
            return detail
        if outcome == DEFERRED:
            try:
                delay = float(detail)
            except ValueError:
                delay = 1.0
            raise Deferred(delay)
        if outcome == FAILED:
            raise HandedFailed(f"partition {partition}'s holder: {detail}")
        self._counters["handovers_unheld"] += 1  # gone: it lets the partition go
        return None


class OwnerDesk:
    """The holding side: decides the messages handed to the partitions it holds, with the
    handler of each kind, and replies how that went."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        handlers: Mapping[str, Handler],
        dead_letter: DeadLetter,
    ) -> None:
        self._nc, self._subjects = nc, subjects
        self._handlers = handlers
        self._dead_letter = dead_letter
        self._subs: dict[int, Subscription] = {}
        self._working: set[asyncio.Task[None]] = set()
        self._open = True
        self.decided = 0
        """Messages decided here for another replica."""

    @property
    def serving(self) -> set[int]:
        """The partitions whose messages are taken here now."""
        return set(self._subs)

    async def hold(self, partitions: Collection[int]) -> None:
        """Take the messages of ``partitions`` from now on (and no longer the others')."""
        for p in set(self._subs) - set(partitions):
            sub = self._subs.pop(p)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if not self._open:
            return
        for p in sorted(set(partitions) - set(self._subs)):
            subject = self._subjects.owned(p)
            direct = direct_subscriber(self._nc)
            if direct is not None:
                self._subs[p] = await direct(subject, self._take)
            else:
                self._subs[p] = await self._nc.subscribe(subject, cb=self._on)

    async def stop(self, grace: float = 2.0) -> None:
        """No new message is taken; those in hand get ``grace`` seconds (a replica that
        gets no reply decides the message itself)."""
        self._open = False
        await self.hold(())
        if self._working:
            _, late = await asyncio.wait(set(self._working), timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _on(self, msg: Msg) -> None:
        self._take(msg)

    def _take(self, msg: Msg) -> None:
        # Only orchestrators may publish here, and they reply on their inboxes: a reply
        # subject of any other kind is not theirs, and is neither decided nor answered.
        if not msg.reply or not is_inbox(msg.reply):
            return
        if not self._open:
            # Stopping (or letting the partition go): the reader decides it at once
            # rather than after its timeout.
            self._spawn(self._reply(msg, GONE, ""))
            return
        # The readers that hand messages over bound how many come at once (each holds at
        # most its consumers' batches in hand).
        self._spawn(self._decide(msg))

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._working.add(task)
        task.add_done_callback(self._working.discard)

    async def _decide(self, msg: Msg) -> None:
        kind = msg.subject.split(".")[-2]
        handler = self._handlers.get(kind)
        headers = dict(msg.headers or {})
        subject = headers.pop(SUBJECT, "")
        ack = headers.pop(ACK, "")
        if handler is None or not subject:
            return
        inner = delivered_elsewhere(self._nc, subject, msg.data, headers or None, ack)
        outcome, detail = DONE, ""
        try:
            said = await handler(inner)
            if isinstance(said, str):
                detail = said
            self.decided += 1
        except Deferred as deferred:
            outcome, detail = DEFERRED, f"{deferred.delay:.3f}"
        except FINAL as exc:
            try:
                await self._dead_letter(inner, final_reason(exc), str(exc))
            except Exception as error:  # noqa: BLE001
                outcome, detail = FAILED, f"cannot dead-letter it: {error}"
        # The reader retries it, as it would its own failure.
        except Exception as exc:  # noqa: BLE001
            outcome, detail = FAILED, str(exc)[:500]
        await self._reply(msg, outcome, detail)

    async def _reply(self, msg: Msg, outcome: str, detail: str) -> None:
        reply = {OUTCOME: outcome, DETAIL: detail}
        nc = self._nc
        try:
            if not (isinstance(nc, NatsClient) and nc.publish_nowait(msg.reply, headers=reply)):
                await nc.publish(msg.reply, b"", headers=reply)
        # The reader that gets no reply decides it itself (the run takes it once).
        except Exception:
            log.debug("cannot reply about a message handed over on %s", msg.subject, exc_info=True)


class Handlers(NamedTuple):
    """How this replica decides each kind of message itself."""

    event: Handler
    """An inbound event (from the ``ingress`` consumer)."""
    result: Handler
    """An answer on the results stream."""
    timer: Callable[[str, str], Awaitable[None]]
    """A due timer: (run id, timer id)."""
    deliver: Callable[[str, Incoming], Awaitable[bool]]
    """An event for a run, decided by it: whether the run took it."""


_HERE: ContextVar[bool] = ContextVar("interlock_decided_here", default=False)
"""Set while a message is decided here for want of a holder that answered: what it
delivers to its run is not handed over again (its timeout waited out once)."""


class Owners:
    """The shared consumers' messages of one replica: those of runs whose partition another
    replica holds handed to it, the others decided here, and those handed here decided."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        placement: Placement,
        held: Callable[[], Collection[int]],
        counters: Counter[str],
        *,
        handlers: Handlers,
        dead_letter: DeadLetter,
    ) -> None:
        self._subjects, self._nc, self._handlers = subjects, nc, handlers
        self.handover = Handover(nc, subjects, placement, held, counters)
        own = {
            EVENT: handlers.event,
            RESULT: handlers.result,
            TIMER: self._timer_fired,
            INCOMING: self._delivered,
        }
        self.desk = OwnerDesk(nc, subjects, own, dead_letter)

    async def on_event(self, msg: Msg) -> None:
        """An event from the ``ingress`` consumer: one addressed to a run goes to the run's
        holder; triggers start runs here (and events correlated to runs go to theirs, by
        :meth:`deliver`)."""
        route = self._subjects.inbound_route(msg.subject)
        run_id = route[0] if route is not None else None
        if not run_id or await self.handover.hand(EVENT, run_id, msg) is None:
            await self._handlers.event(msg)

    async def on_result(self, msg: Msg) -> None:
        """An answer from the results stream (its subject's last token names the run)."""
        if await self.handover.hand(RESULT, msg.subject.rpartition(".")[2], msg) is None:
            await self._handlers.result(msg)

    async def on_timer(self, run_id: str, timer_id: str) -> None:
        """A due timer: a run's own goes to the run's holder."""
        if run_timer(run_id, timer_id):
            fired = fired_message(self._nc, self._subjects, run_id, timer_id)
            if await self.handover.hand(TIMER, run_id, fired) is not None:
                return
        token = _HERE.set(True)
        try:
            await self._handlers.timer(run_id, timer_id)
        finally:
            _HERE.reset(token)

    async def deliver(self, run_id: str, incoming: Incoming) -> bool:
        """Decide ``incoming`` for the run (an event its correlation key reached it by), by
        the run's holder; whether the run took it."""
        if not _HERE.get():
            msg = Msg(
                self._nc,
                subject=self._subjects.owner(0, INCOMING, run_id),
                data=msgspec.json.encode(incoming),
            )
            said = await self.handover.hand(INCOMING, run_id, msg)
            if said is not None:
                return said == TAKEN
        return await self._handlers.deliver(run_id, incoming)

    async def _timer_fired(self, msg: Msg) -> None:
        """A fired timer handed over by another replica."""
        token = _HERE.set(True)
        try:
            await self._handlers.timer(*read_fired(msg.subject, msg.data))
        finally:
            _HERE.reset(token)

    async def _delivered(self, msg: Msg) -> str:
        """An event for a run handed over by another replica; whether the run took it."""
        incoming = msgspec.json.decode(msg.data, type=Incoming)
        taken = await self._handlers.deliver(msg.subject.rpartition(".")[2], incoming)
        return TAKEN if taken else ""
