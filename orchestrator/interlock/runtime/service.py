"""``interlock serve``: the orchestrator.

Three durable pull consumers and one request service, all stateless to restart:

- ingress: CloudEvents on ``<prefix>.events.>`` start runs (triggers) or reach the run
  named by their ``runid`` extension. Invalid messages go to the dead-letter stream.
- answers: agents' answers, by request on ``<prefix>.answer.>`` (:mod:`answering`: replied
  to once in the run's log) or from the results stream on ``<prefix>.results.>`` (the way
  that works while no orchestrator is up), are checked and decided on by their run.
- relay (the outbox): every appended run-log record is read back from the RUNS stream and
  acted on: action requests are published to capability subjects with a deterministic
  ``Nats-Msg-Id``, cancellations are told to agents, and the run index is written behind
  the runs (:mod:`writebehind`: once for a short run, with the deadlines the answers beat
  never scheduled). Effects follow the log, never precede it, so a crash anywhere re-does
  them without duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import BadRequestError, ServiceUnavailableError

from interlock.core import events as ev
from interlock.core.analysis import acted_on
from interlock.core.bounds import max_event_bytes
from interlock.core.definition import Definition
from interlock.core.engine import (
    TASK_FAILED,
    Incoming,
    decide,
    decided,
    derive_run_id,
    plus_seconds,
)
from interlock.core.ids import InvalidRunId
from interlock.core.incoming import heavy_value
from interlock.core.rfc3339 import parse_time
from interlock.core.state import RunState
from interlock.core.vocabulary import ErrorClass
from interlock.runtime import eventloop, writebehind
from interlock.runtime.addressing import Refused, admit
from interlock.runtime.answering import AnswerDesk, AnswerReply
from interlock.runtime.answers import (
    LATE_REFUSALS,
    AnswerKey,
    AnswerRefused,
    Answers,
    late_reason,
)
from interlock.runtime.errors import InvalidInputs, UnknownRun, UnknownWorkflow
from interlock.runtime.fairness import PUBLISHER_BUDGET, Deferred, publisher_lane
from interlock.runtime.flow import ControlFlow, to_incoming
from interlock.runtime.foreign import REASON as FOREIGN_RECORD
from interlock.runtime.foreign import Foreign, ForeignReport, dead_letter_foreign
from interlock.runtime.keeper import TaskQueueKeeper
from interlock.runtime.logstore import RecordsTooLarge, RunLog, check_message
from interlock.runtime.observe import Observers, OrchestratorObserver
from interlock.runtime.registry import Registry
from interlock.runtime.retention import Policy
from interlock.runtime.routing import Start, starts
from interlock.runtime.runindex import INDEXED, RunIndex
from interlock.runtime.runs import Decided, Opening, Runs
from interlock.runtime.schemas import SchemaMismatch
from interlock.runtime.snapshots import Snapshots
from interlock.runtime.taskqueue import TaskQueue
from interlock.runtime.timers import JetStreamTimers, Timers
from interlock.runtime.writebehind import WriteBehind
from interlock.transport import tasks
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent, decode_message
from interlock.transport.consuming import (
    ConsumerMismatch,
    Overlap,
    dead_letter_data,
    dead_letter_headers,
    durable_reader,
    ensure_consumer,
    in_progress,
)
from interlock.transport.jetstream import jetstream
from interlock.transport.natsclient import ack_nowait
from interlock.transport.provision import provision
from interlock.transport.pulling import BatchReader, deliveries, stream_sequence
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

MAX_DELIVERIES = 10
"""A message that fails this often is dead-lettered instead of retried forever."""
ACK_WAIT = 10.0
"""Default ack wait of the orchestrator's consumers: how long the messages a killed
orchestrator had taken wait before another process gets them. Slow batches send progress
acks, so this bounds recovery after a crash, not the time a batch may take."""
FETCH_BATCH = 128
SLOW_AFTER_S = 0.2
"""A message still in hand this long after its batch was fetched is left to finish by
itself while the next batch is fetched (a costly evaluation waiting for its thread)."""
SLOW_HELD = 2 * FETCH_BATCH
"""Messages of earlier batches a consumer loop may hold in hand so (beyond, it waits)."""
DEFERRALS_KEPT = 20_000
"""Deferred events whose deferrals are remembered (an event deferred by another replica,
or forgotten here, counts its deferrals as deliveries)."""
EARLY_KEPT = 4_096
"""Actions dispatched as their request's append was acknowledged, remembered until the
relay reads the request back (the oldest are forgotten first: the relay then publishes
again, and the message id makes that a no-op)."""

Early = asyncio.Task[bool] | asyncio.Future[Msg]
"""An early dispatch: the task that awaits it, or the future of its acknowledgement."""

Effects = tuple[list[ev.AnyRecord], list[ev.TimerScheduled]]
"""The records of a run acted on, and the timers left to the write-behind."""

DISPATCH_CHECK_AGE_S = 60.0
"""An action request read later than this after it was appended is checked against the
run's log before it is published: the capability stream's dedupe window is two minutes."""


class Orchestrator:
    """The router, engine shell and dispatcher of one orchestrator process."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        clock: Callable[[], str] = utc_now,
        cache_size: int = 10_000,
        observers: Sequence[OrchestratorObserver] = (),
        replicas: int = 1,
        timers: Timers | None = None,
        ack_wait: float = ACK_WAIT,
        task_ack_wait: float = tasks.TASK_ACK_WAIT,
        index_hold: float = writebehind.HOLD,
        group_commit: int = 0,
        retention: Policy | None = None,
    ) -> None:
        self.observers = Observers(observers)
        self.ack_wait = ack_wait
        """Seconds before a message taken by a process that died is handed out again."""
        self.task_ack_wait = task_ack_wait
        """The ack wait of the capability consumers this process creates (workers send
        progress acks: it bounds how soon a killed worker's task goes to another)."""
        self.replicas = replicas
        """Stream replicas when provisioning (3 on a JetStream cluster)."""
        self.nc, self.js, self.subjects, self.clock = nc, jetstream(nc), subjects, clock
        self.registry = Registry(self.js, subjects)
        self.run_log = RunLog(nc, subjects, group_commit=group_commit, foreign=self._report())
        self.runs = Runs(
            self.run_log,
            self.registry,
            clock=clock,
            cache_size=cache_size,
            observer=self.observers,
            keep_appended=True,  # the relay reads them back
            snapshots=Snapshots(nc, subjects, write=True, key=self.run_log.key),
        )
        self.counters: Counter[str] = Counter()
        self._deferrals: OrderedDict[tuple[str, int], int] = OrderedDict()
        """Times each message was deferred, by consumer and stream sequence (the latest)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._early: OrderedDict[tuple[str, int], Early] = OrderedDict()
        self.runs.on_appended = self._dispatch_early
        self.runs.on_appending = self._ready_requests
        self._ready: OrderedDict[tuple[str, int], tuple[str, dict[str, str], bytes]] = OrderedDict()
        """Task requests made ready while the append of the records that ask for them is
        out (subject, headers, payload), by action and attempt."""
        self._stopping = asyncio.Event()
        self._registry_check: asyncio.Future[None] | None = None
        """The registry check of the ingress batch last fetched (see _check_registry)."""
        self._registry_checks: set[asyncio.Future[None]] = set()
        """Every registry check still out (batches overlap): all are cancelled on stop."""
        self.index = RunIndex(nc, subjects)
        self.keeper = TaskQueueKeeper(nc, subjects, lambda: self.counters["actions_dispatched"])
        self.answers = Answers(self.js, subjects)
        self.desk = AnswerDesk(nc, subjects, self._take_answer, self._dead_letter)
        self._task_consumers: set[str] = set()
        """Capabilities whose consumer this process has made sure of."""
        self.queue = TaskQueue(self.js, subjects)
        self.flow = ControlFlow(
            nc,
            subjects,
            queue=self.queue,
            runs=self.runs,
            registry=self.registry,
            timers=timers or JetStreamTimers(nc, subjects),
            clock=clock,
            deliver=self.deliver,
            answers=self.answers,
            retention=retention or Policy(),
        )
        self.behind = self._write_behind(index_hold)

    def _write_behind(self, hold: float) -> WriteBehind:
        """The relay's write-behind of the run index (see :mod:`writebehind`)."""
        return WriteBehind(
            self.index,
            self.observers.relayed,
            # Timers scheduled by a stream write wait for the flush; in-memory ones, at once.
            schedule=(
                self._schedule_timer if isinstance(self.flow.timers, JetStreamTimers) else None
            ),
            stale=self.flow.known_stale,
            hold=hold,
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry.on_capabilities(self._capabilities_learnt)
        wait = 0.5
        while True:
            try:
                await self._prepare()
                break
            except (NatsTimeoutError, NoRespondersError, ServiceUnavailableError) as exc:
                # JetStream is not answering yet (a server that just restarted, a leader
                # election): try again rather than exit; anything else is raised.
                if self._stopping.is_set():
                    raise
                log.warning("JetStream not ready (%s); starting again in %.1fs", exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)
        await self.registry.watch()
        await self.flow.admission.start()  # the paused workflows known before any start
        await self.index.start()
        self.keeper.start()
        s = self.subjects
        self._tasks = [
            asyncio.create_task(
                self._consume(
                    s.events_stream,
                    s.events_all,
                    "ingress",
                    self._on_ingress,
                    before=self._check_registry,
                )
            ),
            asyncio.create_task(
                self._consume(s.results_stream, s.results_all, "results", self._on_result)
            ),
            asyncio.create_task(self._relay()),
        ]
        await self.desk.start()
        self.flow.start()
        loop = eventloop.loop_name(asyncio.get_running_loop())
        log.info("orchestrator started (prefix %s, event loop %s)", s.prefix, loop)

    async def _prepare(self) -> None:
        """Streams, the token key, definitions and task consumers: each step idempotent."""
        await provision(self.js, self.subjects, replicas=self.replicas, secrets=True)
        await self.answers.load()
        await self.run_log.key()
        await self.registry.load()
        for capability in sorted(self.registry.known_capabilities()):
            await self._ensure_task_consumer(capability)

    async def stop(self) -> None:
        self._stopping.set()
        await self.desk.stop()
        # Stopping: what ended the task was logged where it happened.
        await cancel_and_wait(*self._tasks)
        # Then every registry check still out (the loops, ended, start no more).
        await cancel_and_wait(*self._registry_checks)
        await self.behind.stop()
        await self.keeper.stop()
        await self.flow.stop()
        await self.registry.close()

    def loop_failure(self) -> str | None:
        """Why a consumer loop ended (None while every loop runs, or after :meth:`stop`).

        The loops retry what fails inside them; one that ended anyway (say, its consumer
        could not be created while JetStream was failing over) never comes back by
        itself: a restart of the process does.
        """
        if self._stopping.is_set():
            return None  # a loop that saw the stop flag ended on purpose
        for task in self._tasks:
            if task.done() and not task.cancelled():
                error = task.exception()
                return f"a consumer loop ended: {error!r}" if error else "a consumer loop ended"
        return None

    async def run_forever(self) -> None:
        await self.start()
        try:
            await self._stopping.wait()
        finally:
            await self.stop()

    # -- consuming ------------------------------------------------------------------------

    async def _consume(
        self,
        stream: str,
        subject: str,
        durable: str,
        handler: Callable[[Msg], Awaitable[None]],
        *,
        before: Callable[[], None] | None = None,
    ) -> None:
        """``before``: called as each fetched batch is handed over, before its messages."""
        reader = await self._reader(stream, subject, durable, FETCH_BATCH, 10_000)
        # aclosing: the reader stops (and hands back what it holds) in this task, at once,
        # however the loop ends, not whenever the generator happens to be collected.
        overlap = Overlap(limit=SLOW_HELD, after=SLOW_AFTER_S, every=self.ack_wait / 3)

        async def guarded(msg: Msg) -> None:
            await self._guarded(handler, msg, durable)

        try:
            async with contextlib.aclosing(reader.batches(self._stopping)) as batches:
                async for msgs in batches:
                    async with self._working(msgs):
                        if before is not None:
                            before()
                        await overlap.handle(msgs, guarded)
        finally:
            await overlap.close()

    async def _reader(
        self, stream: str, subject: str, durable: str, size: int, max_ack_pending: int
    ) -> BatchReader:
        """The durable consumer, made sure of, read in batches of up to ``size``."""
        return await durable_reader(
            self.nc,
            self.js,
            stream=stream,
            subject=subject,
            durable=durable,
            size=size,
            max_ack_pending=max_ack_pending,
            ack_wait=self.ack_wait,
            stopping=self._stopping,
            log=log,
        )

    def _working(self, msgs: Sequence[Msg]) -> contextlib.AbstractAsyncContextManager[None]:
        """While a batch is handled, tell JetStream it is (a slow batch is not redelivered)."""
        return in_progress(msgs, self.ack_wait / 3)

    def _check_registry(self) -> None:
        """Start making sure the registry knows every workflow applied before the events
        just fetched were published: its request goes out before their handlers run, and
        they are decoded and routed meanwhile; a start waits for its answer
        (:meth:`_registry_checked`)."""
        # A check still out for the batch before may have been answered before these
        # events were published: this batch gets its own (the one before's handlers that
        # have not looked yet wait for this one, which covers theirs too).
        check = self.registry.sync_soon()
        self._registry_checks.add(check)
        check.add_done_callback(self._registry_check_ended)
        self._registry_check = check

    def _registry_check_ended(self, check: asyncio.Future[None]) -> None:
        self._registry_checks.discard(check)
        if not check.cancelled() and (error := check.exception()) is not None:
            # Said once per check, however many events waited for it.
            log.warning("ingress: registry sync failed: %s", error)

    async def _registry_checked(self) -> None:
        """Wait for the registry check of the batch being handled (or a later one)."""
        check = self._registry_check
        if check is not None and not check.done():
            # Route with what is known rather than not at all (the failure is logged
            # where the check ends).
            with contextlib.suppress(Exception):
                await asyncio.shield(check)

    async def _guarded(
        self, handler: Callable[[Msg], Awaitable[None]], msg: Msg, where: str
    ) -> None:
        """One message: handled and acked, retried later, or dead-lettered. Never raises."""
        # A deferral is a delivery to JetStream, not a failure: neither a redelivery to
        # count nor a step towards the dead letter.
        key = (where, stream_sequence(msg))
        delivered = deliveries(msg) - self._deferrals.get(key, 0)
        if delivered > 1:
            self.observers.redelivered(where)
        try:
            await handler(msg)
            if not ack_nowait(msg):
                await msg.ack()
            self._deferrals.pop(key, None)
        except Deferred as deferred:
            self.counters["events_deferred"] += 1
            self.observers.deferred()
            self._deferrals[key] = self._deferrals.pop(key, 0) + 1
            if len(self._deferrals) > DEFERRALS_KEPT:
                self._deferrals.popitem(last=False)
            # Best effort: a message left unsettled comes again after its ack wait.
            with contextlib.suppress(Exception):
                await msg.nak(delay=deferred.delay)
        except (RecordsTooLarge, InvalidRunId) as exc:
            # Another delivery would fail the same way: dead-letter it at once.
            reason = "too-large" if isinstance(exc, RecordsTooLarge) else "bad-run-id"
            log.warning("%s: dead-lettering (%s): %s", where, reason, exc)
            try:
                await self._dead_letter(msg, reason, str(exc))
            # Not stored anywhere else yet: keep it, and try again later.
            except Exception:  # noqa: BLE001
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.nak(delay=30.0)
                return
            # Best effort: a message left unsettled comes again after its ack wait.
            with contextlib.suppress(Exception):
                await msg.ack()
        # A consumer loop outlives any one message.
        except Exception as exc:  # noqa: BLE001
            if delivered >= MAX_DELIVERIES:
                # The reason is the message: no traceback.
                log.error("%s: dead-lettering after %d attempts: %s", where, delivered, exc)  # noqa: TRY400
                try:
                    await self._dead_letter(msg, "processing-failed", str(exc))
                # A consumer loop outlives any one message.
                except Exception:  # noqa: BLE001
                    # Not stored anywhere else yet: keep it, and try again later.
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=30.0)
                    return
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.ack()
            else:
                log.warning("%s: will retry (%d): %s", where, delivered, exc)
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    # About two minutes in all before giving up: longer than a JetStream
                    # leader election (4-7 s) or a server restart.
                    await msg.nak(delay=min(0.5 * 2**delivered, 30.0))

    async def _dead_letter(self, msg: Msg, reason: str, detail: str) -> None:
        headers = dead_letter_headers(msg, reason, detail)
        # No JetStream metadata (a core message): no dedupe id, nothing else lost.
        with contextlib.suppress(Exception):  # a redelivered message is dead-lettered once
            where = f"{msg.metadata.stream}.{msg.metadata.sequence.stream}"
            digest = hashlib.sha256(f"{reason}\n{detail}".encode()).hexdigest()[:16]
            headers["Nats-Msg-Id"] = f"{where}.{digest}"
        self.counters[f"dead_lettered:{reason}"] += 1
        self.observers.dead_lettered(reason)
        data = dead_letter_data(msg.data, headers, self.nc.max_payload)
        try:
            await self.js.publish(self.subjects.dead_letter(reason), data, headers=headers)
        except Exception as exc:
            # Raised on: the message is acked only once its dead letter is stored.
            # The reason is the message: no traceback.
            log.error("could not dead-letter a message (%s): %s", reason, exc)  # noqa: TRY400
            raise

    def _decode(self, msg: Msg) -> CloudEvent:
        return decode_message(msg.headers, msg.data)

    # -- ingress --------------------------------------------------------------------------

    async def _on_ingress(self, msg: Msg) -> None:
        lane = publisher_lane(self.subjects, msg.subject)
        if self.runs.lanes.pending(lane) >= PUBLISHER_BUDGET:
            # This publisher's costly evaluations fill its share of the thread: its event
            # waits in JetStream, not in hand, so the consumer goes on to others' events.
            raise self.runs.lanes.defer(lane)
        # An external event is copied into the logs of the runs it reaches: one larger
        # than a quarter of the server's payload limit could not be recorded.
        limit = max_event_bytes(self.nc.max_payload)
        if len(msg.data) > limit:
            await self._dead_letter(
                msg,
                "too-large",
                f"the event takes {len(msg.data):,} bytes; events take at most {limit:,}",
            )
            return
        try:
            event = self._decode(msg)
        except InvalidCloudEvent as exc:
            await self._dead_letter(msg, exc.reason, str(exc))
            return
        try:
            # What the event may reach is what its subject (whose publishers NATS checks)
            # allows: see interlock.runtime.addressing.
            event, run_id = admit(self.subjects, msg.subject, event)
        except Refused as exc:
            await self._dead_letter(msg, exc.reason, exc.detail)
            return
        incoming = to_incoming(event)
        self.counters["events_received"] += 1
        if run_id:
            delivered = await self.deliver(run_id, incoming)
            if not delivered:
                self.counters["events_unrouted"] += 1
                self.observers.unrouted(event.type)
            return
        started = 0
        # Routed, and the runs' first records decided, with what is known while the
        # registry check of this batch is out; done again in the rare case that it
        # brought in a workflow (or version) of this type.
        triggered = list(self.registry.triggered_by(event.type))
        found = await starts(triggered, incoming, self.runs, lane)
        openings = await self._openings(found, event, incoming)
        await self._registry_checked()
        now_triggered = list(self.registry.triggered_by(event.type))
        if not _same(triggered, now_triggered):
            found = await starts(now_triggered, incoming, self.runs, lane)
            openings = await self._openings(found, event, incoming)
        for start, opening in zip(found, openings, strict=True):
            if start.error is not None:
                await self._dead_letter(msg, "bad-trigger-input", start.error)
                continue
            if isinstance(opening, InvalidInputs):
                await self._dead_letter(msg, "invalid-inputs", str(opening))
                continue
            assert opening is not None
            created, _ = await self.runs.open(opening)
            started += 1
            self.counters["runs_started" if created else "triggers_duplicate"] += 1
        correlated, refused = await self.flow.route_correlated(event, lane)
        for reason in refused:
            await self._dead_letter(msg, "bad-correlation-key", reason)
        if correlated:
            return
        if not started:
            self.counters["events_unrouted"] += 1
            self.observers.unrouted(event.type)

    async def _openings(
        self, found: list[Start], event: CloudEvent, incoming: Incoming
    ) -> list[Opening | InvalidInputs | None]:
        """The first records of each run ``found`` starts (None where its trigger's input
        could not be rendered; the inputs' problems where they do not fit the workflow)."""
        out: list[Opening | InvalidInputs | None] = []
        for start in found:
            if start.error is not None:
                out.append(None)
                continue
            definition = start.definition
            try:
                out.append(
                    await self.runs.opening(
                        definition,
                        start.version,
                        derive_run_id(definition, event.source, event.id),
                        start.inputs,
                        trigger=incoming,
                        traceparent=event.extensions.get("traceparent"),
                        paused=self.flow.admission.pauses.holds(
                            definition.namespace, definition.name
                        ),
                    )
                )
            except InvalidInputs as exc:
                out.append(exc)
        return out

    async def deliver(
        self, run_id: str, incoming: Incoming, *, answer: AnswerKey | None = None
    ) -> bool:
        """Decide on ``incoming`` for the run.

        ``answer``: the attempt an agent's answer speaks for; the run must await it (else
        :class:`AnswerRefused` is raised and nothing is appended), and its data must match
        the capability's output schema.
        """
        now = self.clock()
        # Converting many values for CEL costs in proportion: decided off the loop.
        heavy = heavy_value(incoming.data)

        def decision(definition: Definition, state: RunState) -> Decided:
            event = incoming
            if answer is not None:
                Answers.check_awaited(answer, state)
                event = self._check_output(incoming, state)
            return Decided(*decided(definition, state, event, now))

        async with self.runs.locked(run_id):
            try:
                try:
                    records = await self.runs.apply(run_id, decision, heavy=heavy)
                except AnswerRefused:
                    # The cached state may be behind the log (another replica dispatched
                    # the attempt): refuse only what the log itself does not await.
                    self.runs.forget(run_id)
                    records = await self.runs.apply(run_id, decision, heavy=heavy)
            except (UnknownRun, UnknownWorkflow):
                return False
            except RecordsTooLarge as exc:
                if not answer or incoming.type == TASK_FAILED:
                    raise
                # The answer cannot be recorded: the attempt fails with that reason, now,
                # instead of the run waiting for an answer that never lands.
                failed = too_large_answer(incoming, str(exc))
                records = await self.runs.apply(
                    run_id, lambda definition, state: decide(definition, state, failed, now)
                )
        return bool(records)

    # -- results --------------------------------------------------------------------------

    async def _on_result(self, msg: Msg) -> None:
        await self._take_answer(msg)

    async def _take_answer(self, msg: Msg) -> AnswerReply:
        """Check an agent's answer (from the results stream or a request) and decide on it;
        a refused one is dead-lettered with its reason. Raises when it cannot be taken now."""
        try:
            event = self._decode(msg)
        except InvalidCloudEvent as exc:
            await self._dead_letter(msg, exc.reason, str(exc))
            return tasks.ANSWER_REFUSED, exc.reason
        key: AnswerKey | None = None
        try:
            key = self.answers.key_of(msg.subject, event, msg.headers)
            await self.deliver(key.run_id, to_incoming(event), answer=key)
        except AnswerRefused as exc:
            late = await self._late(key, exc)
            if late is not None:
                log.debug("late answer on %s dropped (%s): %s", msg.subject, late, exc.detail)
                self.counters[f"answers_late:{late}"] += 1
                self.observers.answer_late(late)
                return tasks.ANSWER_LATE, late
            log.warning("refused an answer on %s: %s", msg.subject, exc.detail)
            await self._dead_letter(msg, exc.reason, exc.detail)
            return tasks.ANSWER_REFUSED, exc.reason
        return tasks.ANSWER_RECORDED, None

    async def _late(self, key: AnswerKey | None, refused: AnswerRefused) -> str | None:
        """Why the run stopped waiting for the attempt an authentic answer speaks for, when
        it did so itself (None: a dead letter). Reads the run's log: refusals are rare."""
        if key is None or refused.reason not in LATE_REFUSALS:
            return None
        records, _ = await self.runs.log.read(key.run_id)
        return late_reason(records, key)

    def _check_output(self, incoming: Incoming, state: RunState) -> Incoming:
        """An answer whose data break the capability's output_schema fails as schema_error."""
        if incoming.type == TASK_FAILED:
            return incoming
        # The capability is the one the run asked for, whatever the answer claims.
        pending = state.pending.get(incoming.extensions.get("actionid", ""))
        if pending is None:
            return incoming  # not awaited: decide ignores it
        capability = self.registry.capability(pending.capability)
        schemas = self.registry.schemas(pending.capability)
        if capability is None or schemas is None or schemas.output is None:
            return incoming
        try:
            schemas.output.check(incoming.data)
        except SchemaMismatch as exc:
            where = exc.where
            data = {
                "error": {
                    "class": ErrorClass.SCHEMA_ERROR,
                    "message": f"output of {capability.name} does not match its output_schema "
                    f"at {where}: {exc.message}",
                }
            }
            return Incoming(
                type=TASK_FAILED,
                source=incoming.source,
                id=incoming.id,
                data=data,
                time=incoming.time,
                extensions=incoming.extensions,
            )
        return incoming

    # -- the relay (outbox) ---------------------------------------------------------------

    async def _relay(self) -> None:
        s = self.subjects
        reader = await self._reader(s.runs_stream, s.runs_all, "relay", 512, 20_000)
        async with contextlib.aclosing(reader.batches(self._stopping)) as batches:
            async for msgs in batches:
                await self._relay_batch(msgs)

    async def _relay_batch(self, msgs: list[Msg]) -> None:
        """Act on one batch of run-log messages: effects per run, then ack and report."""
        by_run: dict[str, list[ev.AnyRecord]] = {}
        msgs_of: dict[str, list[Msg]] = {}
        # Runs whose requests are checked against their log (redelivered, or old), and
        # runs with records read from the stream (their requests' times say if old).
        again: set[str] = set()
        dated: set[str] = set()
        oldest = time.monotonic() - DISPATCH_CHECK_AGE_S
        key = await self.run_log.key()
        for msg in msgs:
            try:
                # Appended by this process: its records are at hand, no need to decode,
                # and the time of the append says whether they are old.
                seq = stream_sequence(msg)
                held = self.runs.appended(seq)
                if held is None:
                    stream = self.subjects.runs_stream
                    found = check_message(key, stream, msg.subject, seq, msg.headers, msg.data)
                    if found is not None:
                        self.run_log.foreign.saw(found)
                        batch = []  # not a record: acked below, never acted on
                    else:
                        batch = ev.decode_batch(msg.data)
                    if batch:
                        dated.add(batch[0].subject)
                else:
                    batch = held[0]
                    if batch and held[1] < oldest:
                        again.add(batch[0].subject)
            # A consumer loop outlives any one message.
            except Exception as exc:  # noqa: BLE001
                # The reason is the message: no traceback.
                log.error("relay: undecodable run-log message on %s: %s", msg.subject, exc)  # noqa: TRY400
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.ack()
                continue
            if not batch:
                # Best effort: a message left unsettled comes again after its ack wait.
                with contextlib.suppress(Exception):
                    await msg.ack()
                continue
            run_id = batch[0].subject
            by_run.setdefault(run_id, []).extend(batch)
            msgs_of.setdefault(run_id, []).append(msg)
            if deliveries(msg) > 1:
                again.add(run_id)
                self.observers.redelivered("relay")
        runs = list(by_run)
        outcomes = await self._runs_effects(runs, by_run, msgs, again=again, dated=dated)
        for run_id, outcome in zip(runs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("relay: effects of run %s failed, will redo: %s", run_id, outcome)
                for msg in msgs_of[run_id]:
                    # Best effort: a message left unsettled comes again after its ack wait.
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=1)
                continue
            acted, timers = outcome
            if self.behind.holds(run_id) or timers or any(isinstance(r, INDEXED) for r in acted):
                # Acknowledged once the run's index entry is written (write-behind).
                self.behind.add(run_id, acted, by_run[run_id], msgs_of[run_id], timers)
                continue
            try:
                for msg in msgs_of[run_id]:
                    if not ack_nowait(msg):
                        await msg.ack()
            # It comes again, and is reported then.
            except Exception as exc:  # noqa: BLE001
                log.warning("relay: cannot acknowledge run %s: %s", run_id, exc)
                continue
            # Reported once done and acknowledged: a run whose effects failed here is
            # redone (and reported) by whichever replica gets it next, not twice.
            self.observers.relayed(run_id, by_run[run_id])

    async def _runs_effects(
        self,
        runs: list[str],
        by_run: dict[str, list[ev.AnyRecord]],
        msgs: list[Msg],
        *,
        again: set[str],
        dated: set[str],
    ) -> list[Effects | BaseException]:
        """The effects of each run's records (or why they failed), in the order of ``runs``."""
        # A run's effects are done in log order; different runs go in parallel. Most
        # need nothing awaited (their actions dispatched already): done here, no task.
        first = [
            self._effects_now(r, by_run[r], redelivered=r in again, dated=r in dated) for r in runs
        ]
        # Those whose requests' acknowledgements are on their way wait for them together.
        acks = {o for o in first if isinstance(o, asyncio.Future)}
        if acks:
            await asyncio.wait(acks)
        outcomes: list[Effects | BaseException | None] = []
        for run_id, now in zip(runs, first, strict=True):
            if isinstance(now, asyncio.Future):  # (only for runs neither redelivered nor dated)
                now = self._effects_now(run_id, by_run[run_id], dated=False)
            outcomes.append(None if isinstance(now, asyncio.Future) else now)
        later = [i for i, outcome in enumerate(outcomes) if outcome is None]
        if later:
            async with self._working(msgs):
                awaited = await asyncio.gather(
                    *(
                        self._effects(r, by_run[r], redelivered=r in again, dated=r in dated)
                        for r in (runs[i] for i in later)
                    ),
                    return_exceptions=True,
                )
            for i, result in zip(later, awaited, strict=True):
                outcomes[i] = result
        return [outcome for outcome in outcomes if outcome is not None]

    def _effects_now(
        self,
        run_id: str,
        records: list[ev.AnyRecord],
        *,
        redelivered: bool = False,
        dated: bool = True,
    ) -> Effects | asyncio.Future[Any] | None:
        """What :meth:`_effects` does, when none of it needs awaiting: records appended
        here lately whose action requests were dispatched and acknowledged already, and
        no other effect but timers left to the write-behind. When it returns None (some
        of it needs awaiting) or a future (the acknowledgement of an early dispatch still
        on its way: to wait for, before asking again), nothing is done that may not be
        done again."""
        if redelivered or dated:
            return None
        records = acted_on(records)
        now: datetime | None = None
        deferred: list[ev.TimerScheduled] = []
        dispatched: list[tuple[str, int]] = []
        for record in records:
            if isinstance(record, ev.ActionRequested) and not record.data.workflow:
                key = (record.data.action_id, record.data.attempt)
                early = self._early.get(key)
                if early is None:
                    return None
                if not early.done():
                    return early
                if not self._acknowledged(early):
                    return None
                dispatched.append(key)
            elif isinstance(record, ev.TimerScheduled):
                now = now or parse_time(self.clock())
                if not self.behind.defers(record, now):
                    return None
                deferred.append(record)  # scheduled at the flush, if still needed
                continue
            # What it did so far (noting an action's capability) bears doing again.
            if not self.flow.effect_now(record):
                return None
        for key in dispatched:
            del self._early[key]
        return records, deferred

    def _acknowledged(self, early: Early) -> bool:
        """Whether an early dispatch that is done was acknowledged."""
        if early.cancelled() or early.exception() is not None:
            return False
        if isinstance(early, asyncio.Task):
            return bool(early.result())
        try:
            self.js.acknowledged(early.result())
        # The awaited way reads it again, and dispatches once more.
        except Exception:  # noqa: BLE001
            return False
        return True

    async def _effects(
        self,
        run_id: str,
        records: list[ev.AnyRecord],
        *,
        redelivered: bool = False,
        dated: bool = True,
    ) -> Effects:
        """Do the effects of a run's records, in log order: the records acted on, and the
        timers left to the write-behind. ``redelivered``: the run's pending actions are
        read from its log first; ``dated``: so too if a request's time is old (False: the
        records were appended here lately)."""
        records = acted_on(records)  # a fork's copied history is not acted on again
        stale = redelivered or (
            dated
            and any(
                isinstance(r, ev.ActionRequested) and self._older_than(r.time, DISPATCH_CHECK_AGE_S)
                for r in records
            )
        )
        awaited = await self._still_awaited(run_id) if stale else None
        deferred: list[ev.TimerScheduled] = []
        now: datetime | None = None
        for record in records:
            if isinstance(record, ev.ActionRequested) and not record.data.workflow:
                d = record.data
                early = self._early.pop((d.action_id, d.attempt), None)
                if awaited is not None and awaited.get(d.action_id) != d.attempt:
                    # Redelivered after a crash (or read late), and the run no longer waits
                    # for this attempt: it was dispatched and answered before. Publishing it
                    # again once the dedupe window has passed would do the work twice.
                    continue
                if early is None or not await self._early_done(early, record):
                    await self._dispatch(record)
            elif isinstance(record, ev.TimerScheduled):
                now = now or parse_time(self.clock())
                if self.behind.defers(record, now):
                    deferred.append(record)  # scheduled at the flush, if still needed
                    continue
            effect = self.flow.effect(record)
            if effect is not None:
                await effect
        return records, deferred

    async def _schedule_timer(self, record: ev.TimerScheduled) -> None:
        await self.flow.timers.schedule(record.subject, record.data.timer_id, record.data.fire_at)

    def _older_than(self, time: str, seconds: float) -> bool:
        try:
            return plus_seconds(time, seconds) < self.clock()
        except ValueError:
            return False

    async def _still_awaited(self, run_id: str) -> dict[str, int] | None:
        """The action attempts the run is waiting for, read from its log (None: unknown)."""
        try:
            entry = await self.runs.load(run_id, fresh=True)
        # Dispatch without the check rather than stall.
        except Exception as exc:  # noqa: BLE001
            log.warning("relay: cannot read run %s to check its actions: %s", run_id, exc)
            return None
        if entry is None:
            return None
        return {p.action_id: p.attempt for p in entry.state.pending.values()}

    def _dispatch_early(self, records: Sequence[ev.AnyRecord]) -> None:
        """Dispatch the actions a decision made here requested as soon as its append is
        acknowledged, rather than when the relay reads the records back (a consumer's
        delivery later): the effect still follows the log. The relay then finds them
        dispatched; if this fails, or the process dies first, the relay dispatches them.
        A request that needs nothing awaited first is sent at once, without a task: the
        relay reads its acknowledgement (:meth:`_early_done`)."""
        for record in records:
            if not isinstance(record, ev.ActionRequested) or record.data.workflow:
                continue
            key = (record.data.action_id, record.data.attempt)
            if key in self._early or self._stopping.is_set():
                continue
            early: Early | None = self._send_now(record)
            if early is None:
                early = asyncio.get_running_loop().create_task(self._dispatch_now(record))
            self._early[key] = early
            while len(self._early) > EARLY_KEPT:
                self._early.popitem(last=False)

    def _ready_requests(self, records: Sequence[ev.AnyRecord]) -> None:
        """Make the task requests of a decision's action requests while its append is
        out (the server storing it), so that its acknowledgement is followed by nothing
        but their publishes. Encoding a request is pure: one made for an append that is
        refused is replaced by the next decision's, or forgotten."""
        for record in records:
            if not isinstance(record, ev.ActionRequested) or record.data.workflow:
                continue
            ready = self._request_of(record)
            if ready is not None:
                d = record.data
                self._ready[(d.action_id, d.attempt)] = ready
                while len(self._ready) > EARLY_KEPT:
                    self._ready.popitem(last=False)

    def _request_of(self, record: ev.ActionRequested) -> tuple[str, dict[str, str], bytes] | None:
        """The subject, headers and payload of an action's task request, if nothing needs
        awaiting first (its capability and consumer known, its input matching)."""
        d = record.data
        capability = self.registry.capability(d.capability)
        if capability is None or d.capability not in self._task_consumers:
            return None
        schemas = self.registry.schemas(d.capability)
        if schemas is not None and schemas.input is not None:
            try:
                schemas.input.check(d.input)
            except SchemaMismatch:
                return None  # the awaited way answers it as a failure
        headers, payload = self._task_request(record, capability.timeout_s)
        return self.subjects.capability(d.capability), headers, payload

    def _send_now(self, record: ev.ActionRequested) -> asyncio.Future[Msg] | None:
        """Publish the task request now, if nothing needs awaiting first (its capability
        and consumer known, its input matching): the future of its acknowledgement."""
        d = record.data
        ready = self._ready.pop((d.action_id, d.attempt), None) or self._request_of(record)
        if ready is None:
            return None
        subject, headers, payload = ready
        sent = self.js.request_ack_soon(subject, payload, headers=headers)
        if sent is not None:
            self.observers.dispatched(record, headers)
            self.counters["actions_dispatched"] += 1
        return sent

    async def _early_done(self, early: Early, record: ev.ActionRequested) -> bool:
        """Whether an early dispatch was acknowledged (False: the relay dispatches)."""
        if isinstance(early, asyncio.Task):
            return await early
        try:
            ack = self.js.acknowledged(await early)
            self.queue.dispatched(record.data.action_id, record.data.attempt, ack.seq)
        # The relay dispatches it again (the message id makes a stored one a no-op).
        except Exception as exc:  # noqa: BLE001
            log.debug("early dispatch not acknowledged: %s", exc)
            return False
        return True

    async def _dispatch_now(self, record: ev.ActionRequested) -> bool:
        try:
            await self._dispatch(record)
        # The relay dispatches it when it reads the request back.
        except Exception as exc:  # noqa: BLE001
            log.debug("early dispatch of %s failed: %s", record.data.action_id, exc)
            return False
        return True

    def _task_request(
        self, record: ev.ActionRequested, timeout_s: float | None
    ) -> tuple[dict[str, str], bytes]:
        """The headers and payload of an action's task request."""
        d = record.data
        deadline = d.deadline
        if deadline is None and timeout_s:
            deadline = plus_seconds(record.time, timeout_s)
        return tasks.encode_request(
            run_id=record.subject,
            action_id=d.action_id,
            capability=d.capability,
            attempt=d.attempt,
            data=d.input if d.input is not None else {},
            time=record.time,
            deadline=deadline,
            traceparent=record.traceparent,
            token=self.answers.tokens.token(d.capability, record.subject, d.action_id, d.attempt),
        )

    async def _dispatch(self, record: ev.ActionRequested) -> None:
        d = record.data
        capability = self.registry.capability(d.capability)
        if capability is None:  # an AgentDef applied a moment ago, maybe
            # Dispatch with what is known; an unknown capability is handled below.
            with contextlib.suppress(Exception):
                await self.registry.sync(agents=True)
            capability = self.registry.capability(d.capability)
        schemas = self.registry.schemas(d.capability)
        if capability is not None and schemas is not None and schemas.input is not None:
            try:
                schemas.input.check(d.input)
            except SchemaMismatch as exc:
                where = exc.where
                await self.answer_failed(
                    record,
                    ErrorClass.SCHEMA_ERROR,
                    f"input of {d.capability} does not match its input_schema at {where}: "
                    f"{exc.message}",
                )
                return
        headers, payload = self._task_request(
            record, capability.timeout_s if capability is not None else None
        )
        await self._ensure_task_consumer(d.capability)
        self.observers.dispatched(record, headers)
        ack = await self.js.publish(
            self.subjects.capability(d.capability), payload, headers=headers
        )
        self.queue.dispatched(d.action_id, d.attempt, ack.seq)
        self.counters["actions_dispatched"] += 1

    async def answer_failed(
        self, record: ev.ActionRequested, error_class: str, message: str
    ) -> None:
        """Feed a failure back through the results stream, like an agent's answer."""
        await self.answers.failed(record, error_class, message)

    def _report(self) -> ForeignReport:
        """What the run logs' reads tell of each foreign message they find: this process
        dead-letters it."""
        return ForeignReport(on_new=self._foreign)

    def _foreign(self, found: Foreign) -> None:
        """A foreign message in a run log (reported once per process): dead-letter it,
        unless that was done before."""
        if self._stopping.is_set():
            return
        task = asyncio.get_running_loop().create_task(self._dead_letter_foreign(found))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _dead_letter_foreign(self, found: Foreign) -> None:
        try:
            if await dead_letter_foreign(self.nc, self.subjects, found):
                self.counters[f"dead_lettered:{FOREIGN_RECORD}"] += 1
                self.observers.dead_lettered(FOREIGN_RECORD)
        # It is still skipped by every reader; a later process dead-letters it.
        except Exception as exc:  # noqa: BLE001
            log.warning("could not dead-letter the foreign message %s: %s", found.seq, exc)

    def _capabilities_learnt(self, capabilities: list[str]) -> None:
        """An AgentDef was applied: its capabilities' consumers are made now, so that its
        workers can bind before the first task is dispatched."""
        new = [c for c in capabilities if c not in self._task_consumers]
        if new and not self._stopping.is_set():
            task = asyncio.get_running_loop().create_task(self._ensure_task_consumers(new))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _ensure_task_consumers(self, capabilities: list[str]) -> None:
        for capability in capabilities:
            try:
                await self._ensure_task_consumer(capability)
            # Made again before the first dispatch: a failure here only logs.
            except Exception as exc:  # noqa: BLE001
                log.warning("cannot create the consumer of %s yet: %s", capability, exc)

    async def _ensure_task_consumer(self, capability: str) -> None:
        """Create the capability's task consumer (the orchestrator's job: agents only bind
        to it), once per process."""
        if not capability or capability in self._task_consumers:
            return
        config = tasks.task_consumer_config(self.subjects, capability, ack_wait=self.task_ack_wait)
        try:
            await ensure_consumer(self.js, self.subjects.tasks_stream, config, log=log)
        except (ConsumerMismatch, BadRequestError) as exc:
            # Someone else's consumer takes this capability's tasks (a work-queue stream
            # allows one per subject): dispatch all the same, and say so once.
            # The reason is the message: no traceback.
            log.error("capability %s: cannot create its consumer: %s", capability, exc)  # noqa: TRY400
        self._task_consumers.add(capability)


def _same(a: list[tuple[Definition, int]], b: list[tuple[Definition, int]]) -> bool:
    """The same workflow versions (the very same definitions, not equal ones)."""
    return len(a) == len(b) and all(x is y and m == n for (x, m), (y, n) in zip(a, b, strict=True))


def too_large_answer(incoming: Incoming, why: str) -> Incoming:
    """The ``task.failed`` (class ``payload_too_large``) that stands for an answer too
    large to record."""
    return Incoming(
        type=TASK_FAILED,
        source=incoming.source,
        id=incoming.id,
        data={"error": {"class": ErrorClass.PAYLOAD_TOO_LARGE, "message": why}},
        time=incoming.time,
        extensions=incoming.extensions,
    )
