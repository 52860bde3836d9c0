"""The NATS accounts of an installation: what the orchestrator's account exports, and what
each party's account imports from it.

The orchestrator's account holds every stream and bucket, the orchestrator and the operators
(the CLI). Every agent, publisher and HTTP gateway credential gets an account of its own that
imports only its role's subjects. A subject a party names (a reply subject above
all) lives in the party's account, where only those imports lead anywhere: the server never
writes a JetStream acknowledgement or an API answer onto a subject of the orchestrator's
account that the party did not import (docs/architecture.md, "Accounts").

Service exports carry requests into the orchestrator's account and the answer back to the
requester's own inbox (the server rewrites the reply subject to a ``_R_.`` subject of its
own); stream exports carry messages out of it.

JetStream is not enabled in a party's account, and the server answers that account's own
``$JS.API.>`` requests itself ("JetStream not enabled for account"), alongside any import
on the same subject: the JetStream API subjects a party may use are imported under
``Subjects.party_js_api`` instead (``<prefix>.js.API``), the API prefix its client is set
to. Acknowledgements (``$JS.ACK.>``) and bucket writes (``$KV.>``) keep their names.

The gateway is a party too: it acts for callers it authenticates itself, so it imports more
(appends to run logs, the run logs as they are appended, reads of every stream but the
secrets bucket, which its user's permissions deny), but no answer to anything it asks can
land anywhere but its own account.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from interlock.auth.roles import JS_API, Role, validate_capability, validate_event_pattern
from interlock.core.ids import capability_token
from interlock.transport.logmac import LOG_KEY
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name

__all__ = [
    "JS_API_TAG",
    "OBJECTS_TAG",
    "PARTY_ROLES",
    "UPLOADING_ROLES",
    "exports",
    "gateway_imports",
    "imports",
    "party_account_claims",
]

PARTY_ROLES = ("agent", "publisher", "gateway")
"""Roles whose credentials get an account of their own."""
UPLOADING_ROLES = ("agent", "publisher")
"""Party roles with an object bucket of their own (the gateway stores what it is sent in
the orchestrator account's uploads and run objects, as it always has)."""
JS_API_TAG = "js-api:"
"""A user JWT tag naming the JetStream API prefix its client must use (party accounts)."""
OBJECTS_TAG = "objects:"
"""A user JWT tag naming its party's own object bucket (party accounts)."""

SINGLETON, STREAM = "Singleton", "Stream"


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


def _service(subject: str, response: str = SINGLETON) -> dict[str, Any]:
    return {"name": subject, "subject": subject, "type": "service", "response_type": response}


def _stream(subject: str) -> dict[str, Any]:
    return {"name": subject, "subject": subject, "type": "stream"}


def exports(subjects: Subjects) -> list[dict[str, Any]]:
    """What the orchestrator's account offers parties, for one subject prefix."""
    p, s = subjects.prefix, subjects
    tasks = s.tasks_stream
    return [
        # Requests in, one answer (a JetStream acknowledgement, the orchestrator's reply)
        # back to the requester's inbox.
        _service(f"{p}.events.>"),
        _service(f"{p}.answer.>"),
        _service(f"{p}.results.>"),
        _service(f"{p}.dlq.agent.>"),
        _service(f"$KV.{s.workers_bucket}.>"),
        # The gateway's writes: run-log appends (start, cancel), the webhook deliveries it
        # answered, pauses, the log key when it is not there yet, a redriven dead letter's
        # removal.
        _service(f"{p}.runs.>"),
        _service(f"$KV.{s.deliveries_bucket}.>"),
        _service(f"$KV.{s.paused_bucket}.>"),
        _service(f"$KV.{s.secrets_bucket}.{LOG_KEY}"),
        _service(f"{JS_API}.STREAM.MSG.DELETE.{s.dead_letter_stream}"),
        # A pull request is answered by every task it takes, then a status (and the
        # idle heartbeats while it is open).
        _service(f"{JS_API}.CONSUMER.MSG.NEXT.{tasks}.*", STREAM),
        _service(f"{JS_API}.CONSUMER.INFO.{tasks}.*"),
        _service(f"$JS.ACK.{tasks}.>"),
        # Messages out: cancel notices, writes to the AgentDefs, and (to the gateway) the
        # run logs as they are appended and the run index as it is written.
        _stream(f"{p}.control.>"),
        _stream(f"$KV.{s.agents_bucket}.>"),
        _stream(f"{p}.runs.>"),
        _stream(f"$KV.{s.runs_bucket}.>"),
    ]


def object_exports() -> list[dict[str, Any]]:
    """What the orchestrator's account offers for payloads kept by reference, whatever
    the prefix (object buckets are named by it): a party's uploads (the chunks and meta
    messages of its own bucket, and the meta read of nats-py's ``put``), and reading a
    bucket by direct gets (a batch: every chunk, then a status). Each party imports only
    its own bucket and, an agent, its capabilities' task inputs."""
    return [
        _service("$O.>"),
        _service(f"{JS_API}.STREAM.MSG.GET.*"),
        # Also the info of the AgentDefs' and workers' buckets agents read (two exports
        # may not overlap, so the exports for every prefix are these).
        _service(f"{JS_API}.STREAM.INFO.*"),
        _service(f"{JS_API}.DIRECT.GET.*", STREAM),
        # A direct get of a subject's last message, the subject in the request's own
        # (``DIRECT.GET.<stream>.<subject>``): an agent imports the AgentDefs' keys, the
        # gateway every stream's (two exports may not overlap, so it is one for all).
        _service(f"{JS_API}.DIRECT.GET.*.>", STREAM),
    ]


def _object_imports(
    exporter: str, api: str, own: str | None, readable: list[str]
) -> list[dict[str, Any]]:
    """A party's imports of its own bucket (``own``: write chunks and meta, read its meta)
    and of the buckets it may read (``readable``: direct gets only)."""
    out: list[dict[str, Any]] = []
    if own is not None:
        out += [
            _import(exporter, f"$O.{own}.C.*", "service"),
            _import(exporter, f"$O.{own}.M.*", "service"),
            _import(exporter, f"{JS_API}.STREAM.MSG.GET.OBJ_{own}", "service",
                    f"{api}.STREAM.MSG.GET.OBJ_{own}"),
            _import(exporter, f"{JS_API}.STREAM.INFO.OBJ_{own}", "service",
                    f"{api}.STREAM.INFO.OBJ_{own}"),
        ]  # fmt: skip
    out += [
        _import(exporter, f"{JS_API}.DIRECT.GET.OBJ_{b}", "service", f"{api}.DIRECT.GET.OBJ_{b}")
        for b in readable
    ]
    return out


def _import(account: str, subject: str, kind: str, local: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": subject, "subject": subject, "account": account, "type": kind}
    if local is not None and local != subject:
        out["local_subject"] = local
    return out


def imports(
    role: Role, subjects: Subjects, exporter: str, bucket: str | None = None
) -> list[dict[str, Any]]:
    """What a party of ``role`` imports from the orchestrator's account (public key
    ``exporter``): exactly its role's subjects, and its own object bucket ``bucket``."""
    s = subjects
    if role.name == "gateway":
        return gateway_imports(subjects, exporter)
    if role.name == "publisher":
        patterns = list(dict.fromkeys(role.events))
        if not patterns:
            raise ValueError("a publisher credential needs at least one event type pattern")
        for pattern in patterns:
            validate_event_pattern(pattern)
        events = [_import(exporter, s.event(pattern), "service") for pattern in patterns]
        return events + _object_imports(exporter, s.party_js_api, bucket, [])
    if role.name != "agent":
        raise ValueError(f"role {role.name!r} has no account of its own")
    caps = list(dict.fromkeys(role.capabilities))
    if not caps:
        raise ValueError("an agent credential needs at least one capability")
    api = s.party_js_api
    tasks, agents, workers = s.tasks_stream, _kv(s.agents_bucket), _kv(s.workers_bucket)

    def js_api(tail: str) -> dict[str, Any]:
        return _import(exporter, f"{JS_API}.{tail}", "service", f"{api}.{tail}")

    out: list[dict[str, Any]] = []
    for cap in caps:
        validate_capability(cap)
        durable = consumer_name(cap)
        out += [
            js_api(f"CONSUMER.MSG.NEXT.{tasks}.{durable}"),
            js_api(f"CONSUMER.INFO.{tasks}.{durable}"),
            _import(exporter, f"$JS.ACK.{tasks}.{durable}.>", "service"),
            _import(exporter, s.answers_of(cap), "service"),
            _import(exporter, s.results_of(cap), "service"),
            _import(exporter, f"{s.prefix}.dlq.agent.{cap}.*", "service"),
            _import(exporter, f"$KV.{s.workers_bucket}.{capability_token(cap)}.*", "service"),
            _import(exporter, f"{s.prefix}.control.{cap}.*", "stream"),
        ]
    out += [
        js_api(f"DIRECT.GET.{agents}"),
        js_api(f"DIRECT.GET.{agents}.>"),
        js_api(f"STREAM.INFO.{agents}"),
        js_api(f"STREAM.INFO.{workers}"),
        _import(exporter, f"$KV.{s.agents_bucket}.>", "stream"),
    ]
    return out + _object_imports(exporter, api, bucket, [s.inputs_bucket(c) for c in caps])


def gateway_imports(subjects: Subjects, exporter: str) -> list[dict[str, Any]]:
    """What an HTTP gateway's account imports: what its routes do for their callers.

    Services: publishing events (a run's own subject included) and appending to run logs
    (``POST /runs``, cancel); the webhook deliveries it answered, pauses, the log key when
    it is not there yet; the payloads it stores by reference (the uploads and the run
    objects buckets). Under the API prefix: stream info (readiness), reads of any stream
    (``STREAM.MSG.GET``, direct gets: logs, the run index, definitions, tokens, dead
    letters), the removal of a dead letter it redrives, and the task consumers' info (queue
    depths). Streams: the run logs as they are appended (its waits and live logs) and the
    run index's one-word keys as they are written (``GET /live/runs``)."""
    s, p, api = subjects, subjects.prefix, subjects.party_js_api

    def js_api(tail: str) -> dict[str, Any]:
        return _import(exporter, f"{JS_API}.{tail}", "service", f"{api}.{tail}")

    return [
        _import(exporter, f"{p}.events.>", "service"),
        _import(exporter, f"{p}.runs.>", "service"),
        _import(exporter, f"$KV.{s.deliveries_bucket}.>", "service"),
        _import(exporter, f"$KV.{s.paused_bucket}.>", "service"),
        _import(exporter, f"$KV.{s.secrets_bucket}.{LOG_KEY}", "service"),
        _import(exporter, f"$O.{s.uploads_bucket}.>", "service"),
        _import(exporter, f"$O.{s.objects_bucket}.>", "service"),
        js_api("STREAM.INFO.*"),
        js_api("STREAM.MSG.GET.*"),
        js_api("DIRECT.GET.*"),
        js_api("DIRECT.GET.*.>"),
        js_api(f"STREAM.MSG.DELETE.{s.dead_letter_stream}"),
        js_api(f"CONSUMER.INFO.{s.tasks_stream}.*"),
        _import(exporter, f"{p}.runs.>", "stream"),
        _import(exporter, f"$KV.{s.runs_bucket}.*", "stream"),
    ]


def party_account_claims(
    role: Role,
    subjects: Subjects,
    exporter: str,
    limits: dict[str, Any],
    revocations: dict[str, int] | None = None,
    bucket: str | None = None,
) -> dict[str, Any]:
    """The ``nats`` claims of a party's account JWT: its imports, no JetStream."""
    nats: dict[str, Any] = {
        "type": "account",
        "limits": limits,
        "imports": imports(role, subjects, exporter, bucket),
        "default_permissions": {"pub": {}, "sub": {}},
    }
    if revocations:
        nats["revocations"] = revocations
    return nats


def exports_for(prefixes: Iterable[str]) -> list[dict[str, Any]]:
    """The orchestrator account's exports for every subject prefix it serves."""
    out: list[dict[str, Any]] = []
    for prefix in sorted(set(prefixes)):
        out += exports(Subjects(prefix))
    return out + object_exports()
