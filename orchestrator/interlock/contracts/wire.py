"""The NATS wire contract as an AsyncAPI 3 document, built from the code that speaks it.

Every name comes from :class:`~interlock.transport.subjects.Subjects` (subjects, streams,
buckets), :mod:`interlock.transport.tasks` (headers, extensions, consumer names and
settings, payload structs), :mod:`interlock.transport.streamconfigs` (stream settings) and
:func:`interlock.auth.roles.templates` (who may publish and read what: each channel's
roles are worked out by matching a sample subject against every role's NATS permissions).
The examples are the encoders' own output. ``python -m interlock.contracts`` writes it
to ``contracts/asyncapi.yaml``; ``--check`` fails when the code moved and the file did not.

The channels are in :mod:`interlock.contracts.channels`, the messages in
:mod:`interlock.contracts.messages`, the sample values and encoded examples in
:mod:`interlock.contracts.examples`; this module puts them into one document with the
operations, the task consumer and the roles.
"""

from __future__ import annotations

from typing import Any

import yaml

from interlock import __version__
from interlock.auth import roles
from interlock.contracts.channels import channels
from interlock.contracts.examples import SUBJECTS
from interlock.contracts.messages import messages
from interlock.transport import tasks
from interlock.transport.cloudevents import STRUCTURED_CONTENT_TYPE


def _consumer() -> dict[str, Any]:
    config = tasks.task_consumer_config(SUBJECTS, "{capability}")
    return {
        "stream": SUBJECTS.tasks_stream,
        "durableName": "cap_{capability_token}",
        "filterSubject": config.filter_subject,
        "createdBy": "the orchestrator (for every capability of every applied AgentDef); "
        "workers only bind to it, they may not create, change or delete it",
        "ackPolicy": str(config.ack_policy.value if config.ack_policy else ""),
        "ackWaitSeconds": config.ack_wait,
        "maxAckPending": config.max_ack_pending,
        "maxDeliver": config.max_deliver,
        "deliverPolicy": str(config.deliver_policy.value if config.deliver_policy else ""),
        "pull": True,
        "api": {
            "info": f"{roles.JS_API}.CONSUMER.INFO.{SUBJECTS.tasks_stream}."
            "cap_{capability_token}",
            "next": f"{roles.JS_API}.CONSUMER.MSG.NEXT.{SUBJECTS.tasks_stream}."
            "cap_{capability_token}",
            "acks": f"$JS.ACK.{SUBJECTS.tasks_stream}.cap_{{capability_token}}.>",
        },
        "acks": {
            "+ACK": "after the answer is safe: a reply `recorded` or `refused` to its "
            "request, or its publish to the results stream acknowledged",
            "+WPI": "progress: restarts the ack wait; send one every ackWait/3 while working",
            "-NAK": "hand the task back for redelivery (shutting down, or the answer could "
            "not be published)",
            "+TERM": "never deliver again (after an agent dead letter)",
        },
    }


def _operations() -> dict[str, Any]:
    def op(action: str, channel: str, summary: str, **more: Any) -> dict[str, Any]:
        return {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": summary,
            **more,
        }

    return {
        "publishEvent": op(
            "send", "inboundEvents", "A publisher, the gateway or the operator sends an event."
        ),
        "ingestEvents": op("receive", "inboundEvents", "The orchestrator takes events."),
        "signalRun": op(
            "send", "addressedEvents", "The operator or the gateway sends an event to one run."
        ),
        "ingestSignals": op(
            "receive", "addressedEvents", "The orchestrator takes events for one run."
        ),
        "appendRunLog": op("send", "runLog", "The orchestrator appends a decision's records."),
        "readRunLog": op("receive", "runLog", "The orchestrator and the operator read logs."),
        "dispatchTask": op("send", "taskRequests", "The orchestrator dispatches a task."),
        "receiveTask": op(
            "receive",
            "taskRequests",
            "A worker pulls tasks of its capability from the shared durable consumer.",
            **{"x-interlock-consumer": _consumer()},
        ),
        "requestAnswer": op(
            "send",
            "answerRequests",
            "A worker answers a task by request: echo ce-runid, ce-actionid, ce-attempt "
            "and the Interlock-Token header; on a reply `recorded` or `refused`, "
            "acknowledge the task; on no reply, no responders or `failed`, sendAnswer.",
            reply={"channel": {"$ref": "#/channels/answerReplies"}},
        ),
        "serveAnswers": op(
            "receive",
            "answerRequests",
            "The orchestrator checks an answer, appends it (or dead-letters it), then replies.",
            reply={"channel": {"$ref": "#/channels/answerReplies"}},
        ),
        "sendAnswer": op(
            "send",
            "answers",
            "A worker answers a task through the results stream (when its request got no "
            "reply, or always): echo ce-runid, ce-actionid, ce-attempt and the "
            "Interlock-Token header; then acknowledge the task.",
        ),
        "takeAnswers": op(
            "receive", "answers", "The orchestrator checks answers and appends them."
        ),
        "sendCancelNotice": op("send", "cancelNotices", "The orchestrator asks to stop."),
        "receiveCancelNotice": op(
            "receive",
            "cancelNotices",
            "A worker stops the named action (attempt) and answers task.failed, class "
            "cancelled, then acknowledges the task.",
        ),
        "sendHeartbeat": op("send", "heartbeats", "A worker says it is alive."),
        "listWorkers": op("receive", "heartbeats", "`interlock agents` lists live workers."),
        "scheduleTimer": op("send", "timerSchedules", "The orchestrator sets a timer."),
        "fireTimers": op("receive", "timersFired", "The orchestrator takes fired timers."),
        "deadLetter": op("send", "deadLetters", "The orchestrator refuses a message."),
        "agentDeadLetter": op(
            "send", "agentDeadLetters", "A worker refuses a task it cannot answer."
        ),
        "readDeadLetters": op("receive", "deadLetters", "The operator reads dead letters."),
    }


def _roles_component() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role, perms in roles.templates(SUBJECTS).items():
        entry: dict[str, Any] = {
            "publishAllow": list(perms.pub_allow),
            "subscribeAllow": list(perms.sub_allow),
        }
        if perms.pub_deny:
            entry["publishDeny"] = list(perms.pub_deny)
        if perms.sub_deny:
            entry["subscribeDeny"] = list(perms.sub_deny)
        out[role] = entry
    return out


def _accounts_component() -> dict[str, Any]:
    """The orchestrator account's exports and each party account's imports (templates)."""
    from interlock.auth import accounts

    def short(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keep = ("subject", "local_subject", "type", "response_type")
        return [{k: e[k] for k in keep if k in e} for e in entries]

    exporter = "ORCHESTRATOR_ACCOUNT"
    agent = roles.Role("agent", capabilities=("CAPA.BILITY",))
    publisher = roles.Role("publisher", events=("EVENTS",))

    def fill(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        text = yaml.safe_dump(short(entries))
        text = text.replace("CAPA_BILITY", "{capability_token}")
        text = text.replace("CAPA.BILITY", "{capability}").replace("EVENTS", "{events}")
        text = text.replace("OWNBUCKET", "{bucket}")
        loaded: list[dict[str, Any]] = yaml.safe_load(text)
        return loaded

    return {
        # What each party's user JWT names in its js-api: tag (auth.keys), the publisher's
        # for the reads of its own object bucket before it puts an event's data there.
        "jetStreamApiPrefix": dict.fromkeys(accounts.PARTY_ROLES, SUBJECTS.party_js_api),
        "orchestratorExports": short(accounts.exports(SUBJECTS) + accounts.object_exports()),
        "agentImports": fill(accounts.imports(agent, SUBJECTS, exporter, "OWNBUCKET")),
        "publisherImports": fill(accounts.imports(publisher, SUBJECTS, exporter, "OWNBUCKET")),
        "gatewayImports": short(accounts.gateway_imports(SUBJECTS, exporter)),
    }


DESCRIPTION = f"""\
How Interlock's parties talk over NATS JetStream: an orchestrator, operators (the CLI),
the HTTP gateway (HTTP callers' events and requests, on a credential of its own), agent
workers (one or more capabilities each) and event publishers. Generated by
`python -m interlock.contracts` from the code; do not edit by hand.

Subjects start with the installation's prefix (`{SUBJECTS.prefix}` here; streams
`{SUBJECTS.prefix.upper()}_*`, buckets `{SUBJECTS.prefix}_*` follow it). Every party connects
with a creds file (decentralized JWT) and must take its replies on `_INBOX.<its user public
key>` (the JWT's `sub`), the only inbox its credential may subscribe to. An agent, a
publisher or an HTTP gateway credential is a user of a NATS account of its own, which
imports only its role's subjects from the orchestrator's account
(`components.x-interlock-accounts`): an agent, a publisher and a gateway use the JetStream
API under the prefix `{SUBJECTS.party_js_api}` (its user JWT's `js-api:` tag names it; a
publisher only to read its own object bucket, a JetStream publish needs no API subject),
where its account imports the API subjects it may use; `$JS.ACK.>` and `$KV.>`
keep their names. Each channel's
`x-interlock-permissions` lists the roles whose credentials allow publishing to it,
subscribing to it, and reading it through the JetStream API, worked out from the roles'
permissions (`components.x-interlock-roles`, with `{{capability}}`,
`{{capability_token}}`, `{{events}}`, `{{bucket}}` (the party's own object bucket, its
JWT's `objects:` tag) and `{{user}}` placeholders).

Messages are CloudEvents 1.0 in binary mode (`ce-` headers, values percent-encoded,
payload = data) unless said otherwise; receivers also accept structured mode
(`Content-Type: {STRUCTURED_CONTENT_TYPE}`). Worker guide: docs/agents-any-language.md.
"""


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document (a JSON-compatible dict)."""
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Interlock wire contract",
            "version": __version__,
            "description": DESCRIPTION,
        },
        "defaultContentType": tasks.JSON,
        "servers": {
            "nats": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "Any server of the installation's NATS cluster (JetStream "
                "enabled, nats-server 2.12 or later).",
            }
        },
        "channels": channels(),
        "operations": _operations(),
        "components": {
            "messages": messages(),
            "x-interlock-roles": _roles_component(),
            "x-interlock-accounts": _accounts_component(),
        },
    }


def render() -> str:
    """The document as YAML (stable: the order of the code, no aliases)."""

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, text)

    return yaml.dump(
        document(),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
