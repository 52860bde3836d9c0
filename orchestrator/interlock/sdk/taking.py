"""One task message's path through a worker, from its delivery to its settling.

:class:`TaskPath` reads the request and starts its handler in the read loop that
delivered it, then answers and acks it in a task of its own (or hands it back, or
dead-letters it); it also stops the attempts a cancel notice names. The serving loop
around it is :mod:`interlock.sdk.serving`, the handler's execution
:mod:`interlock.sdk.execution`, the answer's sending :mod:`interlock.sdk.sending`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from interlock.core.objects import ObjectError, is_marker, parse_ref
from interlock.transport.cloudevents import InvalidCloudEvent, decode_message
from interlock.transport.consuming import (
    dead_letter,
    dead_letter_and_settle,
)
from interlock.transport.jetstream import connection
from interlock.transport.natsclient import ack_nowait
from interlock.transport.objects import Objects
from interlock.transport.slots import SlotPool
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import BadNotice, BadRequest, TaskRequest, failure, read_cancel

from .cancels import CancelMemory, parse_time
from .context import TASK_COMPLETED, TASK_FAILED
from .errors import ErrorClass
from .execution import Abandon, Capability, InFlight, answer_of, finish, start
from .observe import Outcome, WorkerObservers
from .progress import ProgressAcks
from .schemas import AgentDefCatalog, CapabilityContract
from .sending import ANSWER_HEADROOM, AnswerSender

log = logging.getLogger("interlock.sdk")


class TaskPath:
    """What a worker does with each task message it is delivered, and with the cancel
    notices for them.

    Args:
        worker: the worker's name (in its answers, dead letters and handler logger).
        sender: sends the answers.
        observers: told about every task.
        catalog: the AgentDefs, whose schemas complete a capability's own.
    """

    def __init__(
        self,
        worker: str,
        *,
        sender: AnswerSender,
        observers: WorkerObservers,
        catalog: AgentDefCatalog,
    ) -> None:
        self._worker = worker
        self._sender = sender
        self._observers = observers
        self._catalog = catalog
        self._handler_log = logging.getLogger(f"interlock.agent.{worker}")
        self._merged: dict[str, tuple[CapabilityContract, CapabilityContract]] = {}
        self._flights: dict[str, list[InFlight]] = {}
        # Notices for tasks not taken yet: they may still wait in the work queue.
        self._cancels = CancelMemory()
        self.tasks: set[asyncio.Task[None]] = set()
        """The tasks settling a message: received and not yet settled."""

    def deliver(self, js: JetStreamContext, subjects: Subjects, job: Job) -> None:
        """Take a task message in the read loop that delivered it: read it and start its
        handler now (:meth:`_open`), then settle it (wait for the handler, answer, ack) in a
        task of its own (:meth:`_process`). Both run in one context made for the message,
        so that the observers see every call about it in that context; the handler's task
        runs in a copy of it."""
        context = contextvars.copy_context()
        context.run(self._open, job)
        task = asyncio.get_running_loop().create_task(
            self._process(js, subjects, job), context=context
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def stop_all(self, reason: str) -> None:
        """Stop every handler running (``shutdown``: their tasks are handed back)."""
        for flights in self._flights.values():
            for flight in flights:
                flight.stop(reason)

    def _open(self, job: Job) -> None:
        """Read the task and start its handler (or find the answer to give without it): a
        plain call, never raising; what :meth:`_process` needs is left in ``job``."""
        cap, msg = job.cap, job.msg
        try:
            try:
                event = decode_message(msg.headers, msg.data)
                self._observers.task_received(cap.name, event, msg.headers)
                request = TaskRequest.from_event(event, cap.name, msg.headers)
            except (InvalidCloudEvent, BadRequest) as exc:
                self._observers.task_started(cap.name, None)
                reason = exc.reason if isinstance(exc, InvalidCloudEvent) else "no-run-id"
                job.rejected = (reason, str(exc))
                return
            action_id = job.action_id = request.action_id
            self._observers.task_started(cap.name, action_id)
            job.request = request
            flight = job.flight = InFlight(request.attempt)
            if action_id in self._cancels and self._cancels.covers(
                action_id, request.attempt, parse_time(request.event.time)
            ):
                log.info("%s was cancelled before it was taken; not running it", action_id)
                flight.stop("cancelled")
            self._flights.setdefault(action_id, []).append(flight)
            job.contract = self._contract(cap)
            if is_marker(request.event.data):
                job.by_reference = True  # its input is loaded first (in _process)
                return
            self._start(job, request)
        except Exception as exc:  # noqa: BLE001 - raised again where the task is settled
            job.fault = exc

    def _start(self, job: Job, request: TaskRequest) -> None:
        assert job.contract is not None
        assert job.flight is not None
        job.answered = start(
            job.cap,
            job.contract,
            request,
            job.msg,
            job.flight,
            worker=self._worker,
            handler_log=self._handler_log,
        )

    async def _load_input(self, js: JetStreamContext, job: Job) -> None:
        """Load a task's input kept by reference (checked against its digest), then start
        its handler; an input that cannot be loaded fails the attempt (platform_error)."""
        request = job.request
        assert request is not None
        objects = Objects(connection(js), max_bytes=self._sender.limits.max_bytes)
        try:
            value = await objects.get_value(parse_ref(request.event.data, "the task's input"))
        except ObjectError as exc:
            why = f"the task's input could not be loaded: {exc}"
            log.error("%s: %s", request.action_id, why)  # noqa: TRY400 - said in full
            job.answered = failure(ErrorClass.PLATFORM_ERROR, why)
            return
        event = msgspec.structs.replace(request.event, data=value)
        job.request = request = msgspec.structs.replace(request, event=event)
        self._start(job, request)

    async def _process(self, js: JetStreamContext, subjects: Subjects, job: Job) -> None:
        cap, msg, slot = job.cap, job.msg, job.slot
        outcome, error_class = Outcome.RETURNED, None
        try:
            if job.rejected is not None:
                reason, message = job.rejected
                await self._reject(js, subjects, cap.name, msg, reason, message)
                outcome = Outcome.REJECTED
                return
            if job.by_reference:
                await self._load_input(js, job)
            answered = await self._answered(job)
            if answered is None:
                return  # handed back
            request = job.request
            assert request is not None
            result_type, data = answered
            slot.free()  # sending the answer (and awaiting its reply) holds no handler slot
            data, refused = await self._sender.by_reference(js, subjects, cap.name, data)
            if refused is not None:
                log.error("%s: %s", request.action_id, refused)
                result_type, data = failure(ErrorClass.PAYLOAD_TOO_LARGE, refused)
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
            self._observers.task_finished(
                cap.name, job.action_id, outcome, error_class, time.monotonic() - job.started
            )

    async def _answered(self, job: Job) -> tuple[str, Any] | None:
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
        headers, data = dead_letter(
            msg,
            reason,
            message,
            connection(js).max_payload,
            extra={"Interlock-Dead-Letter-Worker": self._worker},
        )

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

    async def on_control(self, msg: Msg) -> None:
        """A message on a capability's control subject: a cancel notice stops the
        attempts it names, running or still to be taken."""
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


class Job:
    """One task message, from its delivery to its settling: what :meth:`TaskPath._open`
    found, for :meth:`TaskPath._process`."""

    __slots__ = (
        "action_id",
        "answered",
        "by_reference",
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
        self.by_reference = False
        """Its input is kept by reference: loaded before the handler starts."""
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
