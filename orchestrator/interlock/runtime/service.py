"""``interlock serve``: the orchestrator.

Three durable pull consumers and one request service, all stateless to restart:

- ingress (:mod:`ingress`): CloudEvents on ``<prefix>.events.>`` start runs (triggers)
  or reach the run named by their ``runid`` extension. Invalid messages go to the
  dead-letter stream.
- answers: agents' answers, by request on ``<prefix>.answer.>`` (:mod:`answering`: replied
  to once in the run's log) or from the results stream on ``<prefix>.results.>`` (the way
  that works while no orchestrator is up), are checked and decided on by their run.
- relay (the outbox, :mod:`relay`): every appended run-log record is read back from the
  RUNS stream and acted on: action requests are published to capability subjects with a
  deterministic ``Nats-Msg-Id`` (:mod:`dispatch`), cancellations are told to agents, and
  the run index is written behind the runs (:mod:`writebehind`: once for a short run, with
  the deadlines the answers beat never scheduled). Effects follow the log, never precede
  it, so a crash anywhere re-does them without duplicates.

With several partitions, a message of ``ingress``, ``results`` or ``timers`` for a run of
a partition another replica holds is handed to that replica, which decides it (:mod:`owners`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import TASK_FAILED, Incoming, decide, decided
from interlock.core.incoming import heavy_value
from interlock.core.objects import is_marker
from interlock.core.state import RunState, fold
from interlock.runtime import chains, eventloop, writebehind
from interlock.runtime.answering import AnswerDesk, AnswerTaking
from interlock.runtime.answers import (
    AnswerKey,
    AnswerRefused,
    Answers,
    check_output,
    too_large_answer,
)
from interlock.runtime.dispatch import Dispatcher
from interlock.runtime.errors import UnknownRun, UnknownWorkflow
from interlock.runtime.flow import ControlFlow
from interlock.runtime.foreign import ForeignDeadLetters
from interlock.runtime.handling import ACK_WAIT, MessageHandling
from interlock.runtime.ingress import Ingress
from interlock.runtime.keeper import TaskQueueKeeper
from interlock.runtime.logstore import RecordsTooLarge, RunLog
from interlock.runtime.observe import Observers, OrchestratorObserver
from interlock.runtime.owners import Handlers, Owners
from interlock.runtime.payloads import payloads_for
from interlock.runtime.registry import Registry
from interlock.runtime.relay import Relay
from interlock.runtime.retention import Policy
from interlock.runtime.runindex import RunIndex
from interlock.runtime.runs import Decided, Runs
from interlock.runtime.snapshots import Snapshots
from interlock.runtime.taskqueue import TaskQueue
from interlock.runtime.timers import JetStreamTimers, Timers
from interlock.runtime.triggering import TriggerStarts
from interlock.transport import tasks
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.clock import utc_now
from interlock.transport.jetstream import jetstream
from interlock.transport.objects import ObjectLimits
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")


class Orchestrator:
    """The router, engine shell and dispatcher of one orchestrator process."""

    history: ev.HistoryLimits | None = None  # the installation's (serve --history-*)

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        clock: Callable[[], str] = utc_now,
        cache_size: int = 10_000,
        observers: Sequence[OrchestratorObserver] = (),
        replicas: int = 1,
        partitions: int | None = None,
        timers: Timers | None = None,
        ack_wait: float = ACK_WAIT,
        task_ack_wait: float = tasks.TASK_ACK_WAIT,
        index_hold: float = writebehind.HOLD,
        group_commit: int = 0,
        retention: Policy | None = None,
        objects: ObjectLimits | None = None,
    ) -> None:
        self.observers = Observers(observers)
        self.ack_wait = ack_wait
        """Seconds before a message taken by a process that died is handed out again."""
        self.replicas = replicas
        """Stream replicas when provisioning (3 on a JetStream cluster)."""
        self.partitions = partitions  # for an installation provisioned for the first time
        self.nc, self.js, self.subjects, self.clock = nc, jetstream(nc), subjects, clock
        self.registry = Registry(self.js, subjects)
        self.counters: Counter[str] = Counter()
        self._stopping = asyncio.Event()
        foreign = ForeignDeadLetters(
            nc, subjects, observer=self.observers, counters=self.counters, stopping=self._stopping
        )
        self.run_log = RunLog(nc, subjects, group_commit=group_commit, foreign=foreign.report())
        self.handling = MessageHandling(
            nc,
            self.js,
            subjects,
            observers=self.observers,
            counters=self.counters,
            ack_wait=ack_wait,
            stopping=self._stopping,
        )
        self.payloads = payloads_for(nc, subjects, objects or ObjectLimits())
        """Payloads by reference: loaded before a decision, stored when too large to log."""
        self.answers = Answers(self.js, subjects)
        self.queue = TaskQueue(self.js, subjects)
        self.dispatcher = self._dispatcher(task_ack_wait)
        self.runs = self._runs(cache_size)
        self._tasks: list[asyncio.Task[None]] = []
        self.index = RunIndex(nc, subjects)
        self.keeper = TaskQueueKeeper(nc, subjects, lambda: self.counters["actions_dispatched"])
        self.taking = self._taking()
        self.desk = AnswerDesk(nc, subjects, self.taking.take, self.handling.dead_letter)
        self.flow = ControlFlow(
            nc,
            subjects,
            queue=self.queue,
            runs=self.runs,
            registry=self.registry,
            timers=timers or JetStreamTimers(nc, subjects, ack_wait=ack_wait),
            clock=clock,
            # Events for runs decided by the holder of the run's partition (see owners).
            deliver=lambda run_id, incoming: self.owners.deliver(run_id, incoming),
            answers=self.answers,
            retention=retention or Policy(),
        )
        self.starting = self._starting()
        self.flow.window_due = self.starting.windows.due
        self.ingress = self._ingress()
        self.relay = self._relay(index_hold)
        self.owners = self._owners()

    def _ingress(self) -> Ingress:
        """The ingress consumer's events handled (see :mod:`ingress`)."""
        return Ingress(
            self.nc,
            self.subjects,
            runs=self.runs,
            registry=self.registry,
            handling=self.handling,
            payloads=self.payloads,
            flow=self.flow,
            starting=self.starting,
            deliver=self.deliver,
            counters=self.counters,
            observers=self.observers,
        )

    def _taking(self) -> AnswerTaking:
        """Agents' answers checked and decided on (see :mod:`answering`)."""
        return AnswerTaking(
            self.answers,
            self.deliver,
            self.handling.dead_letter,
            self.run_log,
            self.observers,
            self.counters,
            # (the flow is made after: looked up when an answer comes)
            stopped=lambda run_id, slots: self.flow.capacity.stopped(run_id, slots),
        )

    def _owners(self) -> Owners:
        """The shared consumers' messages of runs in partitions other replicas hold, handed
        to them, and theirs decided here (see :mod:`owners`)."""
        owners = Owners(
            self.nc,
            self.subjects,
            self.run_log.placement,
            lambda: self.relay.ownership.held,
            self.counters,
            handlers=Handlers(
                self.ingress.handle, self.taking.take, self.flow.timer_due, self.deliver
            ),
            dead_letter=self.handling.dead_letter,
        )
        self.relay.hold = owners.desk.hold
        return owners

    def _runs(self, cache_size: int) -> Runs:
        """The runs, with a cache of recent states, snapshots and payloads by reference."""
        return Runs(
            self.run_log,
            self.registry,
            clock=self.clock,
            cache_size=cache_size,
            observer=self.observers,
            keep_appended=True,  # the relay reads them back
            snapshots=Snapshots(
                self.nc, self.subjects, write=True, key=self.run_log.key, where=self.run_log.where
            ),
            on_appended=self.dispatcher.dispatch_early,
            on_appending=self.dispatcher.ready_requests,
            payloads=self.payloads,
        )

    def _dispatcher(self, task_ack_wait: float) -> Dispatcher:
        """The dispatch of task requests (see :mod:`dispatch`)."""
        return Dispatcher(
            self.js,
            self.subjects,
            registry=self.registry,
            answers=self.answers,
            queue=self.queue,
            observers=self.observers,
            counters=self.counters,
            stopping=self._stopping,
            task_ack_wait=task_ack_wait,
            payloads=self.payloads,
        )

    def _starting(self) -> TriggerStarts:
        """The starts of trigger events (see :mod:`triggering`)."""
        return TriggerStarts(
            self.nc,
            self.subjects,
            runs=self.runs,
            registry=self.registry,
            timers=self.flow.timers,
            pauses=self.flow.admission.pauses,
            clock=self.clock,
            counters=self.counters,
            dead_letter=self.handling.dead_letter,
            observe=self.observers.trigger_flow,
        )

    def _relay(self, index_hold: float) -> Relay:
        """The relay over the run logs (see :mod:`relay`); held requests go out through
        it once admitted (see :mod:`capacity`)."""
        self.dispatcher.held = self.flow.capacity.holds
        self.dispatcher.admitted_request = self.flow.capacity.request_at_hand
        return Relay(
            self.subjects,
            clock=self.clock,
            handling=self.handling,
            runs=self.runs,
            run_log=self.run_log,
            flow=self.flow,
            dispatcher=self.dispatcher,
            index=self.index,
            observers=self.observers,
            index_hold=index_hold,
            route_answers=self.desk.route,
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry.on_capabilities(self.dispatcher.capabilities_learnt)
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
                self.handling.consume(
                    s.events_stream,
                    s.events_all,
                    "ingress",
                    self.owners.on_event,
                    before=self.ingress.check_registry,
                )
            ),
            asyncio.create_task(
                self.handling.consume(
                    s.results_stream, s.results_all, "results", self.owners.on_result
                )
            ),
            asyncio.create_task(self.relay.run()),
        ]
        await self.desk.start()
        self.flow.start(self.owners.on_timer)
        self.starting.windows.start()
        loop = eventloop.loop_name(asyncio.get_running_loop())
        group = self.run_log.group
        batch = group.min_batch if group is not None else 0
        log.info(
            "orchestrator started (prefix %s, event loop %s, group commit %s)",
            s.prefix,
            loop,
            f"batches of {batch}" if batch else "off",
        )

    async def _prepare(self) -> None:
        """Streams, the token key, definitions and task consumers: each step idempotent."""
        replicas, partitions = self.replicas, self.partitions
        await provision(
            self.js, self.subjects, replicas=replicas, secrets=True, partitions=partitions
        )
        await self.answers.load()
        await self.run_log.key()
        await self.registry.load()
        await self.registry.history.put(self.history)
        for capability in sorted(self.registry.known_capabilities()):
            await self.dispatcher.ensure_task_consumer(capability)

    async def stop(self) -> None:
        self._stopping.set()
        await self.desk.stop()
        await self.owners.desk.stop()
        # Stopping: what ended the task was logged where it happened.
        await cancel_and_wait(*self._tasks)
        # Then every registry check still out (the loops, ended, start no more).
        await self.ingress.stop()
        await self.relay.behind.stop()
        await self.keeper.stop()
        await self.flow.stop()
        await self.starting.windows.stop()
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

    async def _awaited(self, run_id: str, answer: AnswerKey) -> None:
        """Before an answer's object is loaded: the run awaits the attempt it speaks for
        (else :class:`AnswerRefused`, nothing loaded). Its token verifies for an attempt
        answered long ago as well, so an agent re-sending old answers naming large
        objects of its own made the orchestrator read each (up to 64 MiB) to refuse it."""
        entry = await self.runs.load(run_id)
        if entry is None:
            return
        try:
            Answers.check_awaited(answer, entry.state)
        except AnswerRefused:
            entry = await self.runs.load(run_id, fresh=True)  # the cache may be behind
            if entry is not None:
                Answers.check_awaited(answer, entry.state)

    async def deliver(
        self, run_id: str, incoming: Incoming, *, answer: AnswerKey | None = None
    ) -> bool:
        """Decide on ``incoming`` for the run.

        ``answer``: the attempt an agent's answer speaks for; the run must await it (else
        :class:`AnswerRefused` is raised and nothing is appended), and its data must match
        the capability's output schema.
        """
        now = self.clock()
        if answer is not None and is_marker(incoming.data):
            await self._awaited(run_id, answer)
        incoming = await self.payloads.incoming(incoming)  # a parked event's, an answer's
        # Converting many values for CEL costs in proportion: decided off the loop.
        heavy = heavy_value(incoming.data)

        pauses = self.flow.admission.pauses
        holding = await pauses.holding(self.runs, run_id)  # (a workflow paused with its runs)

        def decision(definition: Definition, state: RunState) -> Decided:
            event = incoming
            if answer is not None:
                Answers.check_awaited(answer, state)
                event = check_output(self.registry, incoming, state)
            # Paused first with its workflow (pause --runs), or resumed once that ended.
            first = pauses.first(definition, state, now, holding=holding)
            if first:
                records, after = decided(definition, fold(first, state), event, now)
                return Decided([*first, *records], after)
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
        return bool(records) or await chains.forward(self.runs, run_id, incoming, self.deliver)

    async def answer_failed(
        self, record: ev.ActionRequested, error_class: str, message: str
    ) -> None:
        """Feed a failure back through the results stream, like an agent's answer."""
        await self.answers.failed(record, error_class, message)
