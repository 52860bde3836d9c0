"""Task requests out: the orchestrator's dispatch of the actions its runs request.

An action request is published to its capability's subject with a deterministic
``Nats-Msg-Id`` (action id + attempt), so that publishing it again is a no-op. The
requests a decision made here asks for are made ready while the decision's append is out
and sent as soon as it is acknowledged (:meth:`Dispatcher.dispatch_early`); the relay
(:mod:`relay`) reads every request back from the run log and dispatches what was not.
The capabilities' task consumers are the orchestrator's to create: workers only bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from nats.aio.msg import Msg
from nats.js.errors import BadRequestError

from interlock.core import events as ev
from interlock.core.engine import plus_seconds
from interlock.core.objects import is_marker
from interlock.core.vocabulary import ErrorClass
from interlock.runtime.answers import Answers
from interlock.runtime.observe import Observers
from interlock.runtime.payloads import Payloads
from interlock.runtime.registry import Registry
from interlock.runtime.schemas import SchemaMismatch
from interlock.runtime.taskqueue import TaskQueue
from interlock.transport import tasks
from interlock.transport.consuming import ConsumerMismatch, ensure_consumer
from interlock.transport.jetstream import JetStream
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

EARLY_KEPT = 4_096
"""Actions dispatched as their request's append was acknowledged, remembered until the
relay reads the request back (the oldest are forgotten first: the relay then publishes
again, and the message id makes that a no-op)."""

AdmittedRequest = Callable[[ev.ActionAdmitted], ev.ActionRequested | None]
Early = asyncio.Task[bool] | asyncio.Future[Msg]
"""An early dispatch: the task that awaits it, or the future of its acknowledgement."""


class Dispatcher:
    """Publishes the task requests of action requests, early or when the relay asks."""

    def __init__(
        self,
        js: JetStream,
        subjects: Subjects,
        *,
        registry: Registry,
        answers: Answers,
        queue: TaskQueue,
        observers: Observers,
        counters: Counter[str],
        stopping: asyncio.Event,
        task_ack_wait: float,
        payloads: Payloads | None = None,
    ) -> None:
        self.js, self.subjects, self.registry = js, subjects, registry
        self.payloads = payloads
        """Loads a task input kept by reference, to check it against the input schema."""
        self.answers, self.queue, self.observers = answers, queue, observers
        self.counters = counters
        """The orchestrator's counters (``actions_dispatched`` is counted here)."""
        self._stopping = stopping
        self.task_ack_wait = task_ack_wait
        """The ack wait of the capability consumers this process creates (workers send
        progress acks: it bounds how soon a killed worker's task goes to another)."""
        self.early: OrderedDict[tuple[str, int], Early] = OrderedDict()
        """Early dispatches the relay has not read back yet, by action and attempt."""
        self._ready: OrderedDict[tuple[str, int], tuple[str, dict[str, str], bytes]] = OrderedDict()
        """Task requests made ready while the append of the records that ask for them is
        out (subject, headers, payload), by action and attempt."""
        self._task_consumers: set[str] = set()
        """Capabilities whose consumer this process has made sure of."""
        self._background: set[asyncio.Task[None]] = set()
        self.held: Callable[[ev.ActionRequested], bool] = lambda r: (
            bool(r.data.limits) and r.data.admitted_at is None
        )
        """Whether a request waits for its capability's limits or pause rather than going
        out (:mod:`capacity` says; its ``action.admitted`` lets it go)."""
        self.admitted_request: AdmittedRequest = lambda r: None
        """The request an admission lets go, when it is at hand (no I/O)."""

    def acknowledged(self, early: Early) -> bool:
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

    def dispatch_early(self, records: Sequence[ev.AnyRecord]) -> None:
        """Dispatch the actions a decision made here requested as soon as its append is
        acknowledged, rather than when the relay reads the records back (a consumer's
        delivery later): the effect still follows the log. The relay then finds them
        dispatched; if this fails, or the process dies first, the relay dispatches them.
        A request that needs nothing awaited first is sent at once, without a task: the
        relay reads its acknowledgement (:meth:`early_done`)."""
        for found in records:
            record = self._to_send(found)
            if record is None:
                continue
            key = (record.data.action_id, record.data.attempt)
            if key in self.early or self._stopping.is_set():
                continue
            early: Early | None = self._send_now(record)
            if early is None:
                early = asyncio.get_running_loop().create_task(self._dispatch_now(record))
            self.early[key] = early
            while len(self.early) > EARLY_KEPT:
                self.early.popitem(last=False)

    def ready_requests(self, records: Sequence[ev.AnyRecord]) -> None:
        """Make the task requests of a decision's action requests while its append is
        out (the server storing it), so that its acknowledgement is followed by nothing
        but their publishes. Encoding a request is pure: one made for an append that is
        refused is replaced by the next decision's, or forgotten."""
        for found in records:
            record = self._to_send(found)
            if record is None:
                continue
            ready = self._request_of(record)
            if ready is not None:
                d = record.data
                self._ready[(d.action_id, d.attempt)] = ready
                while len(self._ready) > EARLY_KEPT:
                    self._ready.popitem(last=False)

    def _to_send(self, record: ev.AnyRecord) -> ev.ActionRequested | None:
        """The task request a record asks to send: a request not held, or the request an
        admission lets go."""
        if isinstance(record, ev.ActionAdmitted):
            return self.admitted_request(record)
        if not isinstance(record, ev.ActionRequested) or record.data.workflow:
            return None
        return None if self.held(record) else record

    def _request_of(self, record: ev.ActionRequested) -> tuple[str, dict[str, str], bytes] | None:
        """The subject, headers and payload of an action's task request, if nothing needs
        awaiting first (its capability and consumer known, its input matching)."""
        d = record.data
        capability = self.registry.capability(d.capability)
        if capability is None or d.capability not in self._task_consumers:
            return None
        schemas = self.registry.schemas(d.capability)
        if schemas is not None and schemas.input is not None:
            if is_marker(d.input):
                return None  # kept by reference: checked once loaded, the awaited way
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

    async def early_done(self, early: Early, record: ev.ActionRequested) -> bool:
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
            await self.dispatch(record)
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

    async def dispatch(self, record: ev.ActionRequested) -> None:
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
                checked = d.input
                if is_marker(checked) and self.payloads is not None:
                    checked = await self.payloads.value(checked, "input")  # as its agent reads it
                schemas.input.check(checked)
            except SchemaMismatch as exc:
                where = exc.where
                await self.answers.failed(
                    record,
                    ErrorClass.SCHEMA_ERROR,
                    f"input of {d.capability} does not match its input_schema at {where}: "
                    f"{exc.message}",
                )
                return
        headers, payload = self._task_request(
            record, capability.timeout_s if capability is not None else None
        )
        await self.ensure_task_consumer(d.capability)
        self.observers.dispatched(record, headers)
        ack = await self.js.publish(
            self.subjects.capability(d.capability), payload, headers=headers
        )
        self.queue.dispatched(d.action_id, d.attempt, ack.seq)
        self.counters["actions_dispatched"] += 1

    def capabilities_learnt(self, capabilities: list[str]) -> None:
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
                await self.ensure_task_consumer(capability)
            # Made again before the first dispatch: a failure here only logs.
            except Exception as exc:  # noqa: BLE001
                log.warning("cannot create the consumer of %s yet: %s", capability, exc)

    async def ensure_task_consumer(self, capability: str) -> None:
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
