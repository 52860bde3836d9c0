"""The messages of the NATS wire contract, for the AsyncAPI document: each message's
headers and payload as JSON Schema, and examples that are the encoders' own output for a
set of sample values (a run, an action, a capability, a worker). The channels that carry
them are in :mod:`interlock.contracts.channels`; the document is
:mod:`interlock.contracts.wire`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from interlock.contracts.examples import SUBJECTS, Examples, examples
from interlock.core.events import BATCH_CONTENT_TYPE
from interlock.core.vocabulary import TASK_COMPLETED, TASK_FAILED, ErrorClass
from interlock.transport import tasks
from interlock.transport.cloudevents import STRUCTURED_CONTENT_TYPE
from interlock.transport.logmac import MAC_HEADER


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


def _example(name: str, headers: dict[str, str], payload: bytes) -> dict[str, Any]:
    text = payload.decode()
    body: Any = msgspec.json.decode(payload) if text else None
    out: dict[str, Any] = {"name": name, "headers": headers}
    if body is not None:
        out["payload"] = body
    return out


def _answer_headers() -> dict[str, Any]:
    """The headers of an agent's answer (any of its three kinds)."""
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
    return _ce_headers(
        "Binary-mode CloudEvent (structured mode is accepted too). ce-id is "
        "`<actionid>.<attempt>.result`; ce-source `interlock://agent/<worker name>`; "
        "ce-subject the run id.",
        answer_ext,
        {"ce-subject": _string("The run id."), "ce-time": _string("RFC 3339.")}
        | _CE_DATA_CT
        | _JSON_CT
        | _TRACE,
    )


def messages() -> dict[str, Any]:
    """Every message of the contract, by name."""
    ex = examples()
    return {
        "InboundEvent": _inbound_event(ex),
        "RunLogBatch": _run_log_batch(),
        "TaskRequest": _task_request(ex),
        "TaskCompleted": _task_completed(ex),
        "TaskEmitted": _task_emitted(ex),
        "TaskFailed": _task_failed(ex),
        "AnswerReply": _answer_reply(),
        "CancelNotice": _cancel_notice(ex),
        "Heartbeat": _heartbeat(ex),
        "TimerSchedule": _timer_schedule(),
        "TimerFired": _timer_fired(),
        "DeadLetter": _dead_letter(),
    }


_BY_REFERENCE = (
    "A payload over the installation's threshold (256 KiB of JSON by default) travels by "
    'reference instead: `{"$object": {"bucket", "name", "size", "digest"}}`, the JSON '
    "stored in a JetStream object bucket (`digest`: `SHA-256=` and the base64url of the "
    "bytes' SHA-256, as the object store writes it). A task input's bucket is "
    "`<prefix>_in_<capability token>`, read by direct gets; an answer's or an event's is "
    "the sender's own (its credential's `objects:` tag). A reference whose object is "
    "missing, over the bound (64 MiB by default) or not of that size and digest is "
    'refused (dead letter `bad-object`). docs/agents-any-language.md, "Large payloads, '
    'by reference", spells out the reads and writes.'
)


def _inbound_event(ex: Examples) -> dict[str, Any]:
    return {
        "name": "InboundEvent",
        "title": "An event from outside",
        "summary": "Any CloudEvent 1.0, binary or structured mode, published with "
        "JetStream. Its subject's last tokens are its type.",
        "description": "On `<prefix>.events.<type>`: starts the runs of workflows "
        "that trigger on its type and goes to the runs correlated with it. On "
        "`<prefix>.events.@run.<run_id>.<type>` (which publishers may not publish): goes "
        "to that run only. Its type must be its subject's (dead letter `type-mismatch`); "
        "a `runid` extension is honoured only on a run's subject and must name it "
        "(elsewhere dead letter `runid-refused`, else `runid-mismatch`). "
        "`Nats-Msg-Id` `<source>:<id>` makes a repeat a no-op within the stream's "
        "duplicate window. Events carrying `actionid` or `timerid`, or of type "
        "`io.interlock.timer.fired`, `task.completed` or `task.failed`, are refused "
        "(dead letter `reserved-attribute`). " + _BY_REFERENCE,
        "headers": {
            "type": "object",
            "properties": {
                "ce-specversion": {"const": "1.0"},
                "ce-runid": _string(
                    "Only on a run's subject (`@run.<run_id>`), which it must name."
                ),
                "Content-Type": _string(
                    f"`{STRUCTURED_CONTENT_TYPE}` for structured mode; otherwise "
                    "binary mode (the ce- headers)."
                ),
                _MSG_ID: _string("`<source>:<id>` (recommended): dedupe."),
            },
        },
        "payload": {},
        "examples": [_example("binary mode", ex.event_headers, ex.event_payload)],
    }


def _run_log_batch() -> dict[str, Any]:
    runlog_refs = [{"$ref": f"runlog/{record}.schema.json"} for record in _record_types()]
    return {
        "name": "RunLogBatch",
        "title": "Records of a run log",
        "contentType": BATCH_CONTENT_TYPE,
        "summary": "One decision's records, appended atomically: a JSON array of "
        "run-log records (CloudEvents, structured mode).",
        "description": "Appended with `Nats-Expected-Last-Subject-Sequence` (optimistic "
        f"concurrency) and `{MAC_HEADER}`: base64url, unpadded, of HMAC-SHA256 under the "
        "installation's log key (secrets bucket, key `shared.log-key`) of the subject, a "
        "newline and the payload. A reader skips (and reports) any message of the subject "
        "whose MAC does not check out. The record types are listed in runlog/catalogue.md.",
        "headers": {
            "type": "object",
            "properties": {
                "Content-Type": {"const": BATCH_CONTENT_TYPE},
                MAC_HEADER: {"type": "string", "pattern": "^[A-Za-z0-9_-]{43}$"},
            },
            "required": [MAC_HEADER],
        },
        "payload": {"type": "array", "minItems": 1, "items": {"oneOf": runlog_refs}},
    }


def _task_request(ex: Examples) -> dict[str, Any]:
    return {
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
            "description": "The action's input; the capability's AgentDef input_schema says "
            "more. " + _BY_REFERENCE,
        },
        "examples": [_example("attempt 2", ex.req_headers, ex.req_payload)],
    }


def _task_completed(ex: Examples) -> dict[str, Any]:
    answer_headers = _answer_headers()
    return {
        "name": "TaskCompleted",
        "title": "A task done",
        "summary": f"ce-type `{TASK_COMPLETED}`; the payload is the result.",
        "headers": answer_headers
        | {"properties": answer_headers["properties"] | {"ce-type": {"const": "task.completed"}}},
        "payload": {
            "type": "object",
            "description": "The result (checked against the AgentDef's output_schema: "
            "a mismatch fails the action as schema_error). " + _BY_REFERENCE,
        },
        "examples": [_example("completed", ex.completed_headers, ex.completed_payload)],
    }


def _task_emitted(ex: Examples) -> dict[str, Any]:
    answer_headers = _answer_headers()
    return {
        "name": "TaskEmitted",
        "title": "A task done, answered with an event type of the agent's choosing",
        "summary": "Any ce-type other than the reserved ones; the workflow's `on` "
        "matches it (e.g. `review.approved`).",
        "headers": answer_headers,
        "payload": {"description": "Any JSON value."},
        "examples": [_example("emitted", ex.emitted_headers, ex.emitted_payload)],
    }


def _task_failed(ex: Examples) -> dict[str, Any]:
    answer_headers = _answer_headers()
    return {
        "name": "TaskFailed",
        "title": "A task failed",
        "summary": f"ce-type `{TASK_FAILED}`, with the error's class, message, "
        "whether it may be retried, an optional code, and an optional retry-after (the "
        "earliest the next attempt may go: seconds, or an RFC 3339 instant). The answer to "
        "a cancelled attempt, sent once its work has stopped, gives back its concurrency "
        f"slot; with code `{tasks.HANDLER_RUNNING}` (the work still runs) it does not.",
        "headers": answer_headers
        | {"properties": answer_headers["properties"] | {"ce-type": {"const": "task.failed"}}},
        "payload": _struct_schema(tasks.TaskFailed),
        "x-error-classes": [str(c) for c in ErrorClass],
        "examples": [_example("failed", ex.failed_headers, ex.failed_payload)],
    }


def _cancel_notice(ex: Examples) -> dict[str, Any]:
    return {
        "name": "CancelNotice",
        "title": "Stop working on an action",
        "summary": f"Binary-mode CloudEvent of type `{tasks.TASK_CANCEL}`, no payload.",
        "description": "With ce-attempt: that attempt only (a timed-out attempt). "
        "Without: attempt 1, and every other attempt whose task's ce-time is before the "
        "notice's ce-time (a retry requested after a timeout's notice runs normally). Not "
        "stored: a worker that was not listening never hears it, and a task still queued "
        "when the notice came is taken later; a worker should remember recent notices (by "
        "action id) and answer such a task `cancelled` at once. An answer to a cancelled "
        "attempt is dropped as late (reply `late`), never dead-lettered.",
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
        "examples": [_example("one attempt", ex.cancel_headers, ex.cancel_payload)],
    }


def _heartbeat(ex: Examples) -> dict[str, Any]:
    return {
        "name": "Heartbeat",
        "title": "A worker is alive",
        "contentType": tasks.JSON,
        "summary": "A KV put: a JetStream publish of the JSON value to "
        "`$KV.<workers bucket>.<key>`.",
        "payload": _struct_schema(tasks.Heartbeat),
        "examples": [
            {"name": "one worker", "payload": msgspec.to_builtins(ex.beat)},
        ],
    }


def _timer_schedule() -> dict[str, Any]:
    return {
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
                "Nats-Schedule-Target": _string(f"`{SUBJECTS.prefix}.timers.fired.<run id>`."),
                _MSG_ID: _string("`timer:<timer id>`."),
            },
        },
        "payload": _struct_schema(tasks.TimerBody),
    }


def _timer_fired() -> dict[str, Any]:
    return {
        "name": "TimerFired",
        "title": "A durable timer went off",
        "contentType": tasks.JSON,
        "payload": _struct_schema(tasks.TimerBody),
    }


def _answer_reply() -> dict[str, Any]:
    return {
        "name": "AnswerReply",
        "title": "What became of an answer sent by request",
        "summary": "No payload; the outcome is a header.",
        "headers": {
            "type": "object",
            "required": [tasks.ANSWER_HEADER],
            "properties": {
                tasks.ANSWER_HEADER: {
                    "type": "string",
                    "enum": [
                        tasks.ANSWER_RECORDED,
                        tasks.ANSWER_REFUSED,
                        tasks.ANSWER_LATE,
                        tasks.ANSWER_FAILED,
                    ],
                    "description": f"`{tasks.ANSWER_RECORDED}`: in the run's log (or for a "
                    f"run the orchestrator does not know: ignored). `{tasks.ANSWER_REFUSED}`: "
                    "dead-lettered, sending it again changes nothing. "
                    f"`{tasks.ANSWER_LATE}`: the run had stopped waiting for that attempt "
                    "itself (it cancelled the action, the attempt timed out, the run ended): "
                    "dropped, not dead-lettered; sending it again changes nothing. "
                    f"`{tasks.ANSWER_FAILED}`: not taken now; publish it to the results "
                    "stream.",
                },
                tasks.ANSWER_REASON_HEADER: _string(
                    "With `refused`: the dead letter's reason (answer-token, ...). With "
                    "`late`: action-cancelled, attempt-timed-out or run-ended."
                ),
                tasks.ANSWER_DETAIL_HEADER: _string(
                    "With `refused`: what was wrong, for a person (the dead letter's "
                    "detail, which an agent's credential may not read): printable ASCII "
                    f"(other characters escaped), at most {tasks.ANSWER_DETAIL_MAX} "
                    "characters."
                ),
            },
        },
    }


def _dead_letter() -> dict[str, Any]:
    return {
        "name": "DeadLetter",
        "title": "A message refused",
        "summary": "The refused message's payload, its headers (less the `Nats-` ones) and why.",
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
    }


def _record_types() -> list[str]:
    from interlock.core import events

    return list(events.data_schemas())
