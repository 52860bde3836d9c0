"""The agent worker: capability handlers over durable JetStream pull consumers.

Handlers return or raise; the worker alone decides ack, nak and term:

- an answerable request always gets a result CloudEvent (completed, emitted or failed),
  and is acked only once that result is safe: recorded in the run's log (the orchestrator
  said so in its reply to the answer request) or stored in the results stream (when the
  orchestrator did not reply in time, or is down);
- a request that cannot be answered (not a CloudEvent, no run id) is dead-lettered and
  terminated;
- a request still running when the worker stops is handed back (nak) for another worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import socket
import time
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from interlock.core.rfc3339 import format_time
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent, decode_message
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.consuming import (
    dead_letter_and_settle,
    dead_letter_data,
    dead_letter_headers,
    dead_letter_id,
)
from interlock.transport.jetstream import connection, jetstream
from interlock.transport.natsclient import ack_nowait, js_api
from interlock.transport.pulling import PullConsumer
from interlock.transport.slots import SlotPool
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects
from interlock.transport.tasks import (
    BadNotice,
    BadRequest,
    TaskRequest,
    consumer_name,
    read_cancel,
)

from .binding import bind
from .cancels import CancelMemory, parse_time
from .context import TASK_COMPLETED, TASK_FAILED
from .execution import (
    CANCEL_CLEANUP,
    Abandon,
    Capability,
    Handler,
    InFlight,
    answer_of,
    finish,
    inspect_handler,
    start,
)
from .liveness import Heartbeats
from .observe import Outcome, WorkerObserver
from .progress import ProgressAcks
from .schemas import AgentDefCatalog, CapabilityContract, Schema
from .sending import ANSWER_HEADROOM, AnswerSender

log = logging.getLogger("interlock.sdk")

H = TypeVar("H", bound=Handler)

# How long to wait for the AgentDefs in the agents bucket before taking the first task.
_AGENTDEFS_WAIT = 2.0


class _Lifecycle:
    """The events of one :meth:`Worker.run`."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.ready = asyncio.Event()
        self.done = asyncio.Event()


def agent_connection_name(worker: Worker) -> str:
    """What an agent's connection is called on the server (``/connz``):
    ``interlock-agent:<its capabilities>``."""
    return "interlock-agent:" + ",".join(worker.capabilities)


class Worker:
    """An agent worker: register handlers with :meth:`capability`, then :meth:`run`.

    Args:
        name: the agent's name (results come from ``interlock://agent/<name>``).
        concurrency: at most this many handlers run at once, over all capabilities.
        ack_wait: seconds JetStream waits for an ack before redelivering, used when this
            worker creates a capability's consumer (an existing consumer keeps its own).
        grace_period: on :meth:`stop`, how long running handlers may take to finish.
        heartbeat_interval: seconds between two liveness records in the workers bucket.
        instance_id: names this process in the workers bucket (default: random).
        max_deliver: the consumer's redelivery limit (-1: unlimited).
        pull_expires: seconds a pull request stays open on the server.
        observers: hooks told about every task (see :class:`WorkerObserver`).
        answer_timeout: seconds to wait for the orchestrator's reply to an answer request
            before publishing the answer to the results stream instead (0: always publish
            to the stream).
    """

    def __init__(
        self,
        name: str,
        *,
        concurrency: int = 8,
        ack_wait: float = 30.0,
        grace_period: float = 30.0,
        heartbeat_interval: float = 5.0,
        instance_id: str | None = None,
        max_deliver: int = -1,
        pull_expires: float = 5.0,
        observers: Iterable[WorkerObserver] = (),
        answer_timeout: float = 5.0,
    ) -> None:
        if not name or not name.strip():
            raise ValueError("a worker needs a name")
        if ack_wait <= 0:
            raise ValueError(f"ack_wait must be positive, got {ack_wait}")
        self.name = name
        self.concurrency = concurrency
        self.ack_wait = ack_wait
        self.grace_period = grace_period
        self.heartbeat_interval = heartbeat_interval
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self.max_deliver = max_deliver
        self.pull_expires = pull_expires
        self._sender = AnswerSender(name, answer_timeout)
        self._observers = list(observers)
        self._handler_log = logging.getLogger(f"interlock.agent.{name}")
        self._capabilities: dict[str, Capability] = {}
        self._catalog = AgentDefCatalog()
        self._merged: dict[str, tuple[CapabilityContract, CapabilityContract]] = {}
        self._flights: dict[str, list[InFlight]] = {}
        # Notices for tasks not taken yet: they may still wait in the work queue.
        self._cancels = CancelMemory()
        self._tasks: set[asyncio.Task[None]] = set()
        self._progress: list[ProgressAcks] = []  # one per consumer
        self._running = False
        self._started_at = datetime.now(UTC)
        self._life: _Lifecycle | None = None

    # --- registration -------------------------------------------------------------

    @property
    def answer_timeout(self) -> float:
        """Seconds to wait for the orchestrator's reply to an answer request before
        publishing the answer to the results stream instead (0: always the stream)."""
        return self._sender.timeout

    @answer_timeout.setter
    def answer_timeout(self, value: float) -> None:
        self._sender.timeout = value

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"concurrency must be at least 1, got {value}")
        if getattr(self, "_running", False):
            raise RuntimeError("cannot change the concurrency of a running worker")
        self._concurrency = value

    @property
    def capabilities(self) -> list[str]:
        """Names of the registered capabilities."""
        return list(self._capabilities)

    @property
    def in_flight(self) -> int:
        """Task messages received and not yet settled."""
        return len(self._tasks)

    def add_observer(self, observer: WorkerObserver) -> None:
        self._observers.append(observer)

    def capability(
        self,
        name: str,
        *,
        input_schema: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        description: str | None = None,
    ) -> Callable[[H], H]:
        """Register an ``async def handler(input, ctx)`` for capability ``name``.

        The input is a ``dict``, or is converted with ``msgspec.convert`` when the first
        parameter is annotated with a ``msgspec.Struct`` (or a dataclass). The second
        parameter (optional) receives the :class:`TaskContext`. Explicit schemas take
        precedence over those of an AgentDef found in the agents bucket.
        """
        if not name or any(c in name for c in " *>") or name.startswith("."):
            raise ValueError(f"invalid capability name {name!r}")
        if name in self._capabilities:
            raise ValueError(f"capability {name!r} is already registered on worker {self.name!r}")
        contract = CapabilityContract(
            input=None
            if input_schema is None
            else Schema.compile(input_schema, where=f"{name} input_schema"),
            output=None
            if output_schema is None
            else Schema.compile(output_schema, where=f"{name} output_schema"),
        )

        def register(fn: H) -> H:
            if not inspect.iscoroutinefunction(typing.cast(Any, fn)):
                raise TypeError(f"the handler of {name!r} must be an async function")
            input_type, takes_context = inspect_handler(fn, name)
            self._capabilities[name] = Capability(
                name=name,
                handler=fn,
                input_type=input_type,
                takes_context=takes_context,
                contract=contract,
                description=description or inspect.getdoc(fn),
            )
            return fn

        return register

    # --- lifecycle ----------------------------------------------------------------

    async def run(
        self,
        server: str | ConnectOptions | Client | None = None,
        *,
        prefix: str | None = None,
    ) -> None:
        """Serve until :meth:`stop` (or :meth:`request_stop`).

        Args:
            server: a NATS URL, connection options, or an already connected client (which
                is left open). None: the defaults of ``ConnectOptions.resolve``.
            prefix: the installation's subject prefix (default: the options' prefix, ``il``).
        """
        if not self._capabilities:
            raise ValueError(f"worker {self.name!r} has no capability: register one first")
        if self._running:
            raise RuntimeError(f"worker {self.name!r} is already running")
        life = self._lifecycle()
        self._running = True
        self._started_at = datetime.now(UTC)
        try:
            if isinstance(server, Client):
                nc, owned = server, False
                prefix = prefix or DEFAULT_PREFIX
            else:
                opts = (
                    server
                    if isinstance(server, ConnectOptions)
                    else ConnectOptions.resolve(server=server)
                )
                opts = opts.named(agent_connection_name(self))
                prefix = prefix or opts.prefix
                nc, owned = await connect(opts), True
            try:
                await self._serve(nc, Subjects(prefix), life)
            finally:
                if owned:
                    await nc.close()
        finally:
            self._running = False
            self._life = None  # the next run starts afresh
            life.done.set()

    def _lifecycle(self) -> _Lifecycle:
        # Created on first use, inside the running loop (asyncio events bind to one loop).
        if self._life is None:
            self._life = _Lifecycle()
        return self._life

    def request_stop(self, *, force: bool = False) -> None:
        """Ask :meth:`run` to stop; ``force`` skips the grace period for running handlers.

        Safe to call from a signal handler, and before :meth:`run` has started (which
        then returns at once).
        """
        life = self._lifecycle()
        life.stop.set()
        if force:
            life.force.set()

    async def stop(self, *, force: bool = False) -> None:
        """Stop gracefully and wait until :meth:`run` has returned.

        No new task is taken; running handlers get ``grace_period`` seconds to finish
        (their results are sent); the unfinished ones are cancelled and handed back (nak)
        for another worker. Nothing is lost.
        """
        if not self._running:
            return
        self.request_stop(force=force)
        await self._lifecycle().done.wait()

    async def wait_ready(self) -> None:
        """Wait until the worker has bound its consumers and is taking tasks.

        Raises:
            RuntimeError: the worker stopped (or failed) before it was ready.
        """
        life = self._lifecycle()
        ready = asyncio.ensure_future(life.ready.wait())
        done = asyncio.ensure_future(life.done.wait())
        try:
            await asyncio.wait({ready, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            done.cancel()
        if not life.ready.is_set():
            raise RuntimeError(f"worker {self.name!r} stopped before it was ready")

    # --- serving ------------------------------------------------------------------

    async def _serve(self, nc: Client, subjects: Subjects, life: _Lifecycle) -> None:
        js = jetstream(nc)
        pool = SlotPool(self._concurrency)
        background: list[asyncio.Task[Any]] = []  # catalog and heartbeats
        pullers: list[asyncio.Task[Any]] = []
        consumers: list[PullConsumer] = []
        controls: list[Any] = []
        heartbeats = Heartbeats(
            js,
            subjects.workers_bucket,
            list(self._capabilities),
            self.instance_id,
            self._liveness,
            self.heartbeat_interval,
        )
        try:
            loaded = asyncio.Event()
            background.append(
                asyncio.create_task(self._catalog.follow(js, subjects.agents_bucket, loaded))
            )
            for name in self._capabilities:
                controls.append(await nc.subscribe(subjects.controls_of(name), cb=self._on_control))
            for cap in self._capabilities.values():
                info = await self._bind(js, subjects, cap)
                if info is None:
                    return  # stopped while waiting for the TASKS stream
                consumers.append(self._consumer(nc, js, subjects, cap, info, pool))
            try:
                await asyncio.wait_for(loaded.wait(), _AGENTDEFS_WAIT)
            except TimeoutError:
                log.warning("AgentDefs not loaded after %.0fs; validating later", _AGENTDEFS_WAIT)
            await heartbeats.beat()
            background.append(asyncio.create_task(heartbeats.run()))
            for consumer in consumers:
                await consumer.start()
                pullers.append(asyncio.create_task(consumer.run()))
            life.ready.set()
            log.info(
                "worker %s (%s) serving %s with concurrency %d",
                self.name,
                self.instance_id,
                ", ".join(self._capabilities),
                self._concurrency,
            )
            stopped = asyncio.ensure_future(life.stop.wait())
            try:
                # These loops only end by failing (say, a consumer that cannot be recreated).
                await asyncio.wait(
                    {stopped, *background, *pullers}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopped.cancel()
            for task in (*background, *pullers):
                error = task.exception() if task.done() and not task.cancelled() else None
                if error is not None:
                    log.error("worker %s failed; stopping", self.name)
                    raise error
        finally:
            await cancel_and_wait(*pullers)
            for consumer in consumers:
                await consumer.drain()
            # Heartbeats go on while running handlers finish: the worker is still alive.
            await self._settle_in_flight(life)
            for progress in self._progress:
                progress.close()
            self._progress.clear()
            await cancel_and_wait(*background)
            for control in controls:
                try:
                    await control.unsubscribe()
                except Exception:
                    log.debug("unsubscribing from control failed", exc_info=True)
            await heartbeats.forget()
            try:
                await nc.flush(timeout=2)  # acks and naks are fire-and-forget publishes
            except Exception:
                log.debug("final flush failed", exc_info=True)
            log.info("worker %s (%s) stopped", self.name, self.instance_id)

    async def _settle_in_flight(self, life: _Lifecycle) -> None:
        """Let running handlers finish within the grace period; hand back the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_period
        while self._tasks and not life.force.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            forced = asyncio.ensure_future(life.force.wait())
            await asyncio.wait(
                {*self._tasks, forced}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
        if not self._tasks:
            return
        log.warning("handing back %d unfinished task(s)", len(self._tasks))
        for flights in self._flights.values():
            for flight in flights:
                flight.stop("shutdown")
        _done, pending = await asyncio.wait(set(self._tasks), timeout=CANCEL_CLEANUP)
        await cancel_and_wait(*pending)

    async def _bind(
        self, js: JetStreamContext, subjects: Subjects, cap: Capability
    ) -> ConsumerInfo | None:
        return await bind(
            js,
            subjects,
            cap.name,
            self._lifecycle().stop,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
        )

    def _consumer(
        self,
        nc: Client,
        js: JetStreamContext,
        subjects: Subjects,
        cap: Capability,
        info: ConsumerInfo,
        pool: SlotPool,
    ) -> PullConsumer:
        ack_wait = info.config.ack_wait or self.ack_wait
        # Three progress acks per ack_wait: one may be late or lost without a redelivery.
        progress = ProgressAcks(max(ack_wait / 3, 0.05))
        self._progress.append(progress)

        def deliver(msg: Msg) -> None:
            task = self._take(js, subjects, _Job(cap, msg, pool, progress))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        async def ensure() -> None:
            await self._bind(js, subjects, cap)

        return PullConsumer(
            nc,
            api_prefix=js_api(nc),
            stream=subjects.tasks_stream,
            consumer=consumer_name(cap.name),
            filter_subject=subjects.capability(cap.name),
            pool=pool,
            deliver=deliver,
            ensure=ensure,
            expires=self.pull_expires,
        )

    # --- one task -----------------------------------------------------------------

    def _take(self, js: JetStreamContext, subjects: Subjects, job: _Job) -> asyncio.Task[None]:
        """Take a task message in the read loop that delivered it: read it and start its
        handler now (:meth:`_open`), then settle it (wait for the handler, answer, ack) in a
        task of its own (:meth:`_process`). Both run in one context made for the message,
        so that the observers see every call about it in that context; the handler's task
        runs in a copy of it."""
        context = contextvars.copy_context()
        context.run(self._open, job)
        return asyncio.get_running_loop().create_task(
            self._process(js, subjects, job), context=context
        )

    def _open(self, job: _Job) -> None:
        """Read the task and start its handler (or find the answer to give without it): a
        plain call, never raising; what :meth:`_process` needs is left in ``job``."""
        cap, msg = job.cap, job.msg
        try:
            try:
                event = decode_message(msg.headers, msg.data)
                self._notify_received(cap.name, event, msg.headers)
                request = TaskRequest.from_event(event, cap.name, msg.headers)
            except (InvalidCloudEvent, BadRequest) as exc:
                self._notify_started(cap.name, None)
                reason = exc.reason if isinstance(exc, InvalidCloudEvent) else "no-run-id"
                job.rejected = (reason, str(exc))
                return
            action_id = job.action_id = request.action_id
            self._notify_started(cap.name, action_id)
            job.request = request
            flight = job.flight = InFlight(request.attempt)
            if action_id in self._cancels and self._cancels.covers(
                action_id, request.attempt, parse_time(request.event.time)
            ):
                log.info("%s was cancelled before it was taken; not running it", action_id)
                flight.stop("cancelled")
            self._flights.setdefault(action_id, []).append(flight)
            job.contract = self._contract(cap)
            job.answered = start(
                cap,
                job.contract,
                request,
                msg,
                flight,
                worker=self.name,
                handler_log=self._handler_log,
            )
        except Exception as exc:  # noqa: BLE001 - raised again where the task is settled
            job.fault = exc

    async def _process(self, js: JetStreamContext, subjects: Subjects, job: _Job) -> None:
        cap, msg, slot = job.cap, job.msg, job.slot
        outcome, error_class = Outcome.RETURNED, None
        try:
            if job.rejected is not None:
                reason, message = job.rejected
                await self._reject(js, subjects, cap.name, msg, reason, message)
                outcome = Outcome.REJECTED
                return
            answered = await self._answered(job)
            if answered is None:
                return  # handed back
            request = job.request
            assert request is not None
            result_type, data = answered
            slot.free()  # sending the answer (and awaiting its reply) holds no handler slot
            answer, result_type, data = self._sender.answer(
                request, cap.name, result_type, data, connection(js).max_payload - ANSWER_HEADROOM
            )
            if await self._sender.send(js, subjects, cap.name, request.run_id, answer):
                job.progress.discard(msg)
                if not ack_nowait(msg):
                    await msg.ack()
                outcome, error_class = _settled_as(result_type, data)
            else:
                await _nak(msg, delay=1.0)
        except asyncio.CancelledError:
            await _nak(msg)
            raise
        except Exception:
            # A fault of the worker itself: hand the task back rather than lose it.
            log.exception("internal error while handling a %s task", cap.name)
            await _nak(msg, delay=1.0)
        finally:
            job.progress.discard(msg)
            slot.free()
            self._notify_finished(
                cap.name, job.action_id, outcome, error_class, time.monotonic() - job.started
            )

    async def _answered(self, job: _Job) -> tuple[str, Any] | None:
        """The answer's (type, data): the one :meth:`_open` found, or the handler's once
        it is done. None when the task was handed back (the worker is stopping)."""
        try:
            if job.fault is not None:
                raise job.fault
            if job.answered is not None:
                return job.answered
            assert job.request is not None
            assert job.flight is not None
            assert job.contract is not None
            if job.flight.task is not None and job.flight.task.done():  # nothing to wait for
                return answer_of(job.cap, job.contract, job.request, job.flight)
            return await finish(job.cap, job.contract, job.request, job.flight)
        except Abandon:
            await _nak(job.msg)
            return None
        finally:
            if job.flight is not None:
                self._forget_flight(job.action_id, job.flight)

    def _forget_flight(self, action_id: str | None, flight: InFlight) -> None:
        flights = self._flights.get(action_id or "", [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self._flights.pop(action_id or "", None)

    def _contract(self, cap: Capability) -> CapabilityContract:
        declared = self._catalog.get(cap.name)
        if declared is None:
            return cap.contract
        merged = self._merged.get(cap.name)
        if merged is not None and merged[0] is declared:
            return merged[1]  # the AgentDef has not changed since the last task
        contract = CapabilityContract(
            input=cap.contract.input or declared.input,
            output=cap.contract.output or declared.output,
            origin=declared.origin if cap.contract.input is None else cap.contract.origin,
        )
        self._merged[cap.name] = (declared, contract)
        return contract

    async def _reject(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        capability: str,
        msg: Msg,
        reason: str,
        message: str,
    ) -> None:
        """Dead-letter a request that cannot be answered, then terminate it.

        Same letter as the orchestrator's, settled the same way
        (:func:`~interlock.transport.consuming.dead_letter_and_settle`): the
        ``Interlock-Dead-Letter-*`` headers, none of the message's own ``Nats-*`` headers
        (they would act on the dead-letter stream), and a ``Nats-Msg-Id`` (the agents'
        form: stream, sequence, reason) so a redelivered message is dead-lettered once.
        """
        log.error("rejected a message on %s: %s", msg.subject, message)
        headers = dead_letter_headers(msg, reason, message)
        headers["Interlock-Dead-Letter-Worker"] = self.name
        msg_id = dead_letter_id(msg, reason)  # a redelivered message: one letter
        if msg_id is not None:
            headers["Nats-Msg-Id"] = msg_id
        data = dead_letter_data(msg.data, headers, connection(js).max_payload)

        async def store() -> None:
            try:
                subject = subjects.agent_dead_letter(capability, reason)
                await js.publish(subject, data, headers=headers, timeout=5)
            except Exception as exc:
                # The reason is the message: no traceback.
                log.error("could not dead-letter a message (%s): %s", reason, exc)  # noqa: TRY400
                raise

        await dead_letter_and_settle(msg, store, term=True)

    # --- cancellation -------------------------------------------------------------

    async def _on_control(self, msg: Msg) -> None:
        try:
            event = decode_message(msg.headers, msg.data)
        except InvalidCloudEvent as exc:
            log.warning("ignored an invalid control message on %s: %s", msg.subject, exc)
            return
        try:
            notice = read_cancel(event)
        except BadNotice as exc:
            log.warning("ignored %s on %s", exc, msg.subject)
            return
        if notice is None:
            return
        action_id, attempt = notice.action_id, notice.attempt
        self._cancels.remember(action_id, attempt, parse_time(notice.time))
        for flight in list(self._flights.get(action_id, ())):
            if attempt is None or attempt == flight.attempt:
                log.info("cancelling %s on request", action_id)
                flight.stop("cancelled")

    # --- liveness -----------------------------------------------------------------

    def _liveness(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instance": self.instance_id,
            "capabilities": list(self._capabilities),
            "concurrency": self._concurrency,
            "in_flight": len(self._tasks),
            "started_at": format_time(self._started_at),
            "heartbeat_at": format_time(datetime.now(UTC)),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    # --- observers ----------------------------------------------------------------

    def _notify_received(
        self, capability: str, event: CloudEvent, headers: Mapping[str, str] | None
    ) -> None:
        for observer in self._observers:
            try:
                observer.task_received(capability, event, headers)
            except Exception:
                log.exception("observer %r failed", observer)

    def _notify_started(self, capability: str, action_id: str | None) -> None:
        for observer in self._observers:
            try:
                observer.task_started(capability, action_id)
            except Exception:
                log.exception("observer %r failed", observer)

    def _notify_finished(
        self,
        capability: str,
        action_id: str | None,
        outcome: Outcome,
        error_class: str | None,
        seconds: float,
    ) -> None:
        for observer in self._observers:
            try:
                observer.task_finished(capability, action_id, outcome, error_class, seconds)
            except Exception:
                log.exception("observer %r failed", observer)


class _Job:
    """One task message, from its delivery to its settling: what :meth:`Worker._open`
    found, for :meth:`Worker._process`."""

    __slots__ = (
        "action_id",
        "answered",
        "cap",
        "contract",
        "fault",
        "flight",
        "msg",
        "progress",
        "rejected",
        "request",
        "slot",
        "started",
    )

    def __init__(self, cap: Capability, msg: Msg, pool: SlotPool, progress: ProgressAcks) -> None:
        self.cap = cap
        self.msg = msg
        self.started = time.monotonic()
        self.progress = progress
        progress.add(msg)
        self.slot = _Slot(pool)
        self.action_id: str | None = None
        self.request: TaskRequest | None = None
        self.flight: InFlight | None = None
        self.contract: CapabilityContract | None = None
        self.answered: tuple[str, Any] | None = None
        """The answer found without running the handler (None: the handler runs)."""
        self.rejected: tuple[str, str] | None = None
        """Why the message cannot be answered (reason, message): dead-letter it."""
        self.fault: Exception | None = None
        """What went wrong while reading it (raised again in ``_process``)."""


class _Slot:
    """A handler's concurrency slot, given back once: when the handler is done, or at the
    latest when its task is settled."""

    def __init__(self, pool: SlotPool) -> None:
        self._pool: SlotPool | None = pool

    def free(self) -> None:
        if self._pool is not None:
            self._pool.release()
            self._pool = None


def _settled_as(result_type: str, data: Any) -> tuple[Outcome, str | None]:
    """The outcome (and error class) of a task answered with ``result_type``."""
    if result_type == TASK_COMPLETED:
        return Outcome.COMPLETED, None
    if result_type == TASK_FAILED:
        return Outcome.FAILED, data["error"]["class"]
    return Outcome.EMITTED, None


async def _nak(msg: Msg, delay: float | None = None) -> None:
    try:
        await msg.nak(delay=delay)
    except Exception:
        log.debug("nak failed; the message is redelivered after ack_wait", exc_info=True)
