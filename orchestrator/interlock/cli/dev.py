"""``interlock dev``: a real nats-server with JetStream, the orchestrator and the reference
agents, in one process tree on one machine.

It lives in the CLI because it wires both sides together: the runtime (the orchestrator)
and the SDK (the reference agents' workers), which never import each other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO

from nats.aio.client import Client

import interlock_agents
from interlock.auth.buckets import bucket_limits, ensure_party_bucket, party_buckets
from interlock.auth.dev import DEFAULT_DATA_DIR, DevAuth, prepare, record_context
from interlock.runtime import eventloop
from interlock.runtime.client import InterlockClient
from interlock.runtime.durability import DEFAULT_GROUP_COMMIT
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.health import OrchestratorInstrumentation
from interlock.runtime.service import Orchestrator
from interlock.sdk import Worker
from interlock.sdk.runner import load_worker
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import NatsServerFailed, NatsServerNotFound
from interlock.transport.health import DEFAULT_SERVE_PORT, LOCAL_HOST
from interlock.transport.logmac import SecretDamaged
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.dev")

REFERENCE = ("echo", "http-fetch", "command")


def reference_capabilities() -> list[str]:
    """The capabilities the reference agents serve (what their credentials allow)."""
    caps: list[str] = []
    for name in REFERENCE:
        caps += load_worker(name).capabilities
    return list(dict.fromkeys(caps))


async def start_stack(
    url: str,
    *,
    prefix: str = "il",
    agents: bool = True,
    auth: DevAuth | None = None,
    group_commit: int = 0,
    instrument: Callable[[Orchestrator, list[Worker]], None] | None = None,
) -> tuple[Orchestrator, list[Worker], list[asyncio.Task[None]], Client]:
    """Orchestrator plus reference agent workers against ``url`` (AgentDefs applied).

    With ``auth``, the orchestrator and the agents connect with their own credentials.
    ``group_commit``: the orchestrator's run-log group commit (0: off). ``instrument``
    is given the orchestrator and the workers before they start (their observers must
    see the first decisions and tasks).
    """
    opts = ConnectOptions.resolve(
        url,
        prefix=prefix,
        creds_file=str(auth.orchestrator) if auth else None,
        name="interlock-orchestrator",
    )
    agent_opts = ConnectOptions.resolve(
        url, prefix=prefix, creds_file=str(auth.agents) if auth else None
    )
    nc = await connect(opts)
    client = InterlockClient(nc, opts.subjects)
    await client.ensure_provisioned()
    if auth is not None:  # each agent's and publisher's own object bucket
        limits = bucket_limits(auth.keys)
        for bucket in party_buckets(auth.keys.issued()):
            await ensure_party_bucket(client.payloads.objects, bucket, limits.get(bucket))
    if agents:
        sources = [(f"<{name}>", interlock_agents.manifest_text(name)) for name in REFERENCE]
        result = await client.apply(sources)
        result.compiled.raise_for_errors()
    orchestrator = Orchestrator(nc, opts.subjects, group_commit=group_commit)
    workers = [load_worker(name) for name in REFERENCE] if agents else []
    if instrument is not None:
        instrument(orchestrator, workers)
    await orchestrator.start()
    tasks = [asyncio.create_task(worker.run(agent_opts)) for worker in workers]
    return orchestrator, workers, tasks, nc


async def stop_stack(
    orchestrator: Orchestrator, workers: list[Worker], tasks: list[asyncio.Task[None]], nc: Client
) -> None:
    for worker in workers:
        # Closing: a connection already gone leaves nothing to undo.
        with contextlib.suppress(Exception):
            await worker.stop()
    for task in tasks:
        # Stopping: what ended the task was logged where it happened.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    await orchestrator.stop()
    # Closing: a connection already gone leaves nothing to undo.
    with contextlib.suppress(Exception):
        await nc.close()


DEV_TOKEN_NAME = "dev-operator"  # noqa: S105 - a name, not a secret


def dev_token_path(data_dir: Path) -> Path:
    """Where ``interlock dev`` keeps the HTTP gateway's operator token."""
    return data_dir / "creds" / "http-operator.token"


async def ensure_dev_token(nc: Client, subjects: Subjects, data_dir: Path) -> Path:
    """An operator token for the dev gateway, kept in ``data_dir`` (made once, reused)."""
    from interlock.gateway.auth import Tokens
    from interlock.transport.jetstream import jetstream

    path = dev_token_path(data_dir)
    tokens = Tokens(jetstream(nc), subjects)
    token = path.read_text().strip() if path.is_file() else None
    await tokens.revoke(DEV_TOKEN_NAME)
    token = await tokens.issue(DEV_TOKEN_NAME, "operator", token=token)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.touch(mode=0o600)
    tmp.write_text(token + "\n")
    tmp.replace(path)
    return path


async def _start_gateway(
    url: str, auth: DevAuth | None, data_dir: Path, port: int, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """The HTTP gateway on 127.0.0.1, on its own connection and credentials (role
    ``gateway``); its operator token is issued with the operator's."""
    from interlock.console import ConsoleConfig
    from interlock.gateway.app import serve_gateway

    admin_opts = ConnectOptions.resolve(
        url, creds_file=str(auth.operator) if auth else None, name="interlock-dev"
    )
    admin = await connect(admin_opts)
    try:
        token = await ensure_dev_token(admin, admin_opts.subjects, data_dir)
    finally:
        await admin.close()
    opts = ConnectOptions.resolve(
        url, creds_file=str(auth.gateway) if auth else None, name="interlock-gateway"
    )
    nc = await connect(opts)
    subjects = opts.subjects
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def serve() -> None:
        try:
            await serve_gateway(
                nc,
                subjects,
                host="127.0.0.1",
                port=port,
                console=ConsoleConfig.from_environment(),
                stop=stop,
                started=started,
            )
        finally:
            await nc.close()

    task = asyncio.create_task(serve())
    done, _ = await asyncio.wait(
        [task, started],  # type: ignore[type-var]
        return_when=asyncio.FIRST_COMPLETED,
    )
    if started not in done:
        try:
            task.result()
        except OSError as exc:
            sys.stderr.write(f"interlock dev: no HTTP gateway: port {port}: {exc.strerror}\n")
            return None
    url = started.result()
    print(f"HTTP gateway at {url} (operator token in {token})", flush=True)
    print(f"export INTERLOCK_HTTP={url}", flush=True)
    print(f"web console at {url}/ui/ (sign in with that token)", flush=True)
    return task


def instrumented(
    orchestrator: Orchestrator, workers: list[Worker], host: str, port: int
) -> OrchestratorInstrumentation:
    """One endpoint for the whole stack: the orchestrator's metrics and probes, with the
    agents' metrics (they count into the same registry), on ``host:port``."""
    from interlock.sdk.metrics import PrometheusObserver

    for worker in workers:
        worker.add_observer(PrometheusObserver(worker.name))
    return OrchestratorInstrumentation(orchestrator, port=port, host=host)


def secure(data_dir: Path, prefix: str = "il") -> DevAuth:
    """Keys, server configuration and role credentials in ``data_dir`` (see interlock.auth.dev)."""
    return prepare(data_dir, Subjects(prefix), reference_capabilities())


def _say_started(url: str, data_dir: Path, auth: DevAuth | None, *, fsync: bool) -> None:
    """What dev prints once its server is up: where it is, and how the CLI reaches it."""
    print(f"NATS (JetStream) at {url}, data in {data_dir}", flush=True)
    print(f"export INTERLOCK_URL={url}", flush=True)
    if fsync:
        print(
            "every write fsynced (sync_interval: always); run-log appends group-committed",
            flush=True,
        )
    recorded = record_context(url, auth.operator if auth else None, data_dir)
    if auth is not None:
        where = (
            f"the CLI run from any folder uses it (recorded in {recorded})"
            if recorded is not None
            else f"the CLI run from {data_dir.resolve().parent} uses it"
            if data_dir.name == DEFAULT_DATA_DIR
            else "the CLI needs it"
        )
        print(
            f"authentication on: credentials in {auth.creds_dir}; {where}; or "
            f"export INTERLOCK_CREDS={auth.operator.resolve()}",
            flush=True,
        )
    else:
        print("authentication OFF (--insecure): anyone who reaches the port may do anything")


def _claim(data_dir: Path) -> IO[str] | str:
    """The data directory, for this process alone while it runs (an open file holding an
    exclusive lock, released when the process ends), or what holds it: two nats-servers
    storing into one JetStream directory would each take the other's files for their own."""
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    held = (data_dir / "dev.lock").open("a+", encoding="utf-8")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        held.seek(0)
        holder = held.read().strip() or "another process"
        held.close()
        return (
            f"another interlock dev ({holder}) runs with its data in {data_dir}: "
            "stop it first (Ctrl-C), or give this one --data-dir DIR"
        )
    held.seek(0)
    held.truncate()
    return held


def _start_server(
    data_dir: Path, port: int, auth: DevAuth | None, *, fsync: bool, claim: IO[str]
) -> EmbeddedNats | None:
    """The nats-server on ``data_dir``, its URL written into the claim; None when it
    could not start (said on stderr)."""
    server = EmbeddedNats(
        data_dir, port=port, args=auth.server_args if auth else (), sync_always=fsync
    )
    try:
        server.start()
    except (NatsServerNotFound, NatsServerFailed) as exc:
        sys.stderr.write(f"interlock dev: {exc}\n")
        if "address already in use" in str(exc):
            sys.stderr.write(
                f"interlock dev: port {port} is taken by another process: stop it, or give "
                "--port N (0 picks a free one)\n"
            )
        return None
    claim.write(f"pid {os.getpid()}, NATS at {server.url}")
    claim.flush()
    return server


def run_dev(
    data_dir: Path,
    port: int,
    *,
    agents: bool = True,
    http_port: int | None = 8480,
    insecure: bool = False,
    fsync: bool = False,
    metrics: tuple[str, int] | None = (LOCAL_HOST, DEFAULT_SERVE_PORT),
) -> int:
    """``fsync``: the server fsyncs every write, and the orchestrator group-commits its
    run-log appends (it started the server, so it knows). ``metrics``: the address and
    port of the one endpoint serving the orchestrator's and the agents' metrics (port 0:
    any free one, printed; None: none)."""
    claim = _claim(data_dir)
    if isinstance(claim, str):
        sys.stderr.write(f"interlock dev: {claim}\n")
        return 2
    auth = None if insecure else secure(data_dir)
    server = _start_server(data_dir, port, auth, fsync=fsync, claim=claim)
    if server is None:
        return 2
    _say_started(server.url, data_dir, auth, fsync=fsync)

    async def main() -> None:
        telemetry: list[OrchestratorInstrumentation] = []

        def instrument(orchestrator: Orchestrator, workers: list[Worker]) -> None:
            if metrics is not None:
                telemetry.append(instrumented(orchestrator, workers, *metrics))

        stack = await start_stack(
            server.url,
            agents=agents,
            auth=auth,
            group_commit=DEFAULT_GROUP_COMMIT if fsync else 0,
            instrument=instrument,
        )
        for t in telemetry:
            await t.start()
            if t.server is not None:
                print(
                    f"metrics of the orchestrator and the agents at {t.server.url}/metrics "
                    f"(listening on {t.server.host})",
                    flush=True,
                )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        gateway: asyncio.Task[None] | None = None
        if http_port is not None:
            gateway = await _start_gateway(server.url, auth, data_dir, http_port, stop)
        names = ", ".join(REFERENCE) if agents else "none"
        print(f"orchestrator running; reference agents: {names}. Ctrl-C stops.", flush=True)
        await stop.wait()
        print("stopping...", flush=True)
        if gateway is not None:
            # Stopping: what ended the task was logged where it happened.
            with contextlib.suppress(Exception):
                await gateway
        await stop_stack(*stack)
        for t in telemetry:
            await t.stop()

    try:
        eventloop.run(main())
    except eventloop.EventLoopError as exc:
        sys.stderr.write(f"interlock dev: {exc}\n")
        return 2
    except SecretDamaged as exc:
        sys.stderr.write(f"interlock dev: {exc}\n")
        return 1
    finally:
        server.stop()
        claim.close()  # the data directory is free for the next dev
        print("stopped", flush=True)
    return 0
