"""The long-running processes: ``interlock serve``, ``interlock agent run``, ``interlock dev``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    add_object_flags,
    object_limits,
)
from interlock.cli.connecting import (
    add_connection_flags,
    add_log_level,
    connect_failure,
    env_int,
    options,
    setup_logging,
    stop_on_signals,
)
from interlock.runtime import eventloop
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import ConnectionFailed
from interlock.transport.logmac import SecretDamaged
from interlock.transport.partitions import MAX_PARTITIONS

if TYPE_CHECKING:
    from interlock.core.events import HistoryLimits
    from interlock.runtime.retention import Policy
    from interlock.transport.objects import ObjectLimits

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_process_parsers(sub: Sub) -> None:
    _add_serve_parser(sub)
    _add_agent_and_dev_parsers(sub)


def _add_serve_parser(sub: Sub) -> None:
    p = sub.add_parser("serve", help="run the orchestrator")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz and /readyz on this port "
        "(env INTERLOCK_METRICS_PORT; default 9464; 0: any free port)",
    )
    _add_metrics_host(p, "0.0.0.0: every address")
    _add_no_metrics(p)
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="stream replicas when provisioning: 3 on a JetStream cluster "
        "(env INTERLOCK_REPLICAS; default 1)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="run-log partitions of an installation provisioned for the first time "
        "(env INTERLOCK_PARTITIONS; default 1; later: interlock partitions set)",
    )
    p.add_argument(
        "--ack-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long messages a killed orchestrator had taken wait before another "
        "takes them (default 10)",
    )
    p.add_argument(
        "--group-commit",
        type=int,
        default=None,
        metavar="N",
        help="send run-log appends in atomic batches of at least N once N await their "
        "acknowledgement; 0: never (env INTERLOCK_GROUP_COMMIT; default: 16 when the "
        "server fsyncs every write, as its monitoring endpoint says, else 0)",
    )
    p.add_argument(
        "--nats-monitor",
        default=None,
        metavar="URL",
        help="the NATS server's monitoring address, where /varz says whether it fsyncs "
        "every write (env INTERLOCK_NATS_MONITOR; default http://<NATS host>:8222; "
        "off: do not look)",
    )
    p.add_argument(
        "--retention",
        default=None,
        metavar="DURATION",
        help="how long a finished run is kept when its workflow sets no retention, e.g. "
        "30d (env INTERLOCK_RETENTION; default: for good)",
    )
    archive = p.add_mutually_exclusive_group()
    archive.add_argument(
        "--archive-bucket",
        default=None,
        metavar="NAME",
        help="before retention deletes a run, write its log to this Object Store bucket, "
        "when its workflow names no archive (env INTERLOCK_ARCHIVE_BUCKET)",
    )
    archive.add_argument(
        "--archive-dir",
        default=None,
        metavar="DIR",
        help="the same, to a folder of this host (env INTERLOCK_ARCHIVE_DIR)",
    )
    add_object_flags(p)
    _add_history_flags(p)
    add_log_level(p)
    add_connection_flags(p)
    p.set_defaults(func=cmd_serve)


def _add_history_flags(p: argparse.ArgumentParser) -> None:
    """The installation's history limits (see docs/operations.md#history-limits)."""
    p.add_argument(
        "--history-max-records",
        type=int,
        default=None,
        metavar="N",
        help="the records of one run's log when its workflow sets no spec.history.max_records "
        "(env INTERLOCK_HISTORY_MAX_RECORDS; default 200000)",
    )
    p.add_argument(
        "--history-max-bytes",
        default=None,
        metavar="SIZE",
        help="the bytes of one run's log, e.g. 64MiB, when its workflow sets no "
        "spec.history.max_bytes (env INTERLOCK_HISTORY_MAX_BYTES; default 256MiB)",
    )
    p.add_argument(
        "--continue-as-new",
        choices=["auto", "never"],
        default=None,
        help="near a history limit, continue a run as new at its next transition (auto) or "
        "let it fail at the limit (never), when its workflow does not say "
        "(env INTERLOCK_CONTINUE_AS_NEW; default auto)",
    )


def _add_metrics_host(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--metrics-host",
        default=None,
        metavar="ADDRESS",
        help=f"the address /metrics listens on (env INTERLOCK_METRICS_HOST; default {default})",
    )


def metrics_host(args: argparse.Namespace, default: str) -> str:
    """``--metrics-host``, else ``INTERLOCK_METRICS_HOST``, else ``default``."""
    return args.metrics_host or os.environ.get("INTERLOCK_METRICS_HOST") or default


_MAX_PORT = 65535


def _add_no_metrics(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="no /metrics, /healthz and /readyz endpoint (metrics are still counted)",
    )


def served_metrics_port(args: argparse.Namespace, default: int) -> int | None:
    """The metrics port to serve on (0: any free port), None with ``--no-metrics``."""
    if args.no_metrics:
        return None
    port = env_int(args.metrics_port, "INTERLOCK_METRICS_PORT", default)
    if not 0 <= port <= _MAX_PORT:
        raise CliError(
            f"--metrics-port (INTERLOCK_METRICS_PORT) takes 0 (any free port) to {_MAX_PORT}, "
            f"got {port}; --no-metrics serves none",
            EXIT_USAGE,
        )
    return port


def _add_agent_and_dev_parsers(sub: Sub) -> None:
    p = sub.add_parser("agent", help="agent workers")
    agent_sub = p.add_subparsers(dest="agent_command", metavar="COMMAND")
    agent_sub.required = True
    run = agent_sub.add_parser("run", help="run one agent worker")
    run.add_argument("target", help="a reference agent (echo, http-fetch, command) or module:attr")
    run.add_argument("--concurrency", type=int, default=None)
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz and /readyz on this port "
        "(env INTERLOCK_METRICS_PORT; default 9465; 0: any free port)",
    )
    _add_metrics_host(run, "0.0.0.0: every address")
    _add_no_metrics(run)
    add_log_level(run)
    add_connection_flags(run)
    run.set_defaults(func=cmd_agent_run)

    p = sub.add_parser("dev", help="embedded NATS, the orchestrator and the reference agents")
    p.add_argument("--port", type=int, default=4222, help="NATS port (0: any free port)")
    p.add_argument("--data-dir", default=".interlock", help="where NATS keeps its data")
    p.add_argument("--no-agents", action="store_true", help="do not start the reference agents")
    p.add_argument(
        "--http-port",
        type=int,
        default=8480,
        help="HTTP gateway port on 127.0.0.1 (default 8480; 0: any free port)",
    )
    p.add_argument("--no-http", action="store_true", help="do not start the HTTP gateway")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the orchestrator's and the reference agents' /metrics, /healthz and "
        "/readyz on this port (env INTERLOCK_METRICS_PORT; default 9464; 0: any free port)",
    )
    _add_metrics_host(p, "127.0.0.1: this machine only")
    _add_no_metrics(p)
    p.add_argument(
        "--fsync",
        action="store_true",
        help="the server fsyncs every write (sync_interval: always) and the orchestrator "
        "group-commits its run-log appends",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no authentication: anyone who reaches the port may do anything "
        "(default: credentials per role under DATA_DIR/creds)",
    )
    add_log_level(p)
    p.set_defaults(func=cmd_dev)


async def serve(
    opts: ConnectOptions,
    stop_event: asyncio.Event | None = None,
    *,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    replicas: int = 1,
    ack_wait: float | None = None,
    group_commit: int | None = None,
    nats_monitor: str | None = None,
    retention: Policy | None = None,
    partitions: int | None = None,
    objects: ObjectLimits | None = None,
    history: HistoryLimits | None = None,
) -> None:
    """Run the orchestrator until ``stop_event`` (or SIGINT/SIGTERM); ``metrics_port``
    serves /metrics, /healthz and /readyz (0: any free port; None: none); tracing
    follows the OTEL_* variables.
    ``group_commit`` None: on when the server fsyncs every write, as its monitoring
    endpoint (``nats_monitor``) says (:mod:`interlock.runtime.durability`)."""
    from interlock.runtime.durability import group_commit_for
    from interlock.runtime.handling import ACK_WAIT
    from interlock.runtime.health import OrchestratorInstrumentation
    from interlock.runtime.service import Orchestrator
    from interlock.transport.health import ALL_HOSTS
    from interlock.transport.tracing import tracer_provider_from_env

    nc = await connect(opts.named("interlock-orchestrator"))
    try:
        group_commit = await group_commit_for(nc, group_commit, nats_monitor)
    except BaseException:
        await nc.close()
        raise
    orchestrator = Orchestrator(
        nc,
        opts.subjects,
        replicas=replicas,
        partitions=partitions,
        ack_wait=ack_wait or ACK_WAIT,
        group_commit=group_commit,
        retention=retention,
        objects=objects,
    )
    orchestrator.history = history
    telemetry = OrchestratorInstrumentation(
        orchestrator,
        port=metrics_port,
        host=metrics_host or ALL_HOSTS,
        provider=tracer_provider_from_env("interlock-orchestrator"),
    )
    stop_event = stop_event or asyncio.Event()
    try:
        await orchestrator.start()
        await telemetry.start()
        with stop_on_signals(stop_event.set):
            await stop_event.wait()
    finally:
        await orchestrator.stop()
        await telemetry.stop()
        await nc.close()


def cmd_serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from interlock.runtime.health import DEFAULT_SERVE_PORT
    from interlock.transport.health import ALL_HOSTS

    port = served_metrics_port(args, DEFAULT_SERVE_PORT)
    replicas = env_int(args.replicas, "INTERLOCK_REPLICAS", 1)
    if replicas < 1:
        raise CliError(f"--replicas must be at least 1, got {replicas}", EXIT_USAGE)
    partitions = env_int(args.partitions, "INTERLOCK_PARTITIONS", None)
    if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
        raise CliError(
            f"--partitions must be from 1 to {MAX_PARTITIONS}, got {partitions}", EXIT_USAGE
        )
    if args.ack_wait is not None and args.ack_wait <= 0:
        raise CliError(f"--ack-wait must be positive, got {args.ack_wait}", EXIT_USAGE)
    group_commit = group_commit_setting(args.group_commit)
    try:
        eventloop.run(
            serve(
                options(args, operator=False),
                metrics_port=port,
                metrics_host=metrics_host(args, ALL_HOSTS),
                replicas=replicas,
                ack_wait=args.ack_wait,
                group_commit=group_commit,
                nats_monitor=args.nats_monitor or os.environ.get("INTERLOCK_NATS_MONITOR"),
                retention=retention_policy(args),
                partitions=partitions,
                objects=object_limits(args),
                history=history_limits(args),
            )
        )
    except eventloop.EventLoopError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except SecretDamaged as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    except ConnectionFailed as exc:
        raise connect_failure(exc, args) from exc
    return EXIT_OK


def retention_policy(args: argparse.Namespace) -> Policy:
    """``--retention``, ``--archive-bucket``, ``--archive-dir`` (else their variables)."""
    from interlock.core.definition import ArchiveDef
    from interlock.core.lowering_scope import parse_duration
    from interlock.core.names import BUCKET_NAME
    from interlock.runtime.retention import Policy

    text = args.retention or os.environ.get("INTERLOCK_RETENTION") or None
    seconds = None if text is None else parse_duration(text)
    if text is not None and (seconds is None or seconds <= 0):
        raise CliError(
            f"--retention (INTERLOCK_RETENTION) takes a duration such as 30d or 12h, got {text!r}",
            EXIT_USAGE,
        )
    bucket = args.archive_bucket or os.environ.get("INTERLOCK_ARCHIVE_BUCKET") or None
    folder = args.archive_dir or os.environ.get("INTERLOCK_ARCHIVE_DIR") or None
    if bucket is not None and folder is not None:
        raise CliError("archive to a bucket or to a folder, not both", EXIT_USAGE)
    if bucket is not None and not BUCKET_NAME.match(bucket):
        raise CliError(f"--archive-bucket {bucket!r}: letters, digits, '-' and '_'", EXIT_USAGE)
    archive = ArchiveDef(bucket, folder) if bucket or folder else None
    return Policy(seconds, archive)


def history_limits(args: argparse.Namespace) -> HistoryLimits:
    """``--history-max-records``, ``--history-max-bytes``, ``--continue-as-new`` (else their
    variables, else the defaults)."""
    from interlock.core.events import HistoryLimits
    from interlock.core.history import DEFAULT, MIN_HISTORY_BYTES, parse_size

    records_text = os.environ.get("INTERLOCK_HISTORY_MAX_RECORDS")
    records = args.history_max_records
    if records is None and records_text:
        records = int(records_text) if records_text.isdigit() else -1
    if records is not None and records < 10:
        raise CliError("--history-max-records takes a whole number of at least 10", EXIT_USAGE)
    size_text = args.history_max_bytes or os.environ.get("INTERLOCK_HISTORY_MAX_BYTES")
    size = None if size_text is None else parse_size(size_text)
    if size_text is not None and (size is None or size < MIN_HISTORY_BYTES):
        raise CliError(
            f"--history-max-bytes takes a size of at least {MIN_HISTORY_BYTES} bytes "
            f"(a number, or 64MiB, 1GB...), got {size_text!r}",
            EXIT_USAGE,
        )
    mode = args.continue_as_new or os.environ.get("INTERLOCK_CONTINUE_AS_NEW")
    if mode is not None and mode not in ("auto", "never"):
        raise CliError(f"--continue-as-new takes auto or never, got {mode!r}", EXIT_USAGE)
    return HistoryLimits(
        max_records=records or DEFAULT.max_records,
        max_bytes=size or DEFAULT.max_bytes,
        continue_as_new=mode or DEFAULT.continue_as_new,
    )


def group_commit_setting(flag: int | None) -> int | None:
    """``--group-commit``, else ``INTERLOCK_GROUP_COMMIT``, else ``None``: as the server's
    syncing says (found at start). 0 is off; a batch is at least 2."""
    group_commit = env_int(flag, "INTERLOCK_GROUP_COMMIT", None)
    if group_commit is not None and (group_commit == 1 or group_commit < 0):
        raise CliError(
            "--group-commit (INTERLOCK_GROUP_COMMIT) takes 0 (off) or a batch of at least 2, "
            f"got {group_commit}",
            EXIT_USAGE,
        )
    return group_commit


def cmd_agent_run(args: argparse.Namespace) -> int:
    from interlock.sdk.runner import NotAWorker, run_agent

    setup_logging(args.log_level)
    if ":" in args.target and "" not in sys.path and os.getcwd() not in sys.path:
        # `interlock agent run my_agents:worker` from the folder holding my_agents.py, as
        # `python -m` would find it (the console script's sys.path has no current folder).
        sys.path.insert(0, os.getcwd())
    try:
        from interlock.runtime.health import DEFAULT_AGENT_PORT

        port = served_metrics_port(args, DEFAULT_AGENT_PORT)
        opts = options(args, operator=False)
        _check_agent_creds(args.target, opts.creds_file)
        from interlock.transport.health import ALL_HOSTS

        host = metrics_host(args, ALL_HOSTS)
        eventloop.run(run_agent(args.target, opts, args.concurrency, port, host))
    except eventloop.EventLoopError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except ConnectionFailed as exc:
        raise connect_failure(exc, args) from exc
    except (LookupError, ImportError, AttributeError, NotAWorker) as exc:
        raise CliError(str(exc)) from exc
    return EXIT_OK


def _check_agent_creds(target: str, creds_file: str | None) -> None:
    """An agent credential must allow every capability the worker serves: refuse at once,
    naming what is missing, rather than serve half and wait forever for the rest."""
    if creds_file is None:
        return
    from interlock.auth.jwt import creds_capabilities, creds_tags
    from interlock.sdk.runner import load_worker

    try:
        allowed = creds_capabilities(creds_file)
        role = next((t[5:] for t in creds_tags(creds_file) if t.startswith("role:")), None)
    except (OSError, ValueError):
        return  # not readable here: the connection reports it
    serves = load_worker(target).capabilities
    if role in ("operator", "gateway", "publisher"):
        # Such a credential may take no task and send no answer: the worker would retry
        # its refused requests for good.
        raise CliError(
            f"{creds_file} is {'an' if role == 'operator' else 'a'} {role}'s credential, "
            "which serves no capability: run an agent on an agent's credential "
            f"(interlock creds issue agent {' '.join(f'--capability {c}' for c in serves)} "
            "-o FILE)"
        )
    if allowed is None:
        return  # not an agent credential of Interlock's (the server decides)
    missing = [c for c in serves if c not in allowed]
    if missing:
        raise CliError(
            f"{creds_file} allows capabilities {', '.join(sorted(allowed)) or 'none'}; "
            f"{target} also serves {', '.join(missing)}: issue a credential with "
            + " ".join(f"--capability {c}" for c in serves)
        )


def cmd_dev(args: argparse.Namespace) -> int:
    from interlock.cli.dev import run_dev

    setup_logging(args.log_level)
    from interlock.transport.health import DEFAULT_SERVE_PORT, LOCAL_HOST

    return run_dev(
        Path(args.data_dir),
        args.port,
        metrics=(
            None
            if (port := served_metrics_port(args, DEFAULT_SERVE_PORT)) is None
            else (metrics_host(args, LOCAL_HOST), port)
        ),
        agents=not args.no_agents,
        http_port=None if args.no_http else args.http_port,
        insecure=args.insecure,
        fsync=args.fsync,
    )
