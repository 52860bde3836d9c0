"""The NATS accounts of an installation: what the orchestrator's account exports, and what
each party's account imports from it.

The orchestrator's account holds every stream and bucket, the orchestrator, the operators
(the CLI) and the HTTP gateway. Every agent and publisher credential gets an account of its
own that imports only its role's subjects. A subject a party names (a reply subject above
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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from interlock.auth.roles import JS_API, Role, validate_capability, validate_event_pattern
from interlock.core.ids import capability_token
from interlock.transport.subjects import Subjects
from interlock.transport.tasks import consumer_name

__all__ = [
    "JS_API_TAG",
    "OBJECTS_TAG",
    "PARTY_ROLES",
    "exports",
    "imports",
    "party_account_claims",
]

PARTY_ROLES = ("agent", "publisher")
"""Roles whose credentials get an account of their own."""
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
    tasks, agents = s.tasks_stream, _kv(s.agents_bucket)
    return [
        # Requests in, one answer (a JetStream acknowledgement, the orchestrator's reply)
        # back to the requester's inbox.
        _service(f"{p}.events.>"),
        _service(f"{p}.answer.>"),
        _service(f"{p}.results.>"),
        _service(f"{p}.dlq.agent.>"),
        _service(f"$KV.{s.workers_bucket}.>"),
        # A pull request is answered by every task it takes, then a status (and the
        # idle heartbeats while it is open).
        _service(f"{JS_API}.CONSUMER.MSG.NEXT.{tasks}.*", STREAM),
        _service(f"{JS_API}.CONSUMER.INFO.{tasks}.*"),
        _service(f"$JS.ACK.{tasks}.>"),
        # A batched direct get is answered by every message of the batch, then a status
        # (the form with the request in the body, ``DIRECT.GET.<stream>``, is exported for
        # every stream by object_exports: two exports may not overlap).
        _service(f"{JS_API}.DIRECT.GET.{agents}.>", STREAM),
        # Messages out: cancel notices, and writes to the AgentDefs.
        _stream(f"{p}.control.>"),
        _stream(f"$KV.{s.agents_bucket}.>"),
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
