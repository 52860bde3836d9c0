"""What the CLI (and any program) does against a running installation.

None of it goes through the orchestrator process: definitions live in KV, runs are logs,
and appends are optimistic, so ``start`` and ``cancel`` append to a run's log directly and
the orchestrator's relay acts on what they appended.
"""

from __future__ import annotations

import asyncio
import base64
import math
import secrets
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.client import Client as NatsClient
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from interlock.core import events as ev
from interlock.core.ids import check_event_type, check_run_id
from interlock.core.rfc3339 import format_time
from interlock.core.state import RunState
from interlock.runtime.applied import AppliedWorkflows
from interlock.runtime.buckets import live_workers
from interlock.runtime.clientjoin import LineJoiner
from interlock.runtime.errors import (
    NotRedrivable,
    RunExists,
    UnknownDeadLetter,
    UnknownRun,
    UnknownWorkflow,
)
from interlock.runtime.foreign import REASON as FOREIGN_RECORD
from interlock.runtime.foreign import index_entry
from interlock.runtime.logstore import RunLog
from interlock.runtime.pausing import Pauses
from interlock.runtime.payloads import payloads_for
from interlock.runtime.registry import Registry
from interlock.runtime.runs import Runs
from interlock.runtime.snapshots import Read, Snapshots, read_state
from interlock.runtime.versions import Applied
from interlock.runtime.waiting import RunWatcher
from interlock.transport.cloudevents import CloudEvent, encode_binary, too_deep
from interlock.transport.cloudevents_model import check_event_id
from interlock.transport.jetstream import jetstream
from interlock.transport.kvread import bucket_values
from interlock.transport.objects import ObjectLimits
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.core.compiler import Compiled
    from interlock.core.definition import ArchiveDef
    from interlock.core.diagnostics import Diagnostic
    from interlock.core.source import Document
    from interlock.dialects.base import Lowered
    from interlock.runtime.retention import Deleted

# The compiler, the dialects and the engine are imported by the operations that need them
# (apply, cancel), so that reading runs and workflows does not load them.


def new_run_id() -> str:
    """A fresh id for a run started by hand (triggered runs derive theirs from the event)."""
    return "r" + secrets.token_hex(12)


@dataclass(slots=True)
class ApplyResult:
    compiled: Compiled
    applied: list[Applied]


class InterlockClient:
    """Operations on workflows, runs and events of one installation."""

    def __init__(
        self, nc: NatsClient, subjects: Subjects, *, objects: ObjectLimits | None = None
    ) -> None:
        self.nc = nc
        self.js = jetstream(nc)
        self.subjects = subjects
        self.registry = Registry(self.js, subjects)
        self.applied = AppliedWorkflows(self.registry, subjects.workflows_bucket)
        """The workflows applied, kept current for what ``emit`` works out."""
        self.log = RunLog(nc, subjects)
        self.snapshots = Snapshots(nc, subjects, key=self.log.key, where=self.log.where)
        self.payloads = payloads_for(nc, subjects, objects or ObjectLimits.from_env())
        """Payloads by reference: loaded for readers, stored when too large to log."""
        self.runs = Runs(
            self.log,
            self.registry,
            cache_size=0,
            snapshots=self.snapshots,
            payloads=self.payloads,
        )
        self.watcher = RunWatcher(nc, subjects, self.log)
        """The one subscription every wait and follow of this client shares."""
        self.lines = LineJoiner(nc, subjects)
        """Puts a run it starts over a full limit in line at once (see its module)."""

    def use_objects(self, limits: ObjectLimits) -> None:
        """Store and load payloads by reference under ``limits`` (the threshold and the
        bound; by default INTERLOCK_OBJECT_*)."""
        self.payloads = self.runs.payloads = payloads_for(self.nc, self.subjects, limits)

    async def ensure_provisioned(self) -> None:
        from interlock.transport.provision import provision

        await provision(self.js, self.subjects)

    # -- definitions ----------------------------------------------------------------------

    async def apply(
        self,
        sources: Iterable[tuple[str, str]],
        *,
        documents: Iterable[Document] = (),
        implied_agents: Iterable[Document] = (),
        diagnostics: Iterable[Diagnostic] = (),
        lowered: Iterable[Lowered] = (),
    ) -> ApplyResult:
        """Validate every manifest (against the registry's capabilities too), then store.

        ``documents`` are native documents lowered from another format, ``implied_agents``
        the AgentDefs those imply: each is applied only when the registry knows none of its
        capabilities yet (a real AgentDef already applied is never replaced by one
        implied). ``diagnostics`` found before (by a dialect) refuse the whole apply.
        ``lowered`` are the dialect documents they came from: a Workfile's paths into the
        result of a Workfile it calls that is already stored are checked against it."""
        from interlock.core.compiler import compile_sources
        from interlock.dialects import declares_any, workfile

        found = list(diagnostics)
        files = list(lowered)
        stored: dict[str, frozenset[str]] = {}
        for name in sorted(workfile.called_elsewhere(files)):
            try:
                manifest = (await self.registry.stored_latest(name)).manifest
            except UnknownWorkflow:
                continue  # not applied yet: nothing to check against
            outputs = workfile.declared_outputs(manifest)
            if outputs is not None:
                stored[name] = outputs
        if stored:
            workfile.check_calls(files, found, stored)
        await self.registry.load()
        known = self.registry.known_capabilities()
        implied = [d for d in implied_agents if not declares_any(d, known)]
        compiled = compile_sources(
            list(sources), known_capabilities=known, documents=[*documents, *implied]
        )
        if found:
            compiled.diagnostics = sorted([*found, *compiled.diagnostics])
            compiled.workflows.clear()
        if not compiled.ok:
            return ApplyResult(compiled, [])
        applied = [await self.registry.apply_agent(a) for a in compiled.agents]
        applied += [await self.registry.apply_workflow(w) for w in compiled.workflows]
        applied += [await self.registry.apply_webhook(w) for w in compiled.webhooks]
        return ApplyResult(compiled, applied)

    # -- runs -----------------------------------------------------------------------------

    async def start(
        self,
        workflow: str,
        inputs: dict[str, Any],
        run_id: str | None = None,
        deadline_s: float | None = None,
    ) -> str:
        definition, version = await self.registry.latest(workflow)
        run_id = run_id or new_run_id()
        # One read: a paused workflow's run waits for its resumption (runtime.pausing).
        paused = await Pauses(self.nc, self.subjects).paused(definition.namespace, definition.name)
        created, records = await self.runs.start(
            definition, version, run_id, inputs, deadline_s=deadline_s, paused=paused is not None
        )
        if not created:
            raise RunExists(run_id)
        await self.lines.join(run_id, records)
        return run_id

    async def read(self, run_id: str) -> list[ev.AnyRecord]:
        records, _ = await self.log.read(run_id)
        if not records:
            raise UnknownRun(run_id)
        return records

    async def delete(
        self, run_id: str, records: list[ev.AnyRecord], archive: ArchiveDef | None
    ) -> Deleted:
        """Delete the ended run whose log is ``records`` (see :func:`retention.delete_run`)."""
        from interlock.runtime import retention

        links = await retention.chain_of(self.log, run_id)
        return await retention.delete_chain(
            self.nc,
            self.subjects,
            self.log,
            run_id,
            by="operator",
            reason="interlock runs delete",
            archive=archive,
            links=links if len(links) > 1 else [(run_id, records)],
        )

    async def read_state(self, run_id: str) -> Read:
        """The run's state, from its snapshot and the records after it where the snapshot
        matches the log (else from the whole log), with the records read."""
        read = await read_state(self.log, self.snapshots, run_id)
        if read is None:
            raise UnknownRun(run_id)
        return read

    async def state(self, run_id: str) -> RunState:
        return (await self.read_state(run_id)).state

    async def follow(
        self, run_id: str, *, idle_timeout: float | None = None
    ) -> AsyncIterator[ev.AnyRecord]:
        """Every record of the run in order, then each new one as it is appended, until the
        one that ends the run, or until nothing new came for ``idle_timeout`` seconds (a
        run not started yet is waited for). Shares the client's one subscription on the
        run logs (:class:`RunWatcher`): no JetStream consumer."""
        appended = aiter(self.watcher.follow(run_id))
        try:
            while True:
                try:
                    _, payload = await asyncio.wait_for(anext(appended), idle_timeout)
                except (StopAsyncIteration, TimeoutError):
                    return
                for record in ev.decode_batch(payload):
                    yield record
        finally:
            await appended.aclose()  # type: ignore[attr-defined]

    async def wait(self, run_id: str, timeout: float | None = None) -> RunState:  # noqa: ASYNC109
        """The run's state once it has finished (a run not started yet is waited for).

        Raises:
            TimeoutError: it has not started and finished within ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = math.inf if timeout is None else loop.time() + timeout
        if not await self.watcher.exists(run_id, deadline - loop.time()):
            raise TimeoutError(f"run {run_id} has not started after {timeout}s")
        left = None if timeout is None else max(deadline - loop.time(), 0.0)
        return (await self.watcher.finished_read(run_id, left, self.read_state)).state

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> bool:
        """Cancel the run, or, when it continued as new, the newest run of its chain."""
        from interlock.core.engine import cancel
        from interlock.runtime import chains

        run_id = await chains.newest(self.runs, run_id)
        records = await self.runs.apply(
            run_id, lambda d, s: cancel(d, s, reason=reason, now=self.runs.clock()), loads=False
        )
        return bool(records)

    async def pause_run(self, run_id: str, reason: str, *, workflow: bool = False) -> bool:
        """Pause a running run (``run.paused``); False when it had ended or was paused."""
        from interlock.core.runpause import pause

        now = self.runs.clock()
        records = await self.runs.apply(
            run_id, lambda d, s: pause(s, reason=reason, now=now, workflow=workflow)
        )
        return bool(records)

    async def resume_run(self, run_id: str) -> bool:
        """Resume a paused run: ``run.resumed``, then what it held decided on; False when
        it was not paused (or had ended)."""
        from interlock.core.engine import resume

        now = self.runs.clock()
        records = await self.runs.apply(run_id, lambda d, s: resume(d, s, now))
        return bool(records)

    async def list_runs(
        self, workflow: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        kv = await self.js.key_value(self.subjects.runs_bucket)
        out = []
        # The entries only (one token: a run id), not the listing keys beside them.
        for key, value in (await bucket_values(kv, "*")).items():
            item = index_entry(self.subjects.runs_bucket, key, value)
            if item is None:
                continue  # not an entry the orchestrator wrote (reported)
            if workflow and workflow not in (
                item.get("workflow"),
                f"{item.get('namespace')}/{item.get('workflow')}",
            ):
                continue
            if status and item.get("status") != status:
                continue
            out.append(item)
        out.sort(key=lambda i: str(i.get("started_at", "")))
        return out

    # -- events and agents ----------------------------------------------------------------

    async def emit(self, event: CloudEvent) -> int:
        """Publish a CloudEvent as an external system would; returns its stream sequence.

        Raises ValueError (nothing is published) for a type that cannot be a subject or a
        ``runid`` extension that is no run id."""
        check_event_type(event.type)
        check_event_id(event.id)
        if "runid" in event.extensions:
            check_run_id(event.extensions["runid"])
        headers, payload = encode_binary(event)
        headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
        subject = self.subjects.inbound(event.type, event.extensions.get("runid"))
        ack = await self.js.publish(subject, payload, headers=headers)
        return int(ack.seq)

    async def agents(self) -> dict[str, Any]:
        """Registered AgentDefs and the live workers heartbeating for them."""
        specs = await self.registry.agent_specs()
        kv = await self.js.key_value(self.subjects.workers_bucket)
        workers = live_workers(await bucket_values(kv))
        return {"agentdefs": specs, "workers": workers}

    # -- dead letters ---------------------------------------------------------------------

    async def dead_letters(self, reason: str | None = None) -> list[DeadLetter]:
        """The dead letters kept (oldest first), all or those of one ``reason`` (the
        orchestrator's and the agents' own, ``<prefix>.dlq.agent.<capability>.<reason>``)."""
        stream = self.subjects.dead_letter_stream
        found: list[DeadLetter] = []
        seq = 1
        while True:
            try:
                raw = await self.js.get_msg(
                    stream, seq, subject=self.subjects.dead_letters_all, next=True
                )
            except NotFoundError:
                return found
            letter = DeadLetter.of(raw)
            if reason is None or letter.reason == reason:
                found.append(letter)
            seq = int(raw.seq or seq) + 1

    async def dead_letter(self, seq: int) -> DeadLetter:
        """The dead letter at ``seq`` of the dead-letter stream.

        Raises:
            UnknownDeadLetter: there is none (never was, redriven, or expired).
        """
        try:
            raw = await self.js.get_msg(self.subjects.dead_letter_stream, seq)
        except NotFoundError as exc:
            raise UnknownDeadLetter(seq) from exc
        return DeadLetter.of(raw)

    async def redrive(self, seq: int) -> tuple[DeadLetter, int]:
        """Publish a dead letter's message again, as it first came, to its own subject, then
        drop the letter. Returns the letter and the new message's stream sequence.

        The letter is dropped only once the message is stored again: a failure leaves it.

        Raises:
            UnknownDeadLetter: there is none.
            NotRedrivable: :meth:`DeadLetter.redrive_refusal` says why (nothing is
                published, the letter stays).
        """
        letter = await self.dead_letter(seq)
        refusal = letter.redrive_refusal(self.subjects)
        if refusal is not None:
            raise NotRedrivable(seq, refusal)
        ack = await self.js.publish(letter.subject, letter.data, headers=letter.original_headers)
        await self.js.delete_msg(self.subjects.dead_letter_stream, seq)
        return letter, int(ack.seq)

    async def discard(self, seq: int) -> DeadLetter:
        """Drop a dead letter, publishing nothing; returns it.

        Raises:
            UnknownDeadLetter: there is none (never was, redriven, discarded or expired).
        """
        letter = await self.dead_letter(seq)
        try:
            await self.js.delete_msg(self.subjects.dead_letter_stream, seq)
        except NotFoundError as exc:
            raise UnknownDeadLetter(seq) from exc
        return letter


_DEAD_LETTER = "Interlock-Dead-Letter-"


@dataclass(slots=True)
class DeadLetter:
    """A message that could not be handled, kept in the dead-letter stream with why."""

    seq: int
    time: str
    reason: str
    detail: str
    subject: str
    """Where the message was first published (``redrive`` publishes it there again)."""
    headers: dict[str, str]
    data: bytes
    stored_on: str = ""
    """The letter's own subject in the dead-letter stream (an agent's: ``dlq.agent.>``)."""

    def redrive_refusal(self, subjects: Subjects) -> str | None:
        """Why :meth:`InterlockClient.redrive` refuses this letter (None: it does not).

        Only an event is published again: an agent's own letter names whatever subject
        the agent wrote; answers come from agents and fired timers from the orchestrator
        (the operator may publish neither, and one refused once is refused again); a
        letter that kept only the start of its message would publish that start as the
        whole.
        """
        if subjects.written_by_an_agent(self.stored_on):
            return (
                "an agent wrote it (the subject it names is the agent's word); the "
                "orchestrator sends a task again when its attempt times out or is retried"
            )
        if not self.subject:
            return "it does not name the subject its message came from"
        if self.reason == FOREIGN_RECORD:
            return (
                f"it is a foreign message found in the run log {self.subject} (kept here to "
                "look at): a run log takes only records Interlock writes"
            )
        if subjects.is_answer_or_timer(self.subject):
            return (
                f"it came on {self.subject}: answers come from agents and fired timers from "
                "the orchestrator, and one refused once is refused again (the orchestrator "
                "asks again when an attempt times out or is retried)"
            )
        if not subjects.dead_lettered_from(self.subject):
            return f"it names {self.subject}, where no message the orchestrator reads comes"
        truncated = self.headers.get(_DEAD_LETTER + "Truncated")
        if truncated is not None:
            size = f"{int(truncated):,}" if truncated.isdigit() else truncated
            return (
                f"it keeps only the first {len(self.data):,} bytes of a {size}-byte "
                "message (too large for a letter); `dead-letters show` has what is kept"
            )
        return None

    @classmethod
    def of(cls, raw: RawStreamMsg) -> DeadLetter:
        headers = {str(k): str(v) for k, v in (raw.headers or {}).items()}
        return cls(
            seq=int(raw.seq or 0),
            time=format_time(raw.time, "auto") if raw.time else "",
            reason=headers.get(_DEAD_LETTER + "Reason", ""),
            detail=headers.get(_DEAD_LETTER + "Detail", ""),
            subject=headers.get(_DEAD_LETTER + "Subject", ""),
            headers=headers,
            data=raw.data or b"",
            stored_on=raw.subject or "",
        )

    @property
    def original_headers(self) -> dict[str, str]:
        """The message's own headers, without what dead-lettering added."""
        return {k: v for k, v in self.headers.items() if not k.startswith(_DEAD_LETTER)}

    def to_json(self) -> dict[str, Any]:
        """The letter as one JSON object. Its payload is ``data`` when it is JSON that
        nests no deeper than events may (what a hostile sender sent must not stop the
        listing), else ``data`` as text when it is UTF-8, else ``data_base64``."""
        body: dict[str, Any] = {
            "seq": self.seq,
            "time": self.time,
            "reason": self.reason,
            "detail": self.detail,
            "subject": self.subject,
            "headers": self.original_headers,
        }
        try:
            data: Any = msgspec.json.decode(self.data)
            if too_deep(data):
                # Shown as text, like undecodable data, just below.
                raise ValueError("too deep")  # noqa: TRY301
        except (ValueError, RecursionError):
            try:
                data = self.data.decode("utf-8")
            except UnicodeDecodeError:
                body["data_base64"] = base64.b64encode(self.data).decode("ascii")
                return body
        body["data"] = data
        return body
