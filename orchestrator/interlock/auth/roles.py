"""Who may publish and subscribe to what: the one place the roles' NATS permissions live.

Each role is a template: given the installation's names (``Subjects``, from the prefix), the
user's public key (its private reply inbox) and the role's parameters (capabilities, event
patterns), it yields the allow and deny lists that go into the user's JWT. The server
enforces them; nothing here is checked by Interlock itself. The wire layout they follow is
in docs/architecture.md ("Trust boundary").

Replies: nats-py draws reply subjects (JetStream publish acks, API answers, pull-request
deliveries) from its inbox prefix. Every credential Interlock issues subscribes only to its
own ``_INBOX.<user public key>.>``, and clients connecting with a creds file use that prefix
(``inbox_prefix``), so no party can read another's replies (say, the orchestrator's reads of
run logs or of the secrets bucket).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from interlock.core.ids import capability_token
from interlock.transport.logmac import LOG_KEY
from interlock.transport.subjects import Subjects, inbox_prefix
from interlock.transport.tasks import consumer_name

__all__ = [
    "NATS_ROLES",
    "Permissions",
    "Role",
    "agent",
    "gateway",
    "inbox_prefix",
    "operator",
    "orchestrator",
    "permissions_for",
    "publisher",
    "system",
    "templates",
    "validate_event_pattern",
]

NATS_ROLES = ("orchestrator", "operator", "gateway", "agent", "publisher")
"""The roles a NATS credential is issued for (``interlock creds issue``); the gateway's HTTP
tokens have roles of their own (:data:`interlock.gateway.auth.TOKEN_ROLES`)."""
JS_API = "$JS.API"

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass(frozen=True)
class Permissions:
    """Allow and deny lists for publishing and subscribing (NATS user JWT ``pub``/``sub``)."""

    pub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()
    responses: bool = False
    """May publish one reply to the reply subject of a request it received."""

    def claims(self) -> dict[str, object]:
        """The ``pub``/``sub``/``resp`` members of a user JWT's ``nats`` claims."""
        out: dict[str, object] = {
            "pub": _lists(self.pub_allow, self.pub_deny),
            "sub": _lists(self.sub_allow, self.sub_deny),
        }
        if self.responses:
            out["resp"] = {"max": 1, "ttl": 0}
        return out


@dataclass(frozen=True)
class Role:
    """A role and its parameters, as ``creds issue`` takes them."""

    name: str
    capabilities: tuple[str, ...] = field(default=())
    events: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        if self.name == "agent":
            return f"agent for {', '.join(self.capabilities)}"
        if self.name == "publisher":
            return f"publisher of {', '.join(self.events)}"
        return self.name


def _lists(allow: Sequence[str], deny: Sequence[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if allow:
        out["allow"] = list(dict.fromkeys(allow))
    if deny:
        out["deny"] = list(dict.fromkeys(deny))
    return out


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def secrets_bucket(subjects: Subjects) -> str:
    """The KV bucket of the installation's secrets: its one-word keys (the task-token
    key) only the orchestrator may read; its ``shared.`` keys (the log key) the writers
    of run logs read too."""
    return subjects.secrets_bucket


def _no_secrets(subjects: Subjects, api: str = JS_API) -> tuple[str, ...]:
    """The JetStream API subjects that read, change or remove the secrets bucket's stream,
    and the KV subjects of its one-word keys (the orchestrator's alone). Left allowed:
    ``STREAM.INFO`` and ``STREAM.CREATE`` (the CLI provisions an installation's streams
    and buckets before the orchestrator first runs; an empty bucket holds nothing), and the
    ``shared.`` keys: the direct get of one key by its subject (``DIRECT.GET.<s>.<subject>``,
    which takes no request body, so it reads that key and nothing else) and its put (the
    bucket refuses a second value for a key: a put can only make a key that is not there
    yet). API subjects name the stream as their 5th or 6th token (``STREAM.MSG.GET.<s>``,
    ``CONSUMER.CREATE.<s>.<c>.<f>``, ``CONSUMER.DURABLE.CREATE.<s>.<c>``, ...)."""
    bucket = secrets_bucket(subjects)
    stream = _kv_stream(bucket)
    five = [f"{api}.STREAM.{op}.{stream}" for op in _STREAM_OPS]
    five += [f"{api}.CONSUMER.{op}.{stream}" for op in _CONSUMER_OPS]
    return (
        f"$KV.{bucket}.*",
        *five,
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.$KV.{bucket}.*",
        f"{api}.CONSUMER.*.{stream}.>",
        f"{api}.*.*.*.{stream}",
        f"{api}.*.*.*.{stream}.>",
    )


def _log_key(subjects: Subjects, api: str = JS_API) -> tuple[str, ...]:
    """What a writer of run logs needs of the log key: read it (a direct get of its one
    subject) and make it when it is not there yet (see interlock.transport.logmac)."""
    bucket = secrets_bucket(subjects)
    key = f"$KV.{bucket}.{LOG_KEY}"
    return (f"{api}.DIRECT.GET.{_kv_stream(bucket)}.{key}", key)


_STREAM_OPS = ("UPDATE", "DELETE", "PURGE", "SNAPSHOT", "RESTORE")
_CONSUMER_OPS = ("CREATE", "DELETE", "INFO", "NAMES", "LIST")


def orchestrator(subjects: Subjects, user: str) -> Permissions:
    """Everything Interlock needs: its subjects, the JetStream API, KV and object buckets."""
    p = subjects.prefix
    return Permissions(
        pub_allow=(f"{p}.>", f"{JS_API}.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "$O.>", "_INBOX.>"),
        sub_allow=(f"{p}.>", f"{inbox_prefix(user)}.>"),
        responses=True,
    )


def operator(subjects: Subjects, user: str) -> Permissions:
    """The CLI's reads and admin: apply (definition buckets), start/cancel (run logs),
    signal and emit (events), logs, dead letters (read and redrive through the API), and the
    JetStream API, except the secrets bucket. Task requests, answers, timers and dead
    letters are written by the orchestrator and the agents only."""
    p = subjects.prefix
    return Permissions(
        pub_allow=(
            f"{p}.events.>",
            f"{p}.runs.>",
            # The audit record of a run it deletes (`interlock runs delete`).
            f"{p}.audit.>",
            f"{JS_API}.>",
            "$JS.ACK.>",
            "$JS.FC.>",
            "$KV.>",
            "$O.>",
        ),
        pub_deny=(f"{p}.timers.>", f"{p}.cap.>", f"{p}.results.>", *_no_secrets(subjects)),
        # The run logs it may read anyway: the client's waits share one subscription on
        # them (interlock.runtime.waiting) instead of a consumer per wait.
        sub_allow=(f"{inbox_prefix(user)}.>", f"{p}.runs.>"),
    )


def gateway(subjects: Subjects, user: str) -> Permissions:
    """The HTTP gateway: what its routes do for their (token- or signature-checked)
    callers, and nothing more. It publishes events (a run's own subject included: signals
    and webhooks' signals), appends to run logs (``POST /runs`` and cancel, as the CLI
    does), reads logs, the run index, definitions, workers and dead letters, removes a dead
    letter it redrives, reads its callers' tokens and the webhooks, and writes the
    deliveries it has answered (the webhook replay guard) and the workflows operators pause.
    Not: stream or consumer administration beyond reading (no consumer at all, no purge,
    delete or update), task requests, answers, timers, dead letters of its own, definitions,
    tokens or secrets.

    Its account imports these subjects (interlock.auth.accounts.gateway_imports), the
    JetStream API ones under ``Subjects.party_js_api``; the permissions say the same again
    inside that account, and deny the secrets bucket, whose reads the imports of every
    stream's would let through."""
    p = subjects.prefix
    s = subjects
    api = s.party_js_api
    pub: list[str] = [
        f"{p}.events.>",
        f"{p}.runs.>",
        # Readiness: every stream and bucket exists.
        f"{api}.STREAM.INFO.*",
        # Reads of logs, dead letters and KV values (the secrets bucket's are denied).
        f"{api}.DIRECT.GET.>",
        f"{api}.STREAM.MSG.GET.*",
        f"{api}.STREAM.MSG.DELETE.{s.dead_letter_stream}",
        f"$KV.{s.deliveries_bucket}.>",
        # Pausing and resuming workflows and capabilities (POST .../pause, operators).
        f"$KV.{s.paused_bucket}.>",
        # The log key (it writes run logs): see _log_key.
        *_log_key(s, api),
        # Payloads it stores by reference: a large event's data, a run's inputs.
        f"$O.{s.uploads_bucket}.>",
        f"$O.{s.objects_bucket}.>",
        # Queue depth per capability (GET /agents): the task consumers' info, read only.
        f"{api}.CONSUMER.INFO.{s.tasks_stream}.*",
    ]
    return Permissions(
        pub_allow=tuple(pub),
        pub_deny=_no_secrets(subjects, api),
        # Run logs as they are appended (the client's waits and live logs share one
        # subscription on them, interlock.runtime.waiting) and the run index's writes
        # (GET /live/runs): both imported as streams, with no consumer.
        sub_allow=(f"{inbox_prefix(user)}.>", f"{p}.runs.>", f"$KV.{s.runs_bucket}.*"),
    )


def _objects(subjects: Subjects, own: str | None, readable: Iterable[str] = ()) -> list[str]:
    """A party's object buckets: writing its own (``own``: chunks, meta, and the meta read
    of nats-py's ``put``), and reading by direct gets the buckets it may read."""
    api = subjects.party_js_api
    out: list[str] = []
    if own is not None:
        out += [f"$O.{own}.C.*", f"$O.{own}.M.*", f"{api}.STREAM.MSG.GET.OBJ_{own}"]
        out.append(f"{api}.STREAM.INFO.OBJ_{own}")  # an object store client binds with it
    return out + [f"{api}.DIRECT.GET.OBJ_{bucket}" for bucket in readable]


def agent(
    subjects: Subjects, user: str, capabilities: Iterable[str], bucket: str | None = None
) -> Permissions:
    """Take tasks of its capabilities through their (orchestrator-made) durable consumers,
    answer them (by request, the reply coming to its own inbox, or to the results stream),
    hear their cancel notices, heartbeat under their keys, read the AgentDefs, dead-letter
    its own bad tasks. Nothing else: no run logs, timers, events, other
    capabilities, stream or consumer administration."""
    p = subjects.prefix
    # Its account imports the JetStream API subjects it may use under this prefix
    # (interlock.auth.accounts): in its account, ``$JS.API`` answers "not enabled".
    api = subjects.party_js_api
    tasks = subjects.tasks_stream
    workers, agents = subjects.workers_bucket, subjects.agents_bucket
    pub: list[str] = [
        # Reading the AgentDefs: the bucket's info and direct gets (no consumer: a stream
        # takes at most 1,000, and one agent making them would leave none for the others);
        # writes to it are heard on its subjects (below).
        f"{api}.STREAM.INFO.{_kv_stream(agents)}",
        f"{api}.DIRECT.GET.{_kv_stream(agents)}",
        f"{api}.DIRECT.GET.{_kv_stream(agents)}.>",
        # Heartbeats: the workers bucket's info and puts under its capabilities' keys.
        f"{api}.STREAM.INFO.{_kv_stream(workers)}",
    ]
    sub: list[str] = [f"{inbox_prefix(user)}.>", f"$KV.{agents}.>"]
    caps = list(dict.fromkeys(capabilities))
    if not caps:
        raise ValueError("an agent credential needs at least one capability")
    for cap in caps:
        validate_capability(cap)
        durable = consumer_name(cap)
        # One token after the capability (the run id, or a reason): ``review.*`` does not
        # reach the answers of a capability ``review.deep``.
        pub += [
            f"{api}.CONSUMER.INFO.{tasks}.{durable}",
            f"{api}.CONSUMER.MSG.NEXT.{tasks}.{durable}",
            f"$JS.ACK.{tasks}.{durable}.>",
            f"{p}.answer.{cap}.*",
            f"{p}.results.{cap}.*",
            f"{p}.dlq.agent.{cap}.*",
            f"$KV.{workers}.{capability_token(cap)}.*",
        ]
        sub.append(f"{p}.control.{cap}.*")
    pub += _objects(subjects, bucket, [subjects.inputs_bucket(c) for c in caps])
    return Permissions(pub_allow=tuple(pub), sub_allow=tuple(sub))


def publisher(
    subjects: Subjects, user: str, patterns: Iterable[str], bucket: str | None = None
) -> Permissions:
    """Publish CloudEvents whose types match ``patterns`` (NATS wildcards over the type's
    dot-separated words), with JetStream acks; nothing else: not the subjects of events
    addressed to one run."""
    pats = list(dict.fromkeys(patterns))
    if not pats:
        raise ValueError("a publisher credential needs at least one event type pattern")
    for pattern in pats:
        validate_event_pattern(pattern)
    return Permissions(
        pub_allow=(*(subjects.event(pattern) for pattern in pats), *_objects(subjects, bucket)),
        # Events addressed to one run: even a publisher of every type (``>``) may not
        # steer a run by its id (interlock.runtime.addressing).
        pub_deny=(subjects.addressed_all,),
        sub_allow=(f"{inbox_prefix(user)}.>",),
    )


def system(user: str) -> Permissions:
    """The system-account user ``creds revoke`` pushes account updates with."""
    return Permissions(
        pub_allow=("$SYS.REQ.CLAIMS.UPDATE", "$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE"),
        sub_allow=(f"{inbox_prefix(user)}.>",),
    )


def permissions_for(
    role: Role, subjects: Subjects, user: str, *, bucket: str | None = None
) -> Permissions:
    """The permissions of ``role`` for the user with public key ``user`` (an agent's or a
    publisher's own object bucket: ``bucket``)."""
    if role.name == "orchestrator":
        return orchestrator(subjects, user)
    if role.name == "operator":
        return operator(subjects, user)
    if role.name == "gateway":
        return gateway(subjects, user)
    if role.name == "agent":
        return agent(subjects, user, role.capabilities, bucket)
    if role.name == "publisher":
        return publisher(subjects, user, role.events, bucket)
    raise ValueError(f"unknown role {role.name!r}; expected one of {', '.join(NATS_ROLES)}")


def templates(subjects: Subjects) -> dict[str, Permissions]:
    """Every role's permissions with placeholders, for contracts and docs: ``{capability}``
    (an agent's capability), ``{capability_token}`` (the same as one token), ``{events}``
    (a publisher's event-type pattern), ``{bucket}`` (an agent's or a publisher's own object
    bucket) and ``{user}`` (the user's public key)."""
    # A capability with a dot tells its name (``CAPA.BILITY``) from its token (``CAPA_BILITY``).
    user, cap, token, events = "USERKEY", "CAPA.BILITY", "CAPA_BILITY", "EVENTS"
    bucket = "OWNBUCKET"

    def fill(perms: Permissions) -> Permissions:
        def sub(items: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(
                i.replace(user, "{user}")
                .replace(token, "{capability_token}")
                .replace(cap, "{capability}")
                .replace(events, "{events}")
                .replace(bucket, "{bucket}")
                for i in items
            )

        return Permissions(
            sub(perms.pub_allow),
            sub(perms.pub_deny),
            sub(perms.sub_allow),
            sub(perms.sub_deny),
            perms.responses,
        )

    return {
        "orchestrator": fill(orchestrator(subjects, user)),
        "operator": fill(operator(subjects, user)),
        "gateway": fill(gateway(subjects, user)),
        "agent": fill(agent(subjects, user, [cap], bucket)),
        "publisher": fill(publisher(subjects, user, [events], bucket)),
    }


def validate_capability(name: str) -> None:
    """A capability name: dot-separated words (letters, digits, ``_`` and ``-``)."""
    if not name or not all(_TOKEN.match(word) for word in name.split(".")):
        raise ValueError(
            f"capability name {name!r} must be dot-separated words of letters, digits, _ and -"
        )


def validate_event_pattern(pattern: str) -> None:
    """An event type pattern: dot-separated words, ``*`` for one word, ``>`` last for the rest."""
    words = pattern.split(".")
    for i, word in enumerate(words):
        if word == ">" and i == len(words) - 1:
            continue
        if word == "*" or _TOKEN.match(word):
            continue
        raise ValueError(
            f"event type pattern {pattern!r}: {word!r} is not a word, '*' or a final '>'"
        )
