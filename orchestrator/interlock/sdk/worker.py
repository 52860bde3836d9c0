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
import inspect
import logging
import os
import socket
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from nats.aio.client import Client

from interlock.core.rfc3339 import format_time
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects

from .execution import Capability, Handler, inspect_handler
from .observe import WorkerObserver, WorkerObservers
from .schemas import AgentDefCatalog, CapabilityContract, Schema
from .sending import AnswerSender
from .serving import Lifecycle, Serving, Settings
from .taking import TaskPath

log = logging.getLogger("interlock.sdk")

H = TypeVar("H", bound=Handler)


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
        self._observers = WorkerObservers(observers)
        self._capabilities: dict[str, Capability] = {}
        self._catalog = AgentDefCatalog()
        self._path = TaskPath(
            name, sender=self._sender, observers=self._observers, catalog=self._catalog
        )
        self._serving: Serving | None = None
        self._running = False
        self._started_at = datetime.now(UTC)
        self._life: Lifecycle | None = None

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
        return len(self._path.tasks)

    def add_observer(self, observer: WorkerObserver) -> None:
        self._observers.add(observer)

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
                self._serving = Serving(
                    self._settings(),
                    capabilities=self._capabilities,
                    catalog=self._catalog,
                    path=self._path,
                    liveness=self._liveness,
                    life=life,
                )
                await self._serving.serve(nc, Subjects(prefix))
            finally:
                if owned:
                    await nc.close()
        finally:
            self._running = False
            self._serving = None
            self._life = None  # the next run starts afresh
            life.done.set()

    def _lifecycle(self) -> Lifecycle:
        # Created on first use, inside the running loop (asyncio events bind to one loop).
        if self._life is None:
            self._life = Lifecycle()
        return self._life

    def _settings(self) -> Settings:
        return Settings(
            name=self.name,
            instance_id=self.instance_id,
            concurrency=self._concurrency,
            ack_wait=self.ack_wait,
            grace_period=self.grace_period,
            heartbeat_interval=self.heartbeat_interval,
            max_deliver=self.max_deliver,
            pull_expires=self.pull_expires,
        )

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

    # --- liveness -----------------------------------------------------------------

    def _liveness(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instance": self.instance_id,
            "capabilities": list(self._capabilities),
            "concurrency": self._concurrency,
            "in_flight": len(self._path.tasks),
            "started_at": format_time(self._started_at),
            "heartbeat_at": format_time(datetime.now(UTC)),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
