"""The NATS wire contract as an AsyncAPI 3 document, built from the code that speaks it.

Every name comes from :class:`~interlock.transport.subjects.Subjects` (subjects, streams,
buckets), :mod:`interlock.transport.tasks` (headers, extensions, consumer names and
settings, payload structs), :mod:`interlock.transport.provision` (stream settings) and
:func:`interlock.auth.roles.templates` (who may publish and read what: each channel's
roles are worked out by matching a sample subject against every role's NATS permissions).
The examples are the encoders' own output. ``python -m interlock.contracts_gen`` writes it
to ``contracts/asyncapi.yaml``; ``--check`` fails when the code moved and the file did not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import yaml

from interlock import __version__
from interlock.auth import roles
from interlock.core.events import BATCH_CONTENT_TYPE
from interlock.core.vocabulary import ErrorClass
from interlock.transport import provision, tasks
from interlock.transport.cloudevents import STRUCTURED_CONTENT_TYPE, CloudEvent, encode_binary
from interlock.transport.subjects import Subjects

SUBJECTS = Subjects()

# Sample values: role permissions are matched against subjects built from these.
_CAP = "acme.review"
_RUN = "order-7f3a"
_INSTANCE = "host1-4242"
_EVENT_TYPE = "acme.order.placed"
_TIME = "2026-01-01T12:00:00.000Z"
_TOKEN = tasks.TaskTokens(b"an example key, not a real one!!")


# --- permissions ----------------------------------------------------------------------


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more at the end."""
    p, s = pattern.split("."), subject.split(".")
    for i, word in enumerate(p):
        if word == ">":
            return len(s) > i
        if i >= len(s) or (word != "*" and word != s[i]):
            return False
    return len(p) == len(s)


def _fill(item: str) -> str:
    return (
        item.replace("{capability_token}", tasks.capability_token(_CAP))
        .replace("{capability}", _CAP)
        .replace("{events}", _EVENT_TYPE)
        .replace("{user}", "UKEY")
    )


def _allowed(allow: Iterable[str], deny: Iterable[str], subject: str) -> bool:
    return any(_matches(_fill(a), subject) for a in allow) and not any(
        _matches(_fill(d), subject) for d in deny
    )


def _who(subject: str, *, read_api: Iterable[str] = ()) -> dict[str, list[str]]:
    """Which roles may publish to ``subject``, subscribe to it (core NATS), and read it
    through the JetStream API (any of the ``read_api`` subjects)."""
    out: dict[str, list[str]] = {"publish": [], "subscribe": [], "readThroughJetStream": []}
    for role, perms in roles.templates(SUBJECTS).items():
        if _allowed(perms.pub_allow, perms.pub_deny, subject):
            out["publish"].append(role)
        if _allowed(perms.sub_allow, perms.sub_deny, subject):
            out["subscribe"].append(role)
        if any(_allowed(perms.pub_allow, perms.pub_deny, api) for api in read_api):
            out["readThroughJetStream"].append(role)
    return {k: v for k, v in out.items() if v}


def _stream_reads(stream: str, consumer: str = "any") -> list[str]:
    return [
        f"{roles.JS_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"{roles.JS_API}.DIRECT.GET.{stream}",
    ]


# --- schemas --------------------------------------------------------------------------


def _struct_schema(struct: type) -> dict[str, Any]:
    """A msgspec Struct's JSON Schema, inlined (no ``$defs``)."""
    schema: dict[str, Any] = msgspec.json.schema(struct)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)  # type: ignore[no-any-return]


def _string(description: str, **more: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **more}


_ATTEMPT = _string("The attempt number, 1 for the first.", pattern="^[1-9][0-9]*$")


def _ce_headers(
    description: str,
    required: Mapping[str, dict[str, Any]],
    optional: Mapping[str, dict[str, Any]] = {},
) -> dict[str, Any]:
    """The headers of a binary-mode CloudEvent: the ``ce-`` attributes plus others."""
    props: dict[str, Any] = {
        "ce-specversion": {"type": "string", "const": "1.0"},
        "ce-id": _string("The event id (percent-encoded, as every ce- value)."),
        "ce-source": _string("A URI-reference naming the sender."),
        "ce-type": _string("The event type."),
    }
    props.update(required)
    props.update(optional)
    return {
        "type": "object",
        "description": description,
        "required": list(
            dict.fromkeys(["ce-specversion", "ce-id", "ce-source", "ce-type", *required])
        ),
        "properties": props,
    }


_JSON_CT = {"Content-Type": _string("Mirrors ce-datacontenttype.", const=tasks.JSON)}
_MSG_ID = tasks.MSG_ID_HEADER
_CE_DATA_CT = {"ce-datacontenttype": _string("The data's media type.", const=tasks.JSON)}
_TRACE = {
    f"ce-{tasks.TRACEPARENT}": _string("W3C trace context of the run's trace."),
    tasks.TRACEPARENT: _string("The same trace context as a plain header."),
}

CLOUDEVENT_STRUCTURED: dict[str, Any] = {
    "type": "object",
    "description": "A CloudEvent 1.0 in structured mode (JSON event format).",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"const": "1.0"},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": "string"},
        "time": {"type": "string", "format": "date-time"},
        "datacontenttype": {"type": "string"},
        "data": {},
        "data_base64": {"type": "string"},
    },
    "additionalProperties": {"type": ["string", "integer", "boolean"]},
}


def _example(name: str, headers: dict[str, str], payload: bytes) -> dict[str, Any]:
    text = payload.decode()
    body: Any = msgspec.json.decode(payload) if text else None
    out: dict[str, Any] = {"name": name, "headers": headers}
    if body is not None:
        out["payload"] = body
    return out


def _messages() -> dict[str, Any]:
    s = SUBJECTS
    action_id = f"{_RUN}:3"
    req_headers, req_payload = tasks.encode_request(
        run_id=_RUN,
        action_id=action_id,
        capability=_CAP,
        attempt=2,
        data={"diff": "..."},
        time=_TIME,
        deadline="2026-01-01T12:05:00.000Z",
        token=_TOKEN.token(_CAP, _RUN, action_id, 2),
    )
    request = tasks.TaskRequest.from_event(
        CloudEvent(
            id=action_id,
            source=tasks.ORCHESTRATOR_SOURCE,
            type=tasks.TASK_REQUESTED,
            subject=_RUN,
            time=_TIME,
            extensions={"runid": _RUN, "actionid": action_id, "attempt": "2"},
        ),
        _CAP,
        req_headers,
    )

    def answer(type_: str, data: Any) -> tuple[dict[str, str], bytes]:
        event = tasks.answer_event(
            run_id=_RUN,
            action_id=action_id,
            attempt=2,
            event_id=f"{action_id}.2.result",
            source=tasks.agent_source("review-agent"),
            type=type_,
            data=data,
            time=_TIME,
        )
        return tasks.encode_result(event, token=request.token)

    failed_type, failed_data = tasks.failure(
        ErrorClass.AGENT_ERROR, "the diff is empty", retryable=False, code="empty_diff"
    )
    cancel_headers, cancel_payload = tasks.encode_cancel(
        run_id=_RUN, action_id=action_id, attempt=2, time=_TIME
    )
    event_headers, event_payload = encode_binary(
        CloudEvent(
            id="42",
            source="https://shop.example/orders",
            type=_EVENT_TYPE,
            time=_TIME,
            datacontenttype=tasks.JSON,
            data={"order": 42},
        )
    )
    event_headers[_MSG_ID] = "https://shop.example/orders:42"
    beat = tasks.Heartbeat(
        name="review-agent",
        instance=_INSTANCE,
        capabilities=[_CAP],
        concurrency=4,
        in_flight=1,
        started_at=_TIME,
        heartbeat_at=_TIME,
        host="host1",
        pid=4242,
    )
    answer_ext = {
        f"ce-{tasks.RUN_ID}": _string("The run, as in the request (must equal the subject's)."),
        f"ce-{tasks.ACTION_ID}": _string("The request's ce-actionid."),
        f"ce-{tasks.ATTEMPT}": _ATTEMPT
        | {
            "description": "The request's ce-attempt. Required: an answer without it is "
            "dead-lettered (answer-incomplete), so no answer is taken for another attempt."
        },
        tasks.TOKEN_HEADER: _string(
            "The request's Interlock-Token, echoed unchanged. Required: without it, or with "
            "one that does not verify for this capability, run, action and attempt, the "
            "answer is dead-lettered (answer-token)."
        ),
        _MSG_ID: _string(
            "`<ce-source>:<ce-id>`: an answer sent twice (say, after a lost publish ack) "
            "is stored once."
        ),
    }
    answer_headers = _ce_headers(
        "Binary-mode CloudEvent (structured mode is accepted too). ce-id is "
        "`<actionid>.<attempt>.result`; ce-source `interlock://agent/<worker name>`; "
        "ce-subject the run id.",
        answer_ext,
        {"ce-subject": _string("The run id."), "ce-time": _string("RFC 3339.")}
        | _CE_DATA_CT
        | _JSON_CT
        | _TRACE,
    )
    completed_headers, completed_payload = answer(tasks.TASK_COMPLETED, {"score": 8})
    emitted_headers, emitted_payload = answer("review.approved", {"score": 9})
    failed_headers, failed_payload = answer(failed_type, failed_data)
    runlog_refs = [{"$ref": f"runlog/{record}.schema.json"} for record in _record_types()]
    return {
        "InboundEvent": {
            "name": "InboundEvent",
            "title": "An event from outside",
            "summary": "Any CloudEvent 1.0, binary or structured mode, published with "
            "JetStream. Its subject's last tokens are its type.",
            "description": "Starts the runs of workflows that trigger on its type, goes to "
            "the runs correlated with it, or (with a `runid` extension) to that run. "
            "`Nats-Msg-Id` `<source>:<id>` makes a repeat a no-op within the stream's "
            "duplicate window. Events carrying `actionid` or `timerid`, or of type "
            "`io.interlock.timer.fired`, are refused (dead letter `reserved-attribute`).",
            "headers": {
                "type": "object",
                "properties": {
                    "ce-specversion": {"const": "1.0"},
                    "ce-runid": _string("Deliver to this run only."),
                    "Content-Type": _string(
                        f"`{STRUCTURED_CONTENT_TYPE}` for structured mode; otherwise "
                        "binary mode (the ce- headers)."
                    ),
                    _MSG_ID: _string("`<source>:<id>` (recommended): dedupe."),
                },
            },
            "payload": {},
            "examples": [_example("binary mode", event_headers, event_payload)],
        },
        "RunLogBatch": {
            "name": "RunLogBatch",
            "title": "Records of a run log",
            "contentType": BATCH_CONTENT_TYPE,
            "summary": "One decision's records, appended atomically: a JSON array of "
            "run-log records (CloudEvents, structured mode).",
            "description": "Appended with `Nats-Expected-Last-Subject-Sequence` (optimistic "
            "concurrency). The record types are listed in runlog/catalogue.md.",
            "headers": {
                "type": "object",
                "properties": {"Content-Type": {"const": BATCH_CONTENT_TYPE}},
            },
            "payload": {"type": "array", "minItems": 1, "items": {"oneOf": runlog_refs}},
        },
        "TaskRequest": {
            "name": "TaskRequest",
            "title": "A task for a capability",
            "summary": f"Binary-mode CloudEvent of type `{tasks.TASK_REQUESTED}`; the "
            "payload is the action's rendered input (a JSON object).",
            "description": "ce-id is the action id (`<run id>:<log position>`); "
            "`Nats-Msg-Id` `<actionid>.<attempt>` makes a repeated dispatch of one attempt "
            "a no-op. A retry is a new message with the next ce-attempt and a new token.",
            "headers": _ce_headers(
                "ce- values are percent-encoded (CloudEvents NATS binding).",
                {
                    "ce-type": {"const": tasks.TASK_REQUESTED},
                    "ce-subject": _string("The run id."),
                    f"ce-{tasks.RUN_ID}": _string("The run id (answer to this run)."),
                    f"ce-{tasks.ACTION_ID}": _string("The action id, echoed in the answer."),
                    f"ce-{tasks.CAPABILITY}": _string("The capability asked for."),
                    f"ce-{tasks.ATTEMPT}": _ATTEMPT,
                    tasks.TOKEN_HEADER: _string(
                        "base64url (unpadded) HMAC-SHA256, under a key only the orchestrator "
                        "holds, of `<capability>\\n<run id>\\n<action id>\\n<attempt>`. "
                        "Opaque to workers: echo it in the answer."
                    ),
                    _MSG_ID: _string("`<actionid>.<attempt>`."),
                },
                {
                    "ce-time": _string("When this attempt was requested (RFC 3339)."),
                    f"ce-{tasks.DEADLINE}": _string(
                        "When the orchestrator stops waiting for this attempt (RFC 3339 UTC); "
                        "absent when the action has no timeout. Past it, answer task.failed "
                        "with class timeout."
                    ),
                }
                | _CE_DATA_CT
                | _JSON_CT
                | _TRACE,
            ),
            "payload": {
                "type": "object",
                "description": "The action's input; the capability's AgentDef input_schema "
                "says more.",
            },
            "examples": [_example("attempt 2", req_headers, req_payload)],
        },
        "TaskCompleted": {
            "name": "TaskCompleted",
            "title": "A task done",
            "summary": f"ce-type `{tasks.TASK_COMPLETED}`; the payload is the result.",
            "headers": answer_headers
            | {
                "properties": answer_headers["properties"]
                | {"ce-type": {"const": "task.completed"}}
            },
            "payload": {
                "type": "object",
                "description": "The result (checked against the AgentDef's output_schema: "
                "a mismatch fails the action as schema_error).",
            },
            "examples": [_example("completed", completed_headers, completed_payload)],
        },
        "TaskEmitted": {
            "name": "TaskEmitted",
            "title": "A task done, answered with an event type of the agent's choosing",
            "summary": "Any ce-type other than the reserved ones; the workflow's `on` "
            "matches it (e.g. `review.approved`).",
            "headers": answer_headers,
            "payload": {"description": "Any JSON value."},
            "examples": [_example("emitted", emitted_headers, emitted_payload)],
        },
        "TaskFailed": {
            "name": "TaskFailed",
            "title": "A task failed",
            "summary": f"ce-type `{tasks.TASK_FAILED}`, with the error's class, message, "
            "whether it may be retried, and an optional code.",
            "headers": answer_headers
            | {"properties": answer_headers["properties"] | {"ce-type": {"const": "task.failed"}}},
            "payload": _struct_schema(tasks.TaskFailed),
            "x-error-classes": [str(c) for c in ErrorClass],
            "examples": [_example("failed", failed_headers, failed_payload)],
        },
        "CancelNotice": {
            "name": "CancelNotice",
            "title": "Stop working on an action",
            "summary": f"Binary-mode CloudEvent of type `{tasks.TASK_CANCEL}`, no payload.",
            "description": "With ce-attempt: that attempt only (a timed-out attempt). "
            "Without: every attempt of the action requested before ce-time. Not stored: a "
            "worker that was not listening never hears it, and a task still queued when the "
            "notice came is taken later; a worker should remember recent notices (by action "
            "id) and answer such a task `cancelled` at once.",
            "headers": _ce_headers(
                "ce- values are percent-encoded.",
                {
                    "ce-type": {"const": tasks.TASK_CANCEL},
                    f"ce-{tasks.RUN_ID}": _string("The run."),
                    f"ce-{tasks.ACTION_ID}": _string("The action to stop."),
                },
                {
                    f"ce-{tasks.ATTEMPT}": _ATTEMPT,
                    "ce-time": _string("When the notice was decided (RFC 3339)."),
                    "ce-subject": _string("The run id."),
                },
            ),
            "payload": {"description": "Empty."},
            "examples": [_example("one attempt", cancel_headers, cancel_payload)],
        },
        "Heartbeat": {
            "name": "Heartbeat",
            "title": "A worker is alive",
            "contentType": tasks.JSON,
            "summary": "A KV put: a JetStream publish of the JSON value to "
            "`$KV.<workers bucket>.<key>`.",
            "payload": _struct_schema(tasks.Heartbeat),
            "examples": [
                {"name": "one worker", "payload": msgspec.to_builtins(beat)},
            ],
        },
        "TimerSchedule": {
            "name": "TimerSchedule",
            "title": "A durable timer set",
            "contentType": tasks.JSON,
            "summary": "A JetStream scheduled message (nats-server 2.12): the server "
            "publishes it to its target subject when due.",
            "headers": {
                "type": "object",
                "required": ["Nats-Schedule", "Nats-Schedule-Target", _MSG_ID],
                "properties": {
                    "Nats-Schedule": _string("`@at <RFC 3339 time>`."),
                    "Nats-Schedule-Target": _string(f"`{s.prefix}.timers.fired.<run id>`."),
                    _MSG_ID: _string("`timer:<timer id>`."),
                },
            },
            "payload": _struct_schema(tasks.TimerBody),
        },
        "TimerFired": {
            "name": "TimerFired",
            "title": "A durable timer went off",
            "contentType": tasks.JSON,
            "payload": _struct_schema(tasks.TimerBody),
        },
        "DeadLetter": {
            "name": "DeadLetter",
            "title": "A message refused",
            "summary": "The refused message's payload, its headers (less the `Nats-` "
            "ones) and why.",
            "headers": {
                "type": "object",
                "required": [
                    "Interlock-Dead-Letter-Reason",
                    "Interlock-Dead-Letter-Detail",
                    "Interlock-Dead-Letter-Subject",
                ],
                "properties": {
                    "Interlock-Dead-Letter-Reason": _string(
                        "A slug, also the subject's last token (answer-token, "
                        "answer-incomplete, answer-stale-attempt, bad-json, ...)."
                    ),
                    "Interlock-Dead-Letter-Detail": _string(
                        "A sentence for people (at most 1000 characters)."
                    ),
                    "Interlock-Dead-Letter-Subject": _string("Where the message was sent."),
                    "Interlock-Dead-Letter-Worker": _string(
                        "On an agent's own dead letters: the worker's name."
                    ),
                },
            },
            "payload": {"description": "The refused message's payload, unchanged."},
        },
    }


def _record_types() -> list[str]:
    from interlock.core import events

    return list(events.data_schemas())


# --- the document ---------------------------------------------------------------------


def _param(description: str) -> dict[str, Any]:
    return {"description": description}


def _stream(name: str) -> dict[str, Any]:
    """The settings of a stream (from :func:`provision.desired_configs`) a reader cares
    about."""
    for config in provision.desired_configs(SUBJECTS):
        if config["name"] == name:
            out = {
                "name": name,
                "retention": config["retention"],
                "duplicateWindowSeconds": config["duplicate_window"] // 1_000_000_000,
            }
            if config.get("max_age"):
                out["maxAgeSeconds"] = config["max_age"] // 1_000_000_000
            return out
    raise KeyError(name)


def _ref(message: str) -> dict[str, str]:
    return {"$ref": f"#/components/messages/{message}"}


def _channel(
    address: str,
    description: str,
    messages: Iterable[str],
    params: Mapping[str, str],
    *,
    sample: str,
    read_api: Iterable[str] = (),
    stream: str | None = None,
    delivery: str,
) -> dict[str, Any]:
    channel: dict[str, Any] = {
        "address": address,
        "description": description,
        "messages": {m[0].lower() + m[1:]: _ref(m) for m in messages},
    }
    if params:
        channel["parameters"] = {k: _param(v) for k, v in params.items()}
    channel["x-interlock-permissions"] = _who(sample, read_api=read_api)
    if stream is not None:
        channel["x-interlock-stream"] = _stream(stream)
    channel["x-interlock-delivery"] = delivery
    return channel


def _channels() -> dict[str, Any]:
    s = SUBJECTS
    p = s.prefix
    cap_desc = (
        "The capability name as written in the AgentDef (dot-separated words: it may span "
        "several subject tokens)."
    )
    run_desc = "The run id (one subject token)."
    workers = s.workers_bucket
    return {
        "inboundEvents": _channel(
            f"{p}.events.{{type}}",
            "CloudEvents from outside: triggers, signals, correlated events.",
            ["InboundEvent"],
            {"type": "The event's type (dot-separated words)."},
            sample=s.event(_EVENT_TYPE),
            read_api=_stream_reads(s.events_stream),
            stream=s.events_stream,
            delivery="Stored; publish with JetStream and wait for the ack. Read by the "
            "orchestrator's durable consumer `ingress`.",
        ),
        "runLog": _channel(
            f"{p}.runs.{{run_id}}",
            "A run's log, the truth about it: never a work queue, written only by the "
            "orchestrator (and the operator's CLI for start and cancel).",
            ["RunLogBatch"],
            {"run_id": run_desc},
            sample=s.run(_RUN),
            read_api=_stream_reads(s.runs_stream),
            stream=s.runs_stream,
            delivery="Stored; read with direct gets (batched) or a consumer.",
        ),
        "taskRequests": _channel(
            f"{p}.cap.{{capability}}",
            "Tasks for the workers of one capability. Agents never subscribe to it: they "
            "pull from the capability's durable consumer (see the receiveTask operation).",
            ["TaskRequest"],
            {"capability": cap_desc},
            sample=s.capability(_CAP),
            read_api=[
                f"{roles.JS_API}.CONSUMER.MSG.NEXT.{s.tasks_stream}.{tasks.consumer_name(_CAP)}"
            ],
            stream=s.tasks_stream,
            delivery="Work queue: each task is delivered to one worker at a time and "
            "removed when acknowledged; unacknowledged after the consumer's ack wait, it is "
            "delivered again (to any worker).",
        ),
        "answers": _channel(
            f"{p}.results.{{capability}}.{{run_id}}",
            "Answers to tasks: completed, emitted (the agent's own event type) or failed. "
            "The orchestrator appends one only if it answers an attempt the run still "
            "awaits, of that capability, and the token verifies; otherwise it is "
            "dead-lettered and never reaches the log.",
            ["TaskCompleted", "TaskEmitted", "TaskFailed"],
            {"capability": cap_desc, "run_id": run_desc},
            sample=s.result(_CAP, _RUN),
            read_api=_stream_reads(s.results_stream),
            stream=s.results_stream,
            delivery="Stored; publish with JetStream and wait for the ack before "
            "acknowledging the task.",
        ),
        "cancelNotices": _channel(
            f"{p}.control.{{capability}}.{{run_id}}",
            "Stop working on an action: the run was cancelled, left the state, or the "
            "attempt timed out.",
            ["CancelNotice"],
            {"capability": cap_desc, "run_id": run_desc},
            sample=s.control(_CAP, _RUN),
            delivery="Core NATS, not stored, at most once: subscribe to "
            f"`{p}.control.<capability>.*` before pulling tasks.",
        ),
        "heartbeats": _channel(
            f"$KV.{workers}.{{capability_token}}.{{instance}}",
            f"Live workers: the KV bucket `{workers}`, one key per capability a worker "
            f"process serves. The bucket forgets a key after {provision.WORKERS_TTL_S:g} s "
            "without a put: put every few seconds (the Python SDK: 5 s) and delete the keys "
            "(a put with header `KV-Operation: DEL`) on a clean shutdown.",
            ["Heartbeat"],
            {
                "capability_token": "The capability with every character other than "
                "letters, digits, `_` and `-` as `_` (`acme.review` -> `acme_review`).",
                "instance": "The process's instance id, as one token in the same way.",
            },
            sample=f"$KV.{workers}.{tasks.heartbeat_key(_CAP, _INSTANCE)}",
            read_api=_stream_reads(f"KV_{workers}"),
            stream=f"KV_{workers}",
            delivery="Stored, last value per key; read by the orchestrator and `interlock agents`.",
        ),
        "timerSchedules": _channel(
            f"{p}.timers.schedule.{{timer_id}}",
            "Durable timers set by the orchestrator (the run's deadlines and backoffs).",
            ["TimerSchedule"],
            {"timer_id": "The timer's id as one token."},
            sample=s.timer_schedule("t1"),
            read_api=_stream_reads(s.timers_stream),
            stream=s.timers_stream,
            delivery="Stored until due; the server then publishes the target.",
        ),
        "timersFired": _channel(
            f"{p}.timers.fired.{{run_id}}",
            "Timers that went off, for the orchestrator's durable consumer `timers`.",
            ["TimerFired"],
            {"run_id": run_desc},
            sample=s.timer_fired(_RUN),
            read_api=_stream_reads(s.timers_stream),
            stream=s.timers_stream,
            delivery="Work queue, read by the orchestrator only.",
        ),
        "deadLetters": _channel(
            f"{p}.dlq.{{reason}}",
            "Messages the orchestrator refused (invalid CloudEvents, forged or late "
            "answers, events it could not route...), kept for `interlock dlq`.",
            ["DeadLetter"],
            {"reason": "Why, as a slug."},
            sample=s.dead_letter("answer-token"),
            read_api=_stream_reads(s.dead_letter_stream),
            stream=s.dead_letter_stream,
            delivery="Stored; read and redriven by the operator.",
        ),
        "agentDeadLetters": _channel(
            f"{p}.dlq.agent.{{capability}}.{{reason}}",
            "Tasks a worker could not answer at all (not a CloudEvent, no run id); the "
            "worker then terminates the task (`+TERM`).",
            ["DeadLetter"],
            {"capability": cap_desc, "reason": "Why, as a slug."},
            sample=s.agent_dead_letter(_CAP, "no-run-id"),
            read_api=_stream_reads(s.dead_letter_stream),
            stream=s.dead_letter_stream,
            delivery="Stored (the same stream as the orchestrator's dead letters).",
        ),
    }


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
            "+ACK": "after the answer is stored (its publish acknowledged)",
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
        "appendRunLog": op("send", "runLog", "The orchestrator appends a decision's records."),
        "readRunLog": op("receive", "runLog", "The orchestrator and the operator read logs."),
        "dispatchTask": op("send", "taskRequests", "The orchestrator dispatches a task."),
        "receiveTask": op(
            "receive",
            "taskRequests",
            "A worker pulls tasks of its capability from the shared durable consumer.",
            **{"x-interlock-consumer": _consumer()},
        ),
        "sendAnswer": op(
            "send",
            "answers",
            "A worker answers a task: echo ce-runid, ce-actionid, ce-attempt and the "
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


DESCRIPTION = f"""\
How Interlock's parties talk over NATS JetStream: an orchestrator, operators (the CLI),
agent workers (one or more capabilities each) and event publishers. Generated by
`python -m interlock.contracts_gen` from the code; do not edit by hand.

Subjects start with the installation's prefix (`{SUBJECTS.prefix}` here; streams
`{SUBJECTS.prefix.upper()}_*`, buckets `{SUBJECTS.prefix}_*` follow it). Every party connects
with a creds file (decentralized JWT) and must take its replies on `_INBOX.<its user public
key>` (the JWT's `sub`), the only inbox its credential may subscribe to. Each channel's
`x-interlock-permissions` lists the roles whose credentials allow publishing to it,
subscribing to it, and reading it through the JetStream API, worked out from the roles'
permissions (`components.x-interlock-roles`, with `{{capability}}`,
`{{capability_token}}`, `{{events}}` and `{{user}}` placeholders).

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
        "channels": _channels(),
        "operations": _operations(),
        "components": {"messages": _messages(), "x-interlock-roles": _roles_component()},
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
