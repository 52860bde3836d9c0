"""The wire contract: subject, stream and bucket names, all derived from one prefix.

Every name Interlock puts on a NATS server comes from here, so two installations with
different prefixes can share one server and the contract lives in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlock.core.ids import capability_token, check_run_id

DEFAULT_PREFIX = "il"

ADDRESSED = "@run"
"""The events subject's token that marks an event addressed to one run:
``<prefix>.events.@run.<run_id>.<type>``. ``@`` is no character of an event type, so no
type's subject can be one; publishers' permissions deny it (only the operator, the gateway
and the orchestrator may address a run)."""


@dataclass(frozen=True, slots=True)
class Subjects:
    """Names for one installation, derived from its subject prefix (default ``il``)."""

    prefix: str = DEFAULT_PREFIX

    # --- streams -------------------------------------------------------------------
    @property
    def _stream_base(self) -> str:
        return self.prefix.upper().replace(".", "_").replace("-", "_")

    @property
    def events_stream(self) -> str:
        """Inbound CloudEvents from outside (limits retention, source+id dedupe)."""
        return f"{self._stream_base}_EVENTS"

    @property
    def runs_stream(self) -> str:
        """Run logs: one subject per run (limits retention, never work-queue)."""
        return f"{self._stream_base}_RUNS"

    def runs_stream_of(self, partition: int) -> str:
        """The run-log stream of ``partition``: ``<BASE>_RUNS`` for partition 0 (the one
        stream of an installation with one partition), ``<BASE>_RUNS_<n>`` for the others."""
        return self.runs_stream if partition == 0 else f"{self.runs_stream}_{partition}"

    @property
    def tasks_stream(self) -> str:
        """Capability requests (work-queue, one durable consumer per capability)."""
        return f"{self._stream_base}_TASKS"

    @property
    def results_stream(self) -> str:
        """Capability results on their way back to the orchestrator."""
        return f"{self._stream_base}_RESULTS"

    @property
    def dead_letter_stream(self) -> str:
        """Rejected messages, each with its reason in a header."""
        return f"{self._stream_base}_DLQ"

    @property
    def parked_stream(self) -> str:
        """Events that arrived before the run they correlate with was waiting for them."""
        return f"{self._stream_base}_PARKED"

    @property
    def timers_stream(self) -> str:
        """Durable timers (JetStream message scheduling)."""
        return f"{self._stream_base}_TIMERS"

    @property
    def audit_stream(self) -> str:
        """What was done to runs that is not in their logs (deletions), kept for good."""
        return f"{self._stream_base}_AUDIT"

    # --- KV buckets ----------------------------------------------------------------
    @property
    def _bucket_base(self) -> str:
        return self._stream_base.lower()

    @property
    def workflows_bucket(self) -> str:
        return f"{self._bucket_base}_workflows"

    @property
    def agents_bucket(self) -> str:
        return f"{self._bucket_base}_agents"

    @property
    def workers_bucket(self) -> str:
        """Live agent workers, each key kept alive by a heartbeat (TTL)."""
        return f"{self._bucket_base}_workers"

    @property
    def correlation_bucket(self) -> str:
        """Correlation index: (workflow, key) -> the runs started with that key."""
        return f"{self._bucket_base}_correlation"

    @property
    def webhooks_bucket(self) -> str:
        """Webhook definitions (``kind: Webhook``), read by the HTTP gateway."""
        return f"{self._bucket_base}_webhooks"

    @property
    def deliveries_bucket(self) -> str:
        """Webhook deliveries already taken and what they were answered (replay guard)."""
        return f"{self._bucket_base}_deliveries"

    @property
    def http_tokens_bucket(self) -> str:
        """The HTTP gateway's bearer tokens, stored hashed, with their role."""
        return f"{self._bucket_base}_http_tokens"

    @property
    def snapshots_bucket(self) -> str:
        """Runs' folded states (derived, checked against the log when read)."""
        return f"{self._bucket_base}_snapshots"

    @property
    def partitions_bucket(self) -> str:
        """The partition map (one key, ``map``, its revisions the layouts' history) and the
        partitions' owners (one key each, kept alive by their owner's renewals)."""
        return f"{self._bucket_base}_partitions"

    @property
    def runs_bucket(self) -> str:
        """Derived run index (workflow, status); rebuildable from the logs."""
        return f"{self._bucket_base}_runs"

    @property
    def slots_bucket(self) -> str:
        """Concurrency limits: the holders and waiters of each limit and key (derived from
        the run logs' queued, admitted and end records; rebuildable from them)."""
        return f"{self._bucket_base}_slots"

    @property
    def triggers_bucket(self) -> str:
        """Flow control of triggers: each debounce or batch key's open window of events,
        and each rate key's next free start (compare-and-set, like the slots)."""
        return f"{self._bucket_base}_triggers"

    @property
    def paused_bucket(self) -> str:
        """Paused workflows: one key each, written by pause and removed by resume."""
        return f"{self._bucket_base}_paused"

    @property
    def secrets_bucket(self) -> str:
        """The orchestrator's own secrets (the task-token key); nobody else reads it."""
        return f"{self._bucket_base}_secrets"

    # --- object buckets (payloads kept by reference) ---------------------------------
    @property
    def objects_bucket(self) -> str:
        """The payloads runs' logs reference (each run's own objects, named after it):
        large inputs, answers, events, outputs and context values. Only the orchestrator's
        account writes it."""
        return f"{self._bucket_base}_objects"

    @property
    def uploads_bucket(self) -> str:
        """Large payloads sent by the operators and the gateway (an event's data), kept as
        long as events are (the orchestrator copies what a run takes into the run's own)."""
        return f"{self._bucket_base}_uploads"

    def inputs_bucket(self, capability: str) -> str:
        """Large task inputs of ``capability``: its agents may read this bucket alone."""
        return f"{self._bucket_base}_in_{capability_token(capability)}"

    def party_bucket(self, account: str) -> str:
        """The uploads of one party (an agent's answers, a publisher's events): its
        account, ``account`` (public key), may write and read this bucket alone."""
        return f"{self._bucket_base}_party_{account}"

    def orchestrator_bucket(self, bucket: str) -> bool:
        """Whether only the orchestrator's account writes ``bucket`` (its own, or a
        capability's task inputs): where the objects a run's log references are kept."""
        return bucket == self.objects_bucket or bucket.startswith(f"{self._bucket_base}_in_")

    def may_reference(self, bucket: str) -> bool:
        """Whether an event or an answer may name ``bucket``: the uploads of the
        orchestrator's account, or a party's (never a run's objects or a capability's task
        inputs)."""
        return bucket == self.uploads_bucket or bucket.startswith(f"{self._bucket_base}_party_")

    # --- subjects ------------------------------------------------------------------
    @property
    def party_js_api(self) -> str:
        """The JetStream API prefix of a party's account (agents): the API subjects it may
        use are imported there from the orchestrator's account, where they are
        ``$JS.API.<...>`` (interlock.auth.accounts)."""
        return f"{self.prefix}.js.API"

    def event(self, event_type: str) -> str:
        return f"{self.prefix}.events.{event_type}"

    @property
    def events_all(self) -> str:
        return f"{self.prefix}.events.>"

    def addressed(self, run_id: str, event_type: str) -> str:
        """Where an event for run ``run_id`` only (a signal) is published."""
        return f"{self.prefix}.events.{ADDRESSED}.{check_run_id(run_id)}.{event_type}"

    @property
    def addressed_all(self) -> str:
        """Every event addressed to a run (what publishers may not publish)."""
        return f"{self.prefix}.events.{ADDRESSED}.>"

    def inbound(self, event_type: str, run_id: str | None = None) -> str:
        """Where an event of ``event_type`` is published: addressed to ``run_id`` when given,
        else on its type's subject."""
        return self.event(event_type) if run_id is None else self.addressed(run_id, event_type)

    def inbound_route(self, subject: str) -> tuple[str | None, str] | None:
        """(run id or None, event type) an events subject names; None when it is none."""
        head = f"{self.prefix}.events."
        if not subject.startswith(head):
            return None
        tail = subject[len(head) :]
        if tail.startswith(f"{ADDRESSED}."):
            run_id, _, event_type = tail[len(ADDRESSED) + 1 :].partition(".")
            return run_id, event_type
        return None, tail

    def run(self, run_id: str) -> str:
        """A run's log; ``run_id`` is checked (a wildcard or a dot would name other runs)."""
        return f"{self.prefix}.runs.{check_run_id(run_id)}"

    def run_in(self, run_id: str, partition: int) -> str:
        """A run's log in ``partition``: ``<prefix>.runs.<run_id>`` in partition 0 (as with
        one partition), ``<prefix>.runs.<partition>.<run_id>`` in the others."""
        if partition == 0:
            return self.run(run_id)
        return f"{self.prefix}.runs.{partition}.{check_run_id(run_id)}"

    @staticmethod
    def run_id_of(log_subject: str) -> str:
        """The run id a run log's subject names (its last token), in any partition."""
        return log_subject.rpartition(".")[2]

    @property
    def runs_all(self) -> str:
        """Every run log, in every partition."""
        return f"{self.prefix}.runs.>"

    def runs_of(self, partition: int, *, partitioned: bool = True) -> str:
        """The run logs of ``partition``: what its stream stores. Partition 0's is
        ``<prefix>.runs.*`` once there is more than one (``partitioned``), else every
        run-log subject, as with one stream."""
        if partition == 0:
            return f"{self.prefix}.runs.*" if partitioned else self.runs_all
        return f"{self.prefix}.runs.{partition}.*"

    def capability(self, name: str) -> str:
        return f"{self.prefix}.cap.{name}"

    @property
    def capabilities_all(self) -> str:
        return f"{self.prefix}.cap.>"

    @property
    def tasks_keeper(self) -> str:
        """A subject of the task requests' stream that no consumer reads: the one message
        on it keeps the stream's last file block from draining (interlock.runtime.keeper).
        Only the orchestrator publishes on it."""
        return f"{self.prefix}.tasks.keeper"

    def result(self, capability: str, run_id: str) -> str:
        """Where an agent of ``capability`` answers a task of run ``run_id``."""
        return f"{self.prefix}.results.{capability}.{check_run_id(run_id)}"

    def results_of(self, capability: str) -> str:
        """Every answer of ``capability`` (what an agent of it may publish)."""
        return f"{self.prefix}.results.{capability}.*"

    def answer(self, capability: str, run_id: str) -> str:
        """Where an agent of ``capability`` answers a task of run ``run_id`` by request and
        reply (core NATS, not stored: the orchestrator replies once the answer is in the
        run's log)."""
        return f"{self.prefix}.answer.{capability}.{check_run_id(run_id)}"

    def answers_of(self, capability: str) -> str:
        """Every answer request of ``capability`` (what an agent of it may publish)."""
        return f"{self.prefix}.answer.{capability}.*"

    @property
    def answers_all(self) -> str:
        """Every answer request (what the orchestrator alone subscribes to)."""
        return f"{self.prefix}.answer.>"

    def answered(self, subject: str) -> tuple[str, str] | None:
        """(capability, run id) of an answer's subject (``results`` or ``answer``); None
        when it is neither."""
        for head in (f"{self.prefix}.results.", f"{self.prefix}.answer."):
            if subject.startswith(head):
                break
        else:
            return None
        capability, _, run_id = subject[len(head) :].rpartition(".")
        if not capability or not run_id:
            return None
        return capability, run_id

    @property
    def results_all(self) -> str:
        return f"{self.prefix}.results.>"

    @property
    def audit_all(self) -> str:
        return f"{self.prefix}.audit.>"

    def audit_deleted(self, run_id: str) -> str:
        """The audit record of a run's deletion."""
        return f"{self.prefix}.audit.deleted.{check_run_id(run_id)}"

    @property
    def audit_deletions(self) -> str:
        """Every audit record of a run's deletion."""
        return f"{self.prefix}.audit.deleted.*"

    def dead_letter(self, reason: str) -> str:
        return f"{self.prefix}.dlq.{reason}"

    def agent_dead_letter(self, capability: str, reason: str) -> str:
        """An agent's own dead letter (a task of ``capability`` it could not answer)."""
        return f"{self.prefix}.dlq.agent.{capability}.{reason}"

    @property
    def dead_letters_all(self) -> str:
        return f"{self.prefix}.dlq.>"

    def written_by_an_agent(self, letter_subject: str) -> bool:
        """Whether a dead letter stored on ``letter_subject`` is one an agent wrote itself
        (headers and all: the subject it names is the agent's word)."""
        return letter_subject.startswith(f"{self.prefix}.dlq.agent.")

    def dead_lettered_from(self, subject: str) -> bool:
        """Whether the orchestrator dead-letters messages that came on ``subject``: events,
        answers (by request or on the results stream) and fired timers; never a run log,
        a task, a bucket or the JetStream API."""
        return self.is_answer_or_timer(subject) or self._under(subject, "events")

    def is_answer_or_timer(self, subject: str) -> bool:
        """Whether ``subject`` carries answers (by request or on the results stream) or
        timers: written by agents and the orchestrator only."""
        return self._under(subject, "answer", "results", "timers")

    def _under(self, subject: str, *kinds: str) -> bool:
        return subject.startswith(tuple(f"{self.prefix}.{kind}." for kind in kinds))

    def parked(self, token: str) -> str:
        return f"{self.prefix}.parked.{token}"

    @property
    def parked_all(self) -> str:
        return f"{self.prefix}.parked.>"

    def timer_schedule(self, timer_id: str) -> str:
        return f"{self.prefix}.timers.schedule.{timer_id}"

    def timer_fired(self, run_id: str) -> str:
        return f"{self.prefix}.timers.fired.{check_run_id(run_id)}"

    @property
    def timers_all(self) -> str:
        return f"{self.prefix}.timers.>"

    @property
    def timers_fired_all(self) -> str:
        """Fired timers of every run (what the ``timers`` consumer reads)."""
        return f"{self.prefix}.timers.fired.>"

    def owner(self, partition: int, kind: str, run_id: str) -> str:
        """A message for a run handed to the replica holding its partition (core NATS,
        between orchestrator replicas only): ``kind`` is ``event``, ``result``, ``timer``
        or ``incoming``."""
        return f"{self.prefix}.owner.{partition}.{kind}.{check_run_id(run_id)}"

    def owned(self, partition: int) -> str:
        """Every message handed to the holder of ``partition`` (what it subscribes to)."""
        return f"{self.prefix}.owner.{partition}.>"

    def control(self, capability: str, run_id: str) -> str:
        """Cancellation notices to the agents of ``capability`` working for a run (core
        NATS, not stored)."""
        return f"{self.prefix}.control.{capability}.{check_run_id(run_id)}"

    @property
    def control_all(self) -> str:
        """Cancellation notices of every capability and run."""
        return f"{self.prefix}.control.>"

    def controls_of(self, capability: str) -> str:
        """Every cancellation notice for ``capability`` (what its agents subscribe to)."""
        return f"{self.prefix}.control.{capability}.*"


def inbox_prefix(user_public_key: str) -> str:
    """The reply-subject prefix of a user: ``_INBOX.<its public key>`` (the only inbox the
    credentials Interlock issues may subscribe to; see :mod:`interlock.auth.roles`)."""
    return f"_INBOX.{user_public_key}"


REPLY_INBOXES = ("_INBOX.", "_R_.")
"""What a reply subject a server-side component answers on starts with: a requester's own
inbox (``_INBOX.`` of any form), or the reply subject the server makes for a request that
came through a service import (``_R_.``, which leads back to the requester's inbox)."""


def is_inbox(reply: str) -> bool:
    """Whether ``reply`` is a requester's inbox, the only kind of reply subject Interlock
    answers on: anything else is a subject the requester named freely, and an answer there
    would be written with the answerer's rights (a JetStream API request, a log append)."""
    return reply.startswith(REPLY_INBOXES) and " " not in reply
