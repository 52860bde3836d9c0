"""A worker's serving loop: one :meth:`~interlock.sdk.Worker.run`, from binding its
consumers to handing back what is unfinished when it stops.

:class:`Serving` binds a durable consumer per capability, subscribes to their cancel
notices, follows the AgentDefs, beats the worker's heartbeat and pulls the tasks, which
it hands to the :class:`~interlock.sdk.taking.TaskPath`; on a stop it lets the running
handlers finish within the grace period and hands back the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.jetstream import jetstream
from interlock.transport.natsclient import JS_API, js_api
from interlock.transport.pulling import PullConsumer
from interlock.transport.slots import SlotPool
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name

from .binding import bind
from .execution import CANCEL_CLEANUP, Capability
from .liveness import Heartbeats
from .progress import ProgressAcks
from .schemas import AgentDefCatalog
from .taking import Job, TaskPath

log = logging.getLogger("interlock.sdk")

# How long to wait for the AgentDefs in the agents bucket before taking the first task.
_AGENTDEFS_WAIT = 2.0


class Lifecycle:
    """The events of one :meth:`~interlock.sdk.Worker.run`."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.force = asyncio.Event()
        self.ready = asyncio.Event()
        self.done = asyncio.Event()


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The worker's settings for one run (see :class:`~interlock.sdk.Worker`)."""

    name: str
    instance_id: str
    concurrency: int
    ack_wait: float
    grace_period: float
    heartbeat_interval: float
    max_deliver: int
    pull_expires: float


class Serving:
    """One run of a worker over a connected client.

    Args:
        settings: the worker's settings, as they are when the run starts.
        capabilities: the registered capabilities, by name.
        catalog: the AgentDefs, followed while serving.
        path: what is done with each task message and cancel notice.
        liveness: the worker's liveness record, written by the heartbeats.
        life: the run's events (stop, force, ready).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        capabilities: Mapping[str, Capability],
        catalog: AgentDefCatalog,
        path: TaskPath,
        liveness: Callable[[], dict[str, Any]],
        life: Lifecycle,
    ) -> None:
        self._settings = settings
        self._capabilities = capabilities
        self._catalog = catalog
        self._path = path
        self._liveness = liveness
        self._life = life
        self.progress: list[ProgressAcks] = []  # one per consumer
        """The progress acks of each consumer, emptied when the run ends."""

    async def serve(self, nc: Client, subjects: Subjects) -> None:
        """Serve until the run is asked to stop, then stop (the connection stays open)."""
        settings, life = self._settings, self._life
        js = jetstream(nc)
        pool = SlotPool(settings.concurrency)
        background: list[asyncio.Task[Any]] = []  # catalog and heartbeats
        pullers: list[asyncio.Task[Any]] = []
        consumers: list[PullConsumer] = []
        controls: list[Any] = []
        heartbeats = self._heartbeats(js, subjects)
        try:
            loaded = asyncio.Event()
            background.append(
                asyncio.create_task(self._catalog.follow(js, subjects.agents_bucket, loaded))
            )
            for name in self._capabilities:
                controls.append(
                    await nc.subscribe(subjects.controls_of(name), cb=self._path.on_control)
                )
            for cap in self._capabilities.values():
                info = await self._bind(nc, js, subjects, cap)
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
                settings.name,
                settings.instance_id,
                ", ".join(self._capabilities),
                settings.concurrency,
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
                    log.error("worker %s failed; stopping", settings.name)
                    raise error
        finally:
            await cancel_and_wait(*pullers)
            for consumer in consumers:
                await consumer.drain()
            # Heartbeats go on while running handlers finish: the worker is still alive.
            await self._settle_in_flight()
            for progress in self.progress:
                progress.close()
            self.progress.clear()
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
            log.info("worker %s (%s) stopped", settings.name, settings.instance_id)

    def _heartbeats(self, js: JetStreamContext, subjects: Subjects) -> Heartbeats:
        return Heartbeats(
            js,
            subjects.workers_bucket,
            list(self._capabilities),
            self._settings.instance_id,
            self._liveness,
            self._settings.heartbeat_interval,
        )

    async def _settle_in_flight(self) -> None:
        """Let running handlers finish within the grace period; hand back the rest."""
        tasks, life = self._path.tasks, self._life
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.grace_period
        while tasks and not life.force.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            forced = asyncio.ensure_future(life.force.wait())
            await asyncio.wait(
                {*tasks, forced}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            forced.cancel()
        if not tasks:
            return
        log.warning("handing back %d unfinished task(s)", len(tasks))
        self._path.stop_all("shutdown")
        _done, pending = await asyncio.wait(set(tasks), timeout=CANCEL_CLEANUP)
        await cancel_and_wait(*pending)

    async def _bind(
        self, nc: Client, js: JetStreamContext, subjects: Subjects, cap: Capability
    ) -> ConsumerInfo | None:
        return await bind(
            js,
            subjects,
            cap.name,
            self._life.stop,
            ack_wait=self._settings.ack_wait,
            max_deliver=self._settings.max_deliver,
            # An agent in an account of its own (its API imported under a prefix) has no
            # JetStream of its own: a create would only wait out a request nobody answers.
            may_create=js_api(nc) == JS_API,
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
        ack_wait = info.config.ack_wait or self._settings.ack_wait
        # Three progress acks per ack_wait: one may be late or lost without a redelivery.
        progress = ProgressAcks(max(ack_wait / 3, 0.05))
        self.progress.append(progress)
        path = self._path

        def deliver(msg: Msg) -> None:
            path.deliver(js, subjects, Job(cap, msg, pool, progress))

        async def ensure() -> None:
            await self._bind(nc, js, subjects, cap)

        return PullConsumer(
            nc,
            api_prefix=js_api(nc),
            stream=subjects.tasks_stream,
            consumer=consumer_name(cap.name),
            filter_subject=subjects.capability(cap.name),
            pool=pool,
            deliver=deliver,
            ensure=ensure,
            expires=self._settings.pull_expires,
        )
