"""The Interlock client: drive workflows and runs from a program.

    from interlock import Client

    async with await Client.connect("nats://127.0.0.1:4222") as client:
        run_id = await client.start("hello", {"message": "hi"})
        result = await client.result(run_id, wait=True, timeout=30)
        print(result.status, result.outputs)

The client talks to NATS like the CLI does, with the same connection options (and the same
``INTERLOCK_*`` environment variables); it never goes through the orchestrator process.
Everything it returns is a view of :mod:`interlock.views`, the shapes the CLI prints and
the HTTP API answers with. :class:`SyncClient` offers the same calls without ``await``.

Waiting scales: every wait of one client shares one subscription on the run logs (see
:mod:`interlock.runtime.waiting`), so 5,000 concurrent ``result(..., wait=True)`` calls
cost the server one subscription, not 5,000 consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NatsClient
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DeliverPolicy
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import Compiled
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import derive_run_id, matching_trigger, trigger_inputs
from interlock.core.expr import ExpressionError
from interlock.core.ids import InvalidRunId, check_event_type, check_run_id
from interlock.core.state import RunState, fold
from interlock.runtime.client import (
    InterlockClient,
    RunExists,
    UnknownDeadLetter,
    new_run_id,
)
from interlock.runtime.flow import to_incoming
from interlock.runtime.logstore import LogReadError
from interlock.runtime.registry import Applied, UnknownWorkflow, bucket_values
from interlock.runtime.replaying import (
    Replaying,
    RunExistsAlready,
    compile_manifest,
    in_flight,
    select_runs,
)
from interlock.runtime.runs import InvalidInputs, UnknownRun, utc_now
from interlock.runtime.waiting import RunWatcher, UnknownRunError
from interlock.transport.cloudevents import CloudEvent, from_dict
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.errors import ConnectionFailed
from interlock.transport.provision import provision
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects
from interlock.views import (
    AgentView,
    DeadLetterView,
    EmitResult,
    RunDescription,
    RunResult,
    RunSummary,
    SignalResult,
    StartedRun,
    WorkflowDetail,
    WorkflowSummary,
    agent_view,
    dead_letter_view,
    describe_run,
    run_result,
    summary_from_index,
    summary_of,
    workflow_detail,
    workflow_summary_of,
)

__all__ = [
    "Client",
    "ConnectionFailed",
    "InvalidInputs",
    "InvalidManifest",
    "InvalidRunId",
    "RunExists",
    "SyncClient",
    "UnknownAgent",
    "UnknownDeadLetter",
    "UnknownRun",
    "UnknownWorkflow",
]

EMIT_WAIT_S = 5.0
"""How long ``emit`` waits for the runs it starts to be in the log, by default."""
SIGNAL_WAIT_S = 5.0
"""How long ``signal`` waits to see what the run did with the event, by default."""


class InvalidManifest(ValueError):
    """A manifest did not validate; nothing was applied. ``diagnostics`` says where and why."""

    def __init__(self, compiled: Compiled) -> None:
        self.diagnostics = list(compiled.diagnostics)
        n = len(self.diagnostics)
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{n} error{'s' if n != 1 else ''}; nothing was applied\n{lines}")


class UnknownAgent(LookupError):
    """No AgentDef by that name."""


class Client:
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
        self._watcher = RunWatcher(nc, self.subjects, self._ops.log)
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
        ``interlock dev`` wrote under ``.interlock/creds/`` in the current folder).

        Raises:
            ConnectionFailed: no server answered in time, or it refused the credentials.
        """
        if options is None:
            if not (creds or nkey or user or token or _auth_in_environment()):
                # As the CLI: run where `interlock dev` runs, use the operator's creds it wrote.
                from interlock.auth.dev import default_operator_creds

                creds = default_operator_creds()
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
        from interlock.dialects import prepare

        pairs = [
            s if isinstance(s, tuple) else (str(s), await asyncio.to_thread(_read_text, s))
            for s in sources
        ]
        prepared = prepare(pairs, dialect)
        await self.provision(replicas)
        result = await self._ops.apply(
            prepared.sources,
            documents=prepared.documents,
            implied_agents=prepared.agents,
            diagnostics=prepared.diagnostics,
        )
        if not result.compiled.ok:
            raise InvalidManifest(result.compiled)
        return result.applied

    async def workflows(self) -> list[WorkflowSummary]:
        """The newest version of every workflow applied, by namespace and name."""
        out = [
            workflow_summary_of(ns, name, version, spec_hash, manifest)
            for (ns, name), (version, spec_hash, manifest) in (await self._catalog()).items()
        ]
        return sorted(out, key=lambda w: (w.namespace, w.name))

    async def workflow(self, name: str) -> WorkflowDetail:
        """One workflow (``name`` or ``namespace/name``): its versions and newest manifest.

        Raises:
            UnknownWorkflow: not applied (or deleted).
        """
        definition, version = await self._latest(name)
        versions = await self._versions(definition.namespace, definition.name)
        return workflow_detail(definition, version, versions or [version])

    async def delete_workflow(self, name: str) -> int:
        """Stop ``name`` from starting new runs; returns the version that was newest.

        Its versions stay stored: runs in flight keep running the version they started
        with, and their logs keep folding. Applying it again makes it startable again.

        Raises:
            UnknownWorkflow: not applied (or already deleted).
        """
        definition, version = await self._latest(name)
        kv = await self._ops.js.key_value(self.subjects.workflows_bucket)
        await kv.delete(f"latest.{definition.namespace}.{definition.name}")
        return version

    async def agents(self) -> list[AgentView]:
        """Every AgentDef with the live workers of its capabilities."""
        specs, workers = await self._agent_data()
        return [agent_view(name, spec, workers) for name, spec in sorted(specs.items())]

    async def agent(self, name: str) -> AgentView:
        """One AgentDef. Raises :class:`UnknownAgent` when none has that name."""
        specs, workers = await self._agent_data()
        if name not in specs:
            raise UnknownAgent(f"no AgentDef named {name!r} (interlock apply FILE)")
        return agent_view(name, specs[name], workers)

    # -- runs -----------------------------------------------------------------------------

    async def start(
        self, workflow: str, inputs: Mapping[str, Any] | None = None, *, run_id: str | None = None
    ) -> str:
        """Start a run of the newest version of ``workflow``; returns its run id.

        Raises:
            UnknownWorkflow: not applied. InvalidInputs: the inputs break its declared
            inputs. RunExists: ``run_id`` names a run already. InvalidRunId.
        """
        if run_id is not None:
            check_run_id(run_id)
        return await self._ops.start(workflow, dict(inputs or {}), run_id)

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
        ce = self._event(event, type, source, data, id, subject, extensions)
        check_event_type(ce.type)  # before anything is published or looked up
        run_id = ce.extensions.get("runid")
        started: list[StartedRun] = []
        if run_id:
            check_run_id(run_id)
        else:
            started = await self._would_start(ce)
        ack_seq, duplicate = await self._publish(ce)
        if wait > 0 and started:
            found = await asyncio.gather(
                *(self._watcher.exists(s.run_id, wait) for s in started if not s.existed)
            )
            fresh = iter(found)
            started = [
                s if s.existed or next(fresh) else msgspec.structs.replace(s, pending=True)
                for s in started
            ]
        return EmitResult(
            id=ce.id,
            type=ce.type,
            source=ce.source,
            seq=ack_seq,
            duplicate=duplicate,
            started=started,
            run_id=run_id,
        )

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
        check_run_id(run_id)
        async with _no_stream_is_no_run(run_id):
            raw = await self._ops.log.read_raw(run_id)
        if not raw:
            raise UnknownRun(run_id)
        records = [r for _, payload in raw for r in ev.decode_batch(payload)]
        state = fold(records)
        event_id = id or secrets.token_hex(8)
        base = _SignalBase(
            run_id=run_id, type=name, id=event_id, state=state.state, status=state.status
        )
        if state.finished:
            return base.result("finished")
        definition = await self._definition_of(state)
        takes = definition.states[state.state].transitions_for(name) if definition else ()
        if definition is not None and not takes:
            waits = sorted({t.event for t in definition.states[state.state].transitions})
            return base.result("not-waiting", waiting_for=waits)
        ce = CloudEvent(
            id=event_id,
            source=source,
            type=name,
            time=utc_now(),
            datacontenttype="application/json" if data is not None else None,
            data=data,
            extensions={"runid": run_id},
        )
        hint = asyncio.Event()
        marker = event_id.encode()

        def on_append(payload: bytes) -> None:
            if marker in payload:
                hint.set()

        await self._watcher.start()
        after = raw[-1][0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        with self._watcher.listening(run_id, on_append):
            await self._publish(ce)
            while True:
                found = await self._decision_on(run_id, after, event_id)
                if found is not None:
                    return _signal_outcome(found, base)
                left = deadline - loop.time()
                if left <= 0:
                    return base.result("unanswered")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hint.wait(), min(left, 1.0))
                hint.clear()

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> bool:
        """Cancel a running run; False when it had finished already.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        async with _no_stream_is_no_run(run_id):
            return await self._ops.cancel(run_id, reason)

    async def result(
        self,
        run_id: str,
        *,
        wait: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RunResult:
        """How the run ended: ``status``, ``outputs``, ``error`` (class, message), a cancelled
        run's ``reason``. Without ``wait`` a running run answers at once with status
        ``running``; with it, once the run has finished.

        Raises:
            UnknownRun: no such run. TimeoutError: still running after ``timeout`` seconds.
        """
        check_run_id(run_id)
        if not wait:
            return run_result(await self.records(run_id))
        try:
            records = await self._watcher.finished(run_id, timeout)
        except UnknownRunError:
            raise UnknownRun(run_id) from None
        return run_result(records)

    async def run(self, run_id: str) -> RunSummary:
        """One run's summary, folded from its log. Raises :class:`UnknownRun`."""
        check_run_id(run_id)
        return summary_of(fold(await self.records(run_id)))

    async def describe(self, run_id: str) -> RunDescription:
        """Everything about one run now: state, pending actions with attempts and deadlines,
        what it waits for (events and guards), timers, outputs, error.

        Raises:
            UnknownRun: no such run.
        """
        check_run_id(run_id)
        records = await self.records(run_id)
        state = fold(records)
        return describe_run(records, await self._definition_of(state))

    async def runs(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[RunSummary]:
        """Runs from the run index, newest first: all, or of one ``workflow`` (``name`` or
        ``namespace/name``) and/or ``status``; at most ``limit``."""
        try:
            items = await self._ops.list_runs(workflow, status)
        except (BucketNotFoundError, NotFoundError):
            return []
        items.reverse()
        if limit is not None:
            items = items[: max(limit, 0)]
        return [summary_from_index(i) for i in items]

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        """The run's log: every record, in order. Raises :class:`UnknownRun`."""
        check_run_id(run_id)
        async with _no_stream_is_no_run(run_id):
            return await self._ops.read(run_id)

    async def state(self, run_id: str) -> RunState:
        """The run's state folded from its log (the engine's own view)."""
        return fold(await self.records(run_id))

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
        records = await self.records(run_id)
        shown = [r for r in records if since is None or r.time >= since]
        if tail is not None:
            shown = shown[-tail:] if tail > 0 else []
        for record in shown:
            yield record
        if not follow or fold(records).finished:
            return
        async for record in self._follow(run_id, len(records)):
            yield record

    async def _follow(self, run_id: str, skip: int) -> AsyncIterator[ev.AnyRecord]:
        """Records after the first ``skip``, as they are appended, until the run ends."""
        sub = await self._ops.js.subscribe(
            self.subjects.run(run_id),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            stream=self.subjects.runs_stream,
        )
        seen = 0
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=3600.0)
                except NatsTimeoutError:
                    continue
                for record in ev.decode_batch(msg.data):
                    seen += 1
                    if seen <= skip:
                        continue
                    yield record
                    if ev.record_type(record) in ev.TERMINAL_TYPES:
                        return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def orchestrator_seen(self) -> bool | None:
        """Whether an orchestrator reads the run logs: True (it is waiting for work or took
        some in the last 10 s), False (none ever ran here, or none takes the records
        waiting for it), None (cannot tell: not allowed to look)."""
        try:
            info = await self._ops.js.consumer_info(self.subjects.runs_stream, "relay")
        except NotFoundError:
            return False
        # A probe: any failure means 'unknown'.
        except Exception:  # noqa: BLE001
            return None
        if info.num_waiting:
            return True
        last = info.delivered.last_active if info.delivered is not None else None
        if last is not None and (datetime.now(UTC) - last).total_seconds() < 10:
            return True
        return not (info.num_pending or info.num_ack_pending)

    # -- debugging by replay (docs/debugging.md; each returns the report documented there) --

    def _replaying(self) -> Replaying:
        return Replaying(self._ops.log, self._ops.registry, self._ops.runs.clock)

    async def _candidate(self, manifest: str | Path | tuple[str, str]) -> Definition:
        name, text = (
            manifest
            if isinstance(manifest, tuple)
            else (str(manifest), await asyncio.to_thread(_read_text, manifest))
        )
        return compile_manifest(name, text)

    async def explain(self, run_id: str, *, at: int | None = None) -> dict[str, Any]:
        """Why the run went where it went, step by step; what would move it now."""
        return await self._replaying().explain(await self.records(run_id), at=at)

    async def replay(
        self, run_id: str, against: int | str | Path | tuple[str, str]
    ) -> dict[str, Any]:
        """What another definition would have done with the run's recorded inputs:
        ``against`` is a version (``3``, ``"code-review@3"``), a manifest file or a
        ``(name, text)`` pair. ``report["agree"]`` is true when the logs agree."""
        records = await self.records(run_id)
        replaying = self._replaying()
        if isinstance(against, int) or (isinstance(against, str) and "@" in against):
            definition, version, label = await replaying.named(records, against)
        else:
            await replaying.load_capabilities()
            definition = self._ops.registry.link(await self._candidate(against))
            version, label = 0, against[0] if isinstance(against, tuple) else str(against)
        return analysis.replay(records, definition, version=version, label=label)

    async def shadow(
        self,
        workflow: str,
        candidate: str | Path | tuple[str, str],
        *,
        runs: int | None = None,
        since: str | None = None,
    ) -> dict[str, Any]:
        """Recorded runs of ``workflow`` replayed against a candidate manifest, grouped by
        where and why they would diverge."""
        definition = await self._candidate(candidate)
        chosen = select_runs(await self._ops.list_runs(workflow), runs, since)
        label = candidate[0] if isinstance(candidate, tuple) else str(candidate)
        return await self._replaying().shadow(chosen, definition, label=label)

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
        records = await self.records(run_id)
        replaying = self._replaying()
        definition = None
        if version is not None:
            state = fold(records)
            definition = await replaying.definition(state.namespace, state.workflow, version)
        new = fork_id or new_run_id()
        check_run_id(new)
        try:
            forked = await replaying.fork(
                records, at, run_id=new, definition=definition, version=version
            )
        except RunExistsAlready:
            raise RunExists(new) from None
        return forked.run_id

    async def migrate(self, workflow: str, to: int, *, dry_run: bool = False) -> dict[str, Any]:
        """Move the running runs of ``workflow`` onto version ``to`` where their logs agree
        with it so far (each with a ``run.migrated`` record); the others are listed."""
        namespace, _, name = workflow.rpartition("/")
        replaying = self._replaying()
        definition = await replaying.definition(namespace or "default", name, to)
        running = in_flight(await self._ops.list_runs(workflow, "running"), to)
        return await replaying.migrate(running, definition, to, dry_run=dry_run)

    # -- dead letters ---------------------------------------------------------------------

    async def dead_letters(self, reason: str | None = None) -> list[DeadLetterView]:
        """The dead letters kept, oldest first (all, or of one ``reason``)."""
        try:
            letters = await self._ops.dead_letters(reason)
        except NotFoundError:
            return []
        return [_letter(d) for d in letters]

    async def dead_letter(self, seq: int) -> DeadLetterView:
        """One dead letter. Raises :class:`UnknownDeadLetter`."""
        return _letter(await self._ops.dead_letter(seq))

    async def redrive(self, seq: int) -> int:
        """Publish a dead letter again where it came from, then drop it; returns the new
        message's stream sequence. Raises :class:`UnknownDeadLetter`."""
        _, stored = await self._ops.redrive(seq)
        return stored

    # -- inside ---------------------------------------------------------------------------

    async def _registry_items(self) -> list[dict[str, Any]]:
        try:
            return await self._ops.registry.workflows()
        except (BucketNotFoundError, NotFoundError):
            return []

    async def _latest(self, name: str) -> tuple[Definition, int]:
        try:
            return await self._ops.registry.latest(name)
        except (BucketNotFoundError, NotFoundError):
            raise UnknownWorkflow(
                f"workflow {name} is not applied (interlock apply FILE)"
            ) from None

    async def _versions(self, namespace: str, name: str) -> list[int]:
        kv = await self._ops.js.key_value(self.subjects.workflows_bucket)
        prefix = f"wf.{namespace}.{name}."
        found: list[int] = []
        watcher = await kv.watch(f"{prefix}*", ignore_deletes=True, meta_only=True)
        try:
            async for entry in watcher:
                if entry is None:  # every stored version has been seen
                    break
                tail = entry.key[len(prefix) :]
                if tail.isdigit():
                    found.append(int(tail))
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]
        return sorted(found)

    async def _agent_data(self) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        try:
            specs = await self._ops.registry.agent_specs()
        except (BucketNotFoundError, NotFoundError):
            specs = {}
        try:
            kv = await self._ops.js.key_value(self.subjects.workers_bucket)
            values = list((await bucket_values(kv)).values())
        except (BucketNotFoundError, NotFoundError):
            values = []
        # A worker heartbeats under one key per capability: list each process once.
        workers: dict[tuple[Any, Any], dict[str, Any]] = {}
        for value in values:
            record = json.loads(value)
            workers.setdefault((record.get("name"), record.get("instance")), record)
        return specs, list(workers.values())

    async def _definition_of(self, state: RunState) -> Definition | None:
        try:
            return await self._ops.registry.definition(
                state.namespace, state.workflow, state.version
            )
        except (UnknownWorkflow, KeyNotFoundError, BucketNotFoundError, NotFoundError):
            return None

    @staticmethod
    def _event(
        event: CloudEvent | Mapping[str, Any] | None,
        type_: str | None,
        source: str | None,
        data: Any,
        id_: str | None,
        subject: str | None,
        extensions: Mapping[str, str] | None,
    ) -> CloudEvent:
        if isinstance(event, CloudEvent):
            return event
        if event is not None:
            return from_dict(dict(event))
        if type_ is None or not source:
            raise ValueError("emit needs an event, or type= and source=")
        return CloudEvent(
            id=id_ or secrets.token_hex(8),
            source=source,
            type=type_,
            subject=subject,
            time=utc_now(),
            datacontenttype="application/json" if data is not None else None,
            data=data,
            extensions=dict(extensions or {}),
        )

    async def _publish(self, event: CloudEvent) -> tuple[int, bool]:
        from interlock.transport.cloudevents import encode_binary

        headers, payload = encode_binary(event)
        headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
        ack = await self._ops.js.publish(self.subjects.event(event.type), payload, headers=headers)
        return int(ack.seq), bool(ack.duplicate)

    async def _catalog(self) -> dict[tuple[str, str], tuple[int, str, dict[str, Any]]]:
        """(namespace, name) -> (newest version, spec hash, manifest) of every workflow
        applied, from one pass over the workflows bucket (nothing is compiled)."""
        try:
            kv = await self._ops.js.key_value(self.subjects.workflows_bucket)
            values = await bucket_values(kv)
        except (BucketNotFoundError, NotFoundError):
            return {}
        out: dict[tuple[str, str], tuple[int, str, dict[str, Any]]] = {}
        for key, value in values.items():
            if not key.startswith("latest."):
                continue
            _, ns, name = key.split(".", 2)
            pointer = json.loads(value)
            version = int(pointer.get("version", 0))
            stored = values.get(f"wf.{ns}.{name}.{version}")
            manifest = json.loads(stored).get("manifest", {}) if stored else {}
            out[(ns, name)] = (version, str(pointer.get("spec_hash", "")), manifest)
        return out

    async def _would_start(self, event: CloudEvent) -> list[StartedRun]:
        """The runs the orchestrator's ingress starts for ``event`` (its own rules, over
        the workflows applied now; only those with a trigger on its type are compiled)."""
        registry = self._ops.registry
        with contextlib.suppress(BucketNotFoundError, NotFoundError):
            await self._ops.registry.load_agents()
        incoming = to_incoming(event)
        out = []
        for (ns, name), (version, _, manifest) in sorted((await self._catalog()).items()):
            if not _triggers_on(manifest, event.type):
                continue
            try:
                definition = await registry.definition(ns, name, version)
            except Exception:  # noqa: BLE001, S112 - the orchestrator cannot load it either
                continue
            trigger = matching_trigger(definition, incoming)
            if trigger is None:
                continue
            try:
                inputs = trigger_inputs(trigger, incoming)
            except ExpressionError:
                continue  # dead-lettered as bad-trigger-input: no run
            if resolve_inputs(registry.link(definition), inputs)[1]:
                continue  # dead-lettered as invalid-inputs: no run
            run_id = derive_run_id(definition, event.source, event.id)
            out.append(
                StartedRun(
                    run_id=run_id,
                    workflow=definition.name,
                    namespace=definition.namespace,
                    version=version,
                    existed=await self._ops.log.last_seq(run_id) > 0,
                )
            )
        return out

    async def _decision_on(
        self, run_id: str, after: int, event_id: str
    ) -> list[ev.AnyRecord] | None:
        """The decision (one log message) that took the event ``event_id``, if any yet."""
        for _, payload in await self._ops.log.read_raw(run_id, after):
            batch = ev.decode_batch(payload)
            for record in batch:
                if isinstance(record, ev.EventReceived) and record.data.event.get("id") == event_id:
                    return batch
        return None


@dataclass(frozen=True, slots=True)
class _SignalBase:
    run_id: str
    type: str
    id: str
    state: str
    status: str

    def result(
        self,
        outcome: str,
        *,
        state: str | None = None,
        to_state: str | None = None,
        guard_errors: list[str] | None = None,
        waiting_for: list[str] | None = None,
    ) -> SignalResult:
        return SignalResult(
            run_id=self.run_id,
            type=self.type,
            id=self.id,
            outcome=outcome,
            state=state if state is not None else self.state,
            status=self.status,
            to_state=to_state,
            guard_errors=guard_errors or [],
            waiting_for=waiting_for or [],
        )


def _signal_outcome(batch: list[ev.AnyRecord], base: _SignalBase) -> SignalResult:
    errors = [f"{r.data.guard}: {r.data.error}" for r in batch if isinstance(r, ev.GuardFailed)]
    for record in batch:
        if isinstance(record, ev.TransitionFired) and record.data.event_id == base.id:
            return base.result(
                "moved",
                state=record.data.from_state,
                to_state=record.data.to_state,
                guard_errors=errors,
            )
    return base.result("declined", guard_errors=errors)


@contextlib.asynccontextmanager
async def _no_stream_is_no_run(run_id: str) -> AsyncIterator[None]:
    """Where nothing was ever applied there is no runs stream (no JetStream responder
    answers a direct get on it): that run does not exist."""
    try:
        yield
    except LogReadError as exc:
        if "503" in str(exc) or "stream not found" in str(exc):
            raise UnknownRun(run_id) from None
        raise


def _triggers_on(manifest: Mapping[str, Any], event_type: str) -> bool:
    spec = manifest.get("spec")
    triggers = spec.get("triggers") if isinstance(spec, Mapping) else None
    if not isinstance(triggers, list):
        return False
    return any(isinstance(t, Mapping) and t.get("event") == event_type for t in triggers)


def _letter(d: Any) -> DeadLetterView:
    return dead_letter_view(
        d.seq, d.time, d.reason, d.detail, d.subject, d.original_headers, d.data
    )


def _auth_in_environment() -> bool:
    import os

    names = ("INTERLOCK_CREDS", "INTERLOCK_NKEY", "INTERLOCK_USER", "INTERLOCK_TOKEN")
    return any(os.environ.get(name) for name in names)


def _read_text(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")


def _path(value: str | Path | None) -> str | None:
    return None if value is None else str(value)


# --- without asyncio ------------------------------------------------------------------------

T = TypeVar("T")


class SyncClient:
    """:class:`Client`'s calls for programs without asyncio: each call blocks until done.

    It runs an event loop on a thread of its own::

        with SyncClient.connect() as client:
            run_id = client.start("hello", {"message": "hi"})
            print(client.result(run_id, wait=True, timeout=30).outputs)
    """

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self._client = client
        self._loop = loop
        self._thread = thread

    @classmethod
    def connect(cls, server: str | list[str] | None = None, **options: Any) -> SyncClient:
        """As :meth:`Client.connect`."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="interlock-client", daemon=True)
        thread.start()
        try:
            client = asyncio.run_coroutine_threadsafe(
                Client.connect(server, **options), loop
            ).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        return cls(client, loop, thread)

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name == "logs":

            def logs(*args: Any, **kwargs: Any) -> Iterator[ev.AnyRecord]:
                agen = method(*args, **kwargs)
                while True:
                    try:
                        yield self._call(agen.__anext__)
                    except StopAsyncIteration:
                        return

            return logs
        if not callable(method) or not asyncio.iscoroutinefunction(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(lambda: method(*args, **kwargs))

        return call
