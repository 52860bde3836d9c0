"""The asynchronous client (see :mod:`interlock.client`).

The public facade: one method per call, with the docstring a user reads; the work behind
each call is in the modules beside it (:mod:`.catalog` what is applied, :mod:`.reading`
runs and dead letters, :mod:`.emitting`, :mod:`.signalling`, :mod:`.debugging`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nats.aio.client import Client as NatsClient

from interlock.client import catalog, chains, reading
from interlock.client.errors import (
    InvalidManifest,
    no_stream_is_no_run,
)
from interlock.client.letters import DeadLetterCalls
from interlock.client.queuecalls import QueueCalls
from interlock.core import events as ev
from interlock.core.deadline import check_deadline
from interlock.core.ids import check_run_id
from interlock.core.pauses import check_reason
from interlock.core.state import RunState
from interlock.runtime.client import InterlockClient, new_run_id
from interlock.runtime.versions import Applied
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects
from interlock.views import (
    AgentView,
    EmitResult,
    RunDescription,
    RunResult,
    RunSummary,
    SignalResult,
    WorkflowDetail,
    WorkflowSummary,
)
from interlock.views.build import (
    describe_run,
    summary_of,
)

if TYPE_CHECKING:
    from interlock.runtime.retention import Deleted
    from interlock.runtime.snapshots import Read

# What loads the compiler, the dialects or the engine (apply, emit, signal, debugging) is
# imported when called, by the modules behind those calls too: reading never loads them.

EMIT_WAIT_S = 5.0
"""How long ``emit`` waits for the runs it starts to be in the log, by default."""
SIGNAL_WAIT_S = 5.0
"""How long ``signal`` waits to see what the run did with the event, by default."""
T = TypeVar("T")


class Client(DeadLetterCalls, QueueCalls):
    """Workflows, runs, events, agents and dead letters of one installation.

    Build it with :meth:`connect` (or around a connection you hold: ``Client(nc)``), and
    close it with :meth:`close` or ``async with``.
    """

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects | None = None,
        *,
        prefix: str | None = None,
        owns_connection: bool = False,
    ) -> None:
        self.nc = nc
        self.subjects = subjects if subjects is not None else Subjects(prefix or DEFAULT_PREFIX)
        self._ops = InterlockClient(nc, self.subjects)
        self._watcher = self._ops.watcher
        self._owns = owns_connection

    @classmethod
    async def connect(
        cls,
        server: str | list[str] | None = None,
        *,
        creds: str | Path | None = None,
        nkey: str | Path | None = None,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        prefix: str | None = None,
        name: str | None = None,
        connect_wait: float | None = None,
        options: ConnectOptions | None = None,
    ) -> Client:
        """Connect as the CLI does: arguments, else ``INTERLOCK_*`` variables, else defaults
        (``nats://127.0.0.1:4222``, prefix ``il``, and with no credentials given, those
        ``interlock dev`` wrote under ``.interlock/creds/`` here, on the server it serves).

        Raises:
            ConnectionFailed: no server answered in time, or it refused the credentials.
        """
        if options is None:
            if not (creds or nkey or user or token or _auth_in_environment()):
                from interlock.auth.dev import operator_defaults  # as the CLI does

                creds, server = operator_defaults(server)
            options = ConnectOptions.resolve(
                server,
                creds_file=_path(creds),
                nkey_seed_file=_path(nkey),
                user=user,
                password=password,
                token=token,
                tls_ca=_path(tls_ca),
                tls_cert=_path(tls_cert),
                tls_key=_path(tls_key),
                prefix=prefix,
                name=name or "interlock-client",
                connect_wait=connect_wait,
            )
        nc = await connect(options)
        return cls(nc, options.subjects, owns_connection=True)

    async def close(self) -> None:
        """Stop watching, and close the connection if :meth:`connect` opened it."""
        await self._watcher.close()
        await self._ops.registry.close()
        if self._owns:
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def provision(self, replicas: int = 1) -> None:
        """Create the streams and buckets (``apply`` does it; ``serve`` too)."""
        from interlock.transport.provision import provision

        await provision(self._ops.js, self.subjects, replicas=replicas)

    # -- definitions ----------------------------------------------------------------------

    @property
    def ops(self) -> InterlockClient:
        """The operations underneath (what the CLI's ``apply`` uses with dialects)."""
        return self._ops

    async def apply(
        self,
        sources: Iterable[str | Path | tuple[str, str]],
        *,
        dialect: str | None = None,
        replicas: int = 1,
    ) -> list[Applied]:
        """Validate manifests (files, or ``(name, text)`` pairs) and store them. Other
        formats than the native manifest are detected and lowered as ``interlock apply``
        does (``dialect`` forces one).

        Raises:
            InvalidManifest: any manifest is invalid; nothing was stored.
        """
        from interlock.client import debugging
        from interlock.dialects import prepare

        pairs = [
            s if isinstance(s, tuple) else (str(s), await asyncio.to_thread(debugging.read_text, s))
            for s in sources
        ]
        prepared = prepare(pairs, dialect)
        await self.provision(replicas)
        result = await self._ops.apply(
            prepared.sources,
            documents=prepared.documents,
            implied_agents=prepared.agents,
            diagnostics=prepared.diagnostics,
            lowered=prepared.lowered,
        )
        if not result.compiled.ok:
            raise InvalidManifest(result.compiled)
        return result.applied

    async def workflows(self) -> list[WorkflowSummary]:
        """The newest version of every workflow applied, by namespace and name."""
        return await catalog.workflows(self._ops)

    async def workflow(self, name: str, version: int | None = None) -> WorkflowDetail:
        """One workflow (``name`` or ``namespace/name``): its versions and the manifest of
        ``version`` (default: the newest).

        Raises:
            UnknownWorkflow: not applied (or deleted), or no such version stored.
        """
        return await catalog.workflow(self._ops, name, version)

    async def delete_workflow(self, name: str) -> int:
        """Stop ``name`` from starting new runs; returns the version that was newest.

        Its versions stay stored: runs in flight keep running the version they started
        with, and their logs keep folding. Applying it again makes it startable again.

        Raises:
            UnknownWorkflow: not applied (or already deleted).
        """
        return await catalog.delete_workflow(self._ops, name)

    async def agents(self) -> list[AgentView]:
        """Every AgentDef with the live workers of its capabilities and their queues."""
        return await catalog.agents(self._ops)

    async def agent(self, name: str) -> AgentView:
        """One AgentDef. Raises :class:`UnknownAgent` when none has that name."""
        [agent] = await catalog.agents(self._ops, name)
        return agent

    # -- runs -----------------------------------------------------------------------------

    async def start(
        self, workflow: str, inputs: Mapping[str, Any] | None = None, *,
        run_id: str | None = None, deadline: float | None = None,
    ) -> str:  # fmt: skip
        """Start a run of the newest version of ``workflow``; returns its run id.
        ``deadline``: seconds the run may take (over the workflow's ``spec.deadline``, and
        ending as it says); 0 ends it at once, before anything is asked for.

        Raises:
            UnknownWorkflow: not applied. InvalidInputs: the inputs break its declared
            inputs. RunExists: ``run_id`` names a run already. InvalidRunId. TypeError,
            ValueError: ``deadline`` is not a number, or not from 0 to ten years.
        """
        if run_id is not None:
            check_run_id(run_id)
        if deadline is not None:
            check_deadline(deadline)
        return await self._ops.start(workflow, dict(inputs or {}), run_id, deadline)

    async def emit(
        self,
        event: CloudEvent | Mapping[str, Any] | None = None,
        *,
        type: str | None = None,
        source: str | None = None,
        data: Any = None,
        id: str | None = None,
        subject: str | None = None,
        extensions: Mapping[str, str] | None = None,
        wait: float = EMIT_WAIT_S,
    ) -> EmitResult:
        """Publish a CloudEvent as an external system would, and say what it starts.

        Give a :class:`CloudEvent`, a structured-mode JSON object, or ``type=``,
        ``source=`` and ``data=`` (``id`` defaults to a new one, ``time`` to now). The
        runs it starts are worked out with the orchestrator's own trigger rules over the
        workflows applied now; ``started`` is empty when no trigger matched. It then waits
        up to ``wait`` seconds for the orchestrator to start them (0: do not wait); a run
        not started by then is marked ``pending``.
        """
        from interlock.client import emitting

        ce = emitting.build_event(event, type, source, data, id, subject, extensions)
        return await emitting.emit(self._ops, ce, wait)

    async def signal(
        self,
        run_id: str,
        name: str,
        data: Any = None,
        *,
        source: str = "interlock://client",
        id: str | None = None,
        wait: float = SIGNAL_WAIT_S,
    ) -> SignalResult:
        """Send the event ``name`` to one run and say what the run did with it.

        Not sent when the run has finished or its state does not wait for ``name`` (the
        run would drop it): ``outcome`` says so. Otherwise the outcome is ``moved``, or
        ``declined`` when no guard was true, or ``unanswered`` when no orchestrator took it
        within ``wait`` seconds.

        Raises:
            UnknownRun: no such run.
        """
        from interlock.client import signalling

        check_run_id(run_id)
        signal = signalling.Signal(run_id, name, data, source, id or secrets.token_hex(8))
        return await signalling.send(self._ops, self._watcher, signal, wait)

    async def pause_run(self, run_id: str, reason: str = "paused by an operator") -> bool:
        """Pause a running run: no transition until resumed, what reaches it held in its
        log (False: ended, or paused already). Operators only. Raises UnknownRun;
        ValueError for a reason over 1,024 characters (nothing is sent)."""
        return await self._on_run(run_id, self._ops.pause_run, check_reason(reason))

    async def resume_run(self, run_id: str) -> bool:
        """Resume a paused run, what it held decided on in order (False: not paused)."""
        return await self._on_run(run_id, self._ops.resume_run)

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> bool:
        """Cancel a running run; False when it had finished already.

        Raises:
            UnknownRun: no such run.
        """
        return await self._on_run(run_id, self._ops.cancel, reason)

    async def _on_run(self, run_id: str, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        check_run_id(run_id)
        async with no_stream_is_no_run(run_id):
            return await call(run_id, *args)

    async def delete_run(
        self, run_id: str, *, archive_bucket: str | None = None, archive_dir: str | None = None
    ) -> Deleted:
        """Delete an ended run's log (first written to ``archive_bucket``, an Object Store
        bucket, or ``archive_dir``, as ``interlock export`` writes it), snapshot and index
        entry; recorded in the audit stream. Operators only. Raises UnknownRun, and
        RunNotEnded (nothing deleted) for a run that has not ended."""
        from interlock.core.definition import ArchiveDef

        records = await self._on_run(run_id, self._ops.read)  # as logged: refs, not values
        archive = ArchiveDef(archive_bucket, archive_dir) if archive_bucket or archive_dir else None
        return await self._ops.delete(run_id, records, archive)

    async def result(
        self,
        run_id: str,
        *,
        wait: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RunResult:
        """How the run ended: ``status``, ``outputs``, ``error`` (class, message), a cancelled
        run's ``reason``. Without ``wait`` a running run answers at once with status
        ``running``; with it, once the run has finished. A run that continued as new is
        followed to its chain's last run (``run_id``; ``chain``: the runs followed).

        Raises:
            UnknownRun: no such run. TimeoutError: still running after ``timeout`` seconds.
        """
        check_run_id(run_id)
        result = await chains.result(self._ops, self._watcher, run_id, wait, timeout)
        return await reading.loaded_result(self._ops, result)

    async def run(self, run_id: str) -> RunSummary:
        """One run's summary, folded from its log. Raises :class:`UnknownRun`."""
        check_run_id(run_id)
        read = await self._read_state(run_id)
        return summary_of(read.state, read.records)

    async def describe(self, run_id: str) -> RunDescription:
        """Everything about one run now: state, pending actions with attempts and deadlines,
        what it waits for (events and guards), timers, outputs, error.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        read = await self._read_state(run_id)
        outline = await catalog.outline_of_run(self._ops, read.state)
        warnings = [f.warning() for f in read.foreign]
        described = describe_run(read.records, outline, state=read.state, warnings=warnings)
        return await reading.described(self._ops, described, read.state)

    async def runs(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        waiting: str | None = None,
    ) -> list[RunSummary]:
        """Runs from the run index, newest first: all, or of one ``workflow`` (``name`` or
        ``namespace/name``) and/or ``status``, and/or waiting for ``waiting`` (a kind of
        :class:`~interlock.views.WaitingOn`, or ``kind:name``); at most ``limit``."""
        return await reading.runs(self._ops, workflow, status, limit, waiting)

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        """The run's log, every record in order, payloads loaded. Raises :class:`UnknownRun`."""
        return await self._ops.payloads.loaded(await self._on_run(run_id, self._ops.read))

    async def state(self, run_id: str) -> RunState:
        """The run's state folded from its log (the engine's own view)."""
        return (await self._read_state(run_id)).state

    async def _read_state(self, run_id: str) -> Read:
        """The run's state from its snapshot and the records after (UnknownRun: none)."""
        return await self._on_run(run_id, self._ops.read_state)

    async def logs(
        self,
        run_id: str,
        *,
        follow: bool = False,
        tail: int | None = None,
        since: str | None = None,
    ) -> AsyncIterator[ev.AnyRecord]:
        """The run's records in order: the last ``tail`` of them, or those at or after
        ``since`` (RFC 3339); with ``follow``, then each new one until the run ends.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        async for record in reading.logs(self._ops, run_id, follow=follow, tail=tail, since=since):
            yield record

    async def orchestrator_seen(self) -> bool | None:
        """Whether an orchestrator reads the run logs: True (it is waiting for work or took
        some in the last 10 s), False (none ever ran here, or none takes the records
        waiting for it), None (cannot tell: not allowed to look)."""
        return await reading.orchestrator_seen(self._ops)

    # -- debugging by replay (docs/debugging.md; each returns the report documented there) --

    async def explain(self, run_id: str, *, at: int | None = None) -> dict[str, Any]:
        """Why the run went where it went, step by step; what would move it now."""
        from interlock.client import debugging

        return await debugging.explain(self._ops, await self.records(run_id), at)

    async def replay(
        self, run_id: str, against: int | str | Path | tuple[str, str]
    ) -> dict[str, Any]:
        """What another definition would have done with the run's recorded inputs:
        ``against`` is a version (``3``, ``"code-review@3"``), a manifest file or a
        ``(name, text)`` pair. ``report["agree"]`` is true when the logs agree."""
        from interlock.client import debugging

        return await debugging.replay(self._ops, await self.records(run_id), against)

    async def shadow(
        self,
        workflow: str,
        candidate: str | Path | tuple[str, str],
        *,
        runs: int | None = None,
        since: str | None = None,
    ) -> dict[str, Any]:
        """Recorded runs of ``workflow`` replayed against a candidate, grouped by divergence.
        ``since``: runs started at or after an RFC 3339 time or an age (``2h``); anything
        else raises ValueError before anything is read."""
        from interlock.client import debugging

        return await debugging.shadow(self._ops, workflow, candidate, runs, since)

    async def fork(
        self,
        run_id: str,
        at: int,
        *,
        version: int | None = None,
        fork_id: str | None = None,
    ) -> str:
        """A new run from the first ``at`` records of ``run_id``, going on live (on
        ``version`` when given); returns its id. The original is not touched.

        Raises:
            analysis.NotPossible: ``at`` ends no decision of a running run, or the state
                the run was in is not in that version.
            RunExists: ``fork_id`` names a run that exists.
        """
        from interlock.client import debugging

        records = await self.records(run_id)
        new = fork_id or new_run_id()
        return str((await debugging.fork(self._ops, records, at, version, new))["run_id"])

    async def migrate(self, workflow: str, to: int, *, dry_run: bool = False) -> dict[str, Any]:
        """Move the running runs of ``workflow`` onto version ``to`` where their logs agree
        with it so far (each with a ``run.migrated`` record); the others are listed."""
        from interlock.client import debugging

        return await debugging.migrate(self._ops, workflow, to, dry_run=dry_run)


def _auth_in_environment() -> bool:
    import os

    names = ("INTERLOCK_CREDS", "INTERLOCK_NKEY", "INTERLOCK_USER", "INTERLOCK_TOKEN")
    return any(os.environ.get(name) for name in names)


def _path(value: str | Path | None) -> str | None:
    return None if value is None else str(value)
