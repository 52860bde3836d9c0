"""Run one worker as a process: resolve it by name, serve until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
from typing import TYPE_CHECKING

from interlock.core.vocabulary import InterlockError
from interlock.transport.connection import ConnectOptions

from .worker import Worker, agent_connection_name

if TYPE_CHECKING:
    from nats.aio.client import Client
    from opentelemetry.sdk.trace import TracerProvider

    from interlock.transport.health import HealthServer

log = logging.getLogger("interlock.sdk")


class NotAWorker(InterlockError, TypeError):
    """What ``module:attribute`` names is no :class:`Worker`, nor a function of no
    arguments that returns one (the command says so, without a traceback)."""


def load_worker(target: str) -> Worker:
    """The worker named by ``target``: a reference agent name or ``module:attribute``.

    The attribute may be a :class:`Worker` or a function of no arguments returning one.

    Raises:
        LookupError: no such reference agent, module or attribute.
        NotAWorker: the attribute is not a worker, nor makes one when called.
    """
    if ":" not in target:
        # Imported on use: the reference agents are a separate package.
        import interlock_agents

        return interlock_agents.load_worker(target)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise LookupError(f"cannot import {module_name!r} (from {target!r}): {exc}") from exc
    found: object = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise LookupError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(found, Worker) and callable(found):
        try:
            found = found()
        except TypeError as exc:  # it takes arguments: a class of the module, say
            raise NotAWorker(
                f"{target!r} is not an interlock.sdk.Worker, and called with no arguments "
                f"it does not make one ({exc}): name the Worker (module:worker) or a "
                "function of no arguments returning one"
            ) from exc
    if not isinstance(found, Worker):
        kind = type(found).__name__
        raise NotAWorker(
            f"{target!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not an "
            "interlock.sdk.Worker: name the Worker (module:worker) or a function of no "
            "arguments returning one"
        )
    return found


async def run_agent(
    target: str,
    options: ConnectOptions,
    concurrency: int | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
) -> None:
    """Run the worker ``target`` (see :func:`load_worker`) until SIGINT or SIGTERM.

    The first signal stops gracefully (running handlers get the worker's grace period);
    a second one hands the unfinished tasks back at once.

    Args:
        target: ``echo``, ``http-fetch``, ``command`` or ``module:attribute``.
        options: where to connect; its prefix names the installation.
        concurrency: overrides the worker's own limit.
        metrics_port: serve ``/metrics``, ``/healthz`` and ``/readyz`` on this port
            (0: any free port; None: no endpoint). Tracing follows the ``OTEL_*`` variables.
        metrics_host: the address it listens on (None: every address).
    """
    from interlock.transport.connection import connect

    worker = load_worker(target)
    if concurrency is not None:
        worker.concurrency = concurrency
    provider = _instrument(worker, options)
    nc = await connect(options.named(agent_connection_name(worker)))
    taking_tasks = asyncio.Event()
    server = await _health_server(metrics_port, nc, taking_tasks, metrics_host)
    installed = _stop_on_signals(worker)

    async def mark_ready() -> None:
        with contextlib.suppress(RuntimeError):
            await worker.wait_ready()
            taking_tasks.set()

    marker = asyncio.create_task(mark_ready())
    try:
        await worker.run(nc, prefix=options.prefix)
    finally:
        marker.cancel()
        loop = asyncio.get_running_loop()
        for sig in installed:
            loop.remove_signal_handler(sig)
        if server is not None:
            await server.stop()
        # Closing: a connection already gone leaves nothing to undo.
        with contextlib.suppress(Exception):
            await nc.close()
        if provider is not None:
            provider.shutdown()


def _instrument(worker: Worker, options: ConnectOptions) -> TracerProvider | None:
    """Prometheus metrics always; tracing when the ``OTEL_*`` variables ask for it."""
    from interlock.transport.tracing import tracer_provider_from_env

    from .metrics import PrometheusObserver
    from .tracing import WorkerTracer

    provider = tracer_provider_from_env(f"interlock-agent-{worker.name}")
    if provider is not None:
        from opentelemetry import trace

        # Global, so that spans a handler starts become children of the task's span.
        trace.set_tracer_provider(provider)
        worker.add_observer(WorkerTracer(provider, worker.name, options.subjects))
    worker.add_observer(PrometheusObserver(worker.name))
    return provider


async def _health_server(
    port: int | None, nc: Client, taking_tasks: asyncio.Event, host: str | None = None
) -> HealthServer | None:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` (0: any free port; None: none)."""
    from interlock.transport.health import ALL_HOSTS, HealthServer

    if port is None:
        return None

    async def ready() -> str | None:
        # Taking tasks proves its consumers (and so the TASKS stream) exist; an agent's
        # credentials allow it no look at the other streams and buckets.
        if not taking_tasks.is_set():
            return "worker not yet taking tasks"
        if not nc.is_connected:
            return "not connected to NATS"
        return None

    server = HealthServer(port, ready=ready, host=host or ALL_HOSTS)
    try:
        await server.start()
    except OSError as exc:
        # An expected failure: no traceback.
        log.error(  # noqa: TRY400
            "cannot serve metrics on port %d: %s; running without /metrics, /healthz and "
            "/readyz: give --metrics-port (INTERLOCK_METRICS_PORT) a free port, 0 for any, "
            "or --no-metrics for none",
            port,
            exc,
        )
        return None
    return server


def _stop_on_signals(worker: Worker) -> list[signal.Signals]:
    """SIGINT and SIGTERM stop the worker (a second one: at once); the signals installed."""
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        force = len(received) > 1
        log.info(
            "%s: %s",
            signal.Signals(signum).name,
            "handing back running tasks" if force else "stopping after running tasks",
        )
        worker.request_stop(force=force)

    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, on_signal, int(sig))
            installed.append(sig)
    return installed
