"""Answers: what the orchestrator lets into a run's log, by request or from the results stream.

An answer is appended only when it speaks for an attempt the run is still waiting for,
from the capability that attempt was dispatched to. NATS permissions let an agent send
answers only on ``<prefix>.answer.<its capability>.*`` (a request the orchestrator
replies to once the answer is in the log) and ``<prefix>.results.<its capability>.*``
(the results stream, the way that needs no orchestrator up); what they cannot say (which run,
action and attempt) the orchestrator checks here, before anything is appended:

1. the subject names a capability and a run, and the answer's ``runid`` (if any) is that
   run;
2. it names its action (``actionid``) and attempt (``attempt``);
3. it echoes the ``Interlock-Token`` of the request it answers: an HMAC, under a key
   only the orchestrator holds, of the capability, run, action and attempt;
4. the run is waiting for that attempt of that action, and the action's capability is
   the one in the subject.

A refused answer is dead-lettered with its reason and never reaches the log, except a late
one: an answer to an attempt the run itself stopped waiting for (it cancelled the action,
say a sibling of a map that failed fast, the attempt timed out, or the run ended) is what
a correct worker sends when it finishes, or honours a cancel notice, after that. It is
dropped and counted (:func:`late_reason`), and dead letters stay for what needs a person.
The orchestrator's own answers (a request it refused to dispatch, a child run's end) take the
same path, with tokens it makes itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nats.js import JetStreamContext

from interlock.core import events as ev
from interlock.core.engine import TASK_FAILED, Incoming
from interlock.core.retryafter import retry_after_problem
from interlock.core.state import RunState
from interlock.core.vocabulary import ErrorClass, InterlockError
from interlock.runtime.schemas import SchemaMismatch
from interlock.transport import tasks
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.subjects import Subjects
from interlock.transport.tokens import TaskTokens, load_token_key

if TYPE_CHECKING:
    from interlock.runtime.registry import Registry


@dataclass(frozen=True, slots=True)
class AnswerKey:
    """The attempt an answer speaks for, as its subject and extensions say."""

    capability: str
    run_id: str
    action_id: str
    attempt: int


LATE_REFUSALS = frozenset({"answer-not-awaited", "answer-stale-attempt"})
"""Refusals that may be late answers (see :func:`late_reason`)."""


def late_reason(records: Sequence[ev.AnyRecord], key: AnswerKey) -> str | None:
    """Why the run stopped waiting for the attempt ``key`` names, when it did so itself:
    ``action-cancelled``, ``attempt-timed-out`` or ``run-ended``; None when the log shows
    no such thing (never requested, or answered already: a dead letter)."""
    requested = False
    reason: str | None = None
    for r in records:
        if isinstance(r, ev.ActionRequested):
            if r.data.action_id == key.action_id and r.data.attempt == key.attempt:
                requested = True
        elif isinstance(r, ev.ActionCompleted):
            if r.data.action_id == key.action_id and reason is None:
                return None  # answered already
        elif isinstance(r, ev.ActionFailed):
            if r.data.action_id == key.action_id and r.data.attempt == key.attempt:
                if r.data.error.error_class != ErrorClass.TIMEOUT:
                    return None  # answered already
                reason = reason or "attempt-timed-out"
        elif isinstance(r, ev.ActionCancelled):
            if r.data.action_id == key.action_id:
                reason = reason or "action-cancelled"
        elif isinstance(r, ev.RunCancelled):
            if key.action_id in r.data.cancelled_actions:
                reason = reason or "action-cancelled"
            reason = reason or "run-ended"
        elif isinstance(r, ev.RunCompleted | ev.RunFailed):
            reason = reason or "run-ended"
    return reason if requested else None


def recorded(records: Sequence[ev.AnyRecord], key: AnswerKey, event_id: str) -> bool:
    """Whether the answer ``event_id`` to the attempt ``key`` names is in the log already:
    the same answer decided twice (taken by two replicas, or sent again), not a dead
    letter."""
    return event_id in answers_taken(records, key)


def answers_taken(records: Sequence[ev.AnyRecord], key: AnswerKey) -> frozenset[str]:
    """The ids of the answers the log took for the attempt ``key`` names (its action's
    completion, or that attempt's failure)."""
    return frozenset(
        r.data.event_id
        for r in records
        if isinstance(r, ev.ActionCompleted | ev.ActionFailed)
        and r.data.event_id is not None
        and r.data.action_id == key.action_id
        and (isinstance(r, ev.ActionCompleted) or r.data.attempt == key.attempt)
    )


def _retry_after_problem(event_type: str, data: object) -> str | None:
    """What is wrong with a failure's ``error.retry_after``, if anything."""
    error = data.get("error") if isinstance(data, dict) else None
    if event_type != TASK_FAILED or not isinstance(error, dict):
        return None
    return retry_after_problem(error.get("retry_after"))


class AnswerRefused(InterlockError):
    """An answer the orchestrator does not append; dead-lettered with ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class Answers:
    """Checks answers against the task tokens, and sends the orchestrator's own."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._tokens: TaskTokens | None = None

    async def load(self) -> None:
        """Read (or create, the first time) the installation's task-token key."""
        self._tokens = TaskTokens(await load_token_key(self._js, self._subjects))

    @property
    def tokens(self) -> TaskTokens:
        if self._tokens is None:
            raise RuntimeError("Answers.load() first: the task-token key is not loaded")
        return self._tokens

    def key_of(self, subject: str, event: CloudEvent, headers: dict[str, str] | None) -> AnswerKey:
        """The attempt a received answer speaks for, once its envelope checks out.

        Raises:
            AnswerRefused: the subject, the extensions or the token do not check out.
        """
        where = self._subjects.answered(subject)
        if where is None:
            raise AnswerRefused(
                "answer-subject",
                f"{subject!r} is not <prefix>.results|answer.<capability>.<run id>",
            )
        capability, run_id = where
        ext = event.extensions
        claimed_run = ext.get(tasks.RUN_ID)
        if claimed_run is not None and claimed_run != run_id:
            raise AnswerRefused(
                "answer-mismatch", f"the answer names run {claimed_run!r}, its subject {run_id!r}"
            )
        action_id = ext.get(tasks.ACTION_ID)
        raw_attempt = ext.get(tasks.ATTEMPT)
        if not action_id or raw_attempt is None or not raw_attempt.isdigit():
            raise AnswerRefused(
                "answer-incomplete",
                "an answer needs the 'actionid' and 'attempt' extensions of its request",
            )
        key = AnswerKey(capability, run_id, action_id, int(raw_attempt))
        token = (headers or {}).get(tasks.TOKEN_HEADER)
        if not token:
            raise AnswerRefused(
                "answer-token", f"the answer to {action_id} attempt {key.attempt} has no token"
            )
        if not self.tokens.verify(token, capability, run_id, action_id, key.attempt):
            raise AnswerRefused(
                "answer-token",
                f"the token of the answer to {action_id} attempt {key.attempt} on {subject} "
                "does not verify",
            )
        problem = _retry_after_problem(event.type, event.data)
        if problem is not None:
            raise AnswerRefused(
                "answer-retry-after", f"the answer to {action_id} attempt {key.attempt}: {problem}"
            )
        return key

    @staticmethod
    def check_awaited(key: AnswerKey, state: RunState) -> None:
        """Raise :class:`AnswerRefused` unless ``state`` awaits the attempt ``key`` names."""
        pending = state.pending.get(key.action_id)
        if pending is None:
            raise AnswerRefused(
                "answer-not-awaited",
                f"run {key.run_id} is not waiting for action {key.action_id} "
                "(answered already, cancelled, or never requested)",
            )
        if tasks.answer_capability(pending.capability) != key.capability:
            raise AnswerRefused(
                "answer-wrong-capability",
                f"action {key.action_id} was requested of {pending.capability!r}, "
                f"the answer came from {key.capability!r}",
            )
        if pending.attempt != key.attempt:
            raise AnswerRefused(
                "answer-stale-attempt",
                f"run {key.run_id} waits for attempt {pending.attempt} of {key.action_id}, "
                f"the answer is to attempt {key.attempt}",
            )

    async def publish(self, capability: str, event: CloudEvent) -> None:
        """Send one of the orchestrator's own answers, with the token an agent would echo."""
        run_id = event.extensions[tasks.RUN_ID]
        attempt = int(event.extensions[tasks.ATTEMPT])
        subject_cap = tasks.answer_capability(capability)
        token = self.tokens.token(subject_cap, run_id, event.extensions[tasks.ACTION_ID], attempt)
        headers, payload = tasks.encode_result(event, token=token)
        await self._js.publish(self._subjects.result(subject_cap, run_id), payload, headers=headers)

    async def failed(self, record: ev.ActionRequested, error_class: str, message: str) -> None:
        """Answer the action ``record`` requests with a failure, as an agent would."""
        d = record.data
        event_type, data = tasks.failure(error_class, message)
        event = tasks.answer_event(
            run_id=record.subject,
            action_id=d.action_id,
            attempt=d.attempt,
            event_id=f"{d.action_id}.{d.attempt}.rejected",
            source=ev.SOURCE,
            type=event_type,
            data=data,
            time=record.time,
        )
        await self.publish(d.capability, event)


def check_output(registry: Registry, incoming: Incoming, state: RunState) -> Incoming:
    """An answer whose data break the capability's output_schema fails as schema_error."""
    if incoming.type == TASK_FAILED:
        # Checked here too for a failure that came by reference (loaded since key_of).
        problem = _retry_after_problem(incoming.type, incoming.data)
        if problem is not None:
            raise AnswerRefused("answer-retry-after", f"the answer: {problem}")
        return incoming
    # The capability is the one the run asked for, whatever the answer claims.
    pending = state.pending.get(incoming.extensions.get("actionid", ""))
    if pending is None:
        return incoming  # not awaited: decide ignores it
    capability = registry.capability(pending.capability)
    schemas = registry.schemas(pending.capability)
    if capability is None or schemas is None or schemas.output is None:
        return incoming
    try:
        schemas.output.check(incoming.data)
    except SchemaMismatch as exc:
        where = exc.where
        data = {
            "error": {
                "class": ErrorClass.SCHEMA_ERROR,
                "message": f"output of {capability.name} does not match its output_schema "
                f"at {where}: {exc.message}",
            }
        }
        return Incoming(
            type=TASK_FAILED,
            source=incoming.source,
            id=incoming.id,
            data=data,
            time=incoming.time,
            extensions=incoming.extensions,
        )
    return incoming


def too_large_answer(incoming: Incoming, why: str) -> Incoming:
    """The ``task.failed`` (class ``payload_too_large``) that stands for an answer too
    large to record."""
    return Incoming(
        type=TASK_FAILED,
        source=incoming.source,
        id=incoming.id,
        data={"error": {"class": ErrorClass.PAYLOAD_TOO_LARGE, "message": why}},
        time=incoming.time,
        extensions=incoming.extensions,
    )
