"""The channels of the NATS wire contract, for the AsyncAPI document: each subject, its
parameters, its stream, and who may publish to it, subscribe to it and read it through the
JetStream API, worked out by matching a sample subject against every role's NATS
permissions (:func:`interlock.auth.roles.templates`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from interlock.auth import roles
from interlock.contracts.examples import CAPABILITY, EVENT_TYPE, INSTANCE, RUN, SUBJECTS
from interlock.core.ids import capability_token
from interlock.transport import streamconfigs, tasks
from interlock.transport.pulling import subject_matches


def _fill(item: str) -> str:
    return (
        item.replace("{capability_token}", capability_token(CAPABILITY))
        .replace("{capability}", CAPABILITY)
        .replace("{events}", EVENT_TYPE)
        .replace("{user}", "UKEY")
    )


def _allowed(allow: Iterable[str], deny: Iterable[str], subject: str) -> bool:
    return any(subject_matches(_fill(a), subject) for a in allow) and not any(
        subject_matches(_fill(d), subject) for d in deny
    )


def _who(subject: str, *, read_api: Iterable[str] = ()) -> dict[str, list[str]]:
    """Which roles may publish to ``subject``, subscribe to it (core NATS), and read it
    through the JetStream API (any of the ``read_api`` subjects)."""
    out: dict[str, list[str]] = {"publish": [], "subscribe": [], "readThroughJetStream": []}
    # An agent's account imports the same API subjects under its own prefix.
    read_api = [*read_api, *(a.replace(roles.JS_API, SUBJECTS.party_js_api, 1) for a in read_api)]
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


def _param(description: str) -> dict[str, Any]:
    return {"description": description}


def _seconds(ns: int) -> int | float:
    """Nanoseconds as seconds, whole where they are (120, 0.1)."""
    return ns // 1_000_000_000 if ns % 1_000_000_000 == 0 else ns / 1_000_000_000


def _stream(name: str) -> dict[str, Any]:
    """The settings of a stream (from :func:`streamconfigs.desired_configs`) a reader cares
    about."""
    for config in streamconfigs.desired_configs(SUBJECTS):
        if config["name"] == name:
            out = {
                "name": name,
                "retention": config["retention"],
                "duplicateWindowSeconds": _seconds(config["duplicate_window"]),
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


def channels() -> dict[str, Any]:
    """Every channel of the contract, by name."""
    return {**_run_channels(), **_worker_channels()}


def _run_channels() -> dict[str, Any]:
    """Where events come in, run logs go, and tasks, answers and cancel notices travel."""
    s = SUBJECTS
    p = s.prefix
    cap_desc = (
        "The capability name as written in the AgentDef (dot-separated words: it may span "
        "several subject tokens)."
    )
    run_desc = "The run id (one subject token)."
    return {
        "inboundEvents": _channel(
            f"{p}.events.{{type}}",
            "CloudEvents from outside: triggers, signals, correlated events.",
            ["InboundEvent"],
            {"type": "The event's type (dot-separated words)."},
            sample=s.event(EVENT_TYPE),
            read_api=_stream_reads(s.events_stream),
            stream=s.events_stream,
            delivery="Stored; publish with JetStream and wait for the ack. Read by the "
            "orchestrator's durable consumer `ingress`.",
        ),
        "addressedEvents": _addressed_channel(),
        "runLog": _channel(
            f"{p}.runs.{{run_id}}",
            "A run's log, the truth about it: never a work queue, written only by the "
            "orchestrator (and, for start and cancel, the operator's CLI and the HTTP "
            "gateway).",
            ["RunLogBatch"],
            {"run_id": run_desc},
            sample=s.run(RUN),
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
            sample=s.capability(CAPABILITY),
            read_api=[
                f"{roles.JS_API}.CONSUMER.MSG.NEXT.{s.tasks_stream}.{tasks.consumer_name(CAPABILITY)}"
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
            "dead-lettered and never reaches the log. The way that works while no "
            "orchestrator is up (answerRequests is quicker while one is).",
            ["TaskCompleted", "TaskEmitted", "TaskFailed"],
            {"capability": cap_desc, "run_id": run_desc},
            sample=s.result(CAPABILITY, RUN),
            read_api=_stream_reads(s.results_stream),
            stream=s.results_stream,
            delivery="Stored; publish with JetStream and wait for the ack before "
            "acknowledging the task.",
        ),
        **_answer_request_channels(cap_desc, run_desc),
        "cancelNotices": _channel(
            f"{p}.control.{{capability}}.{{run_id}}",
            "Stop working on an action: the run was cancelled, left the state, or the "
            "attempt timed out.",
            ["CancelNotice"],
            {"capability": cap_desc, "run_id": run_desc},
            sample=s.control(CAPABILITY, RUN),
            delivery="Core NATS, not stored, at most once: subscribe to "
            f"`{p}.control.<capability>.*` before pulling tasks.",
        ),
    }


def _answer_request_channels(cap_desc: str, run_desc: str) -> dict[str, Any]:
    """Answers by request, and the orchestrator's replies."""
    s = SUBJECTS
    p = s.prefix
    return {
        "answerRequests": _channel(
            f"{p}.answer.{{capability}}.{{run_id}}",
            "Answers to tasks, the quick way: the same message as on the answers channel, "
            "sent as a request. The orchestrator checks it as it checks answers, appends "
            "it to the run's log, and only then replies (an AnswerReply). One stream write "
            "fewer per action than the answers channel, and no wait for a consumer's fetch.",
            ["TaskCompleted", "TaskEmitted", "TaskFailed"],
            {"capability": cap_desc, "run_id": run_desc},
            sample=s.answer(CAPABILITY, RUN),
            delivery="Core NATS request/reply, not stored: the orchestrator replicas serve "
            "it in one queue group (with several run-log partitions, the replica that holds "
            "the run's partition takes it). With no reply in time (say 5 s), no responders (no "
            "orchestrator up) or a reply `failed`, publish the same message on the "
            "answers channel; acknowledge the task only after a reply `recorded` or "
            "`refused`, or the stream's publish ack.",
        ),
        "answerReplies": {
            "address": None,
            "description": "The orchestrator's reply to an answer request, on the "
            "request's reply subject (the worker's own inbox).",
            "messages": {"answerReply": _ref("AnswerReply")},
            "x-interlock-permissions": _who("_INBOX.UKEY.reply"),
            "x-interlock-delivery": "Core NATS, one reply per request.",
        },
    }


def _worker_channels() -> dict[str, Any]:
    """Heartbeats, timers and dead letters."""
    s = SUBJECTS
    p = s.prefix
    cap_desc = (
        "The capability name as written in the AgentDef (dot-separated words: it may span "
        "several subject tokens)."
    )
    run_desc = "The run id (one subject token)."
    workers = s.workers_bucket
    return {
        "heartbeats": _channel(
            f"$KV.{workers}.{{capability_token}}.{{instance}}",
            f"Live workers: the KV bucket `{workers}`, one key per capability a worker "
            f"process serves. The bucket forgets a key after {streamconfigs.WORKERS_TTL_S:g} s "
            "without a put: put every few seconds (the Python SDK: 5 s) and delete the keys "
            "(a put with header `KV-Operation: DEL`) on a clean shutdown.",
            ["Heartbeat"],
            {
                "capability_token": "The capability with every character other than "
                "letters, digits, `_` and `-` as `_` (`acme.review` -> `acme_review`).",
                "instance": "The process's instance id, as one token in the same way.",
            },
            sample=f"$KV.{workers}.{tasks.heartbeat_key(CAPABILITY, INSTANCE)}",
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
            sample=s.timer_fired(RUN),
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
            sample=s.agent_dead_letter(CAPABILITY, "no-run-id"),
            read_api=_stream_reads(s.dead_letter_stream),
            stream=s.dead_letter_stream,
            delivery="Stored (the same stream as the orchestrator's dead letters).",
        ),
    }


def _addressed_channel() -> dict[str, Any]:
    """Events for one run (signals): a channel of its own, since publishers may not use it."""
    s = SUBJECTS
    return _channel(
        f"{s.prefix}.events.@run.{{run_id}}.{{type}}",
        "CloudEvents for one run (signals): `interlock signal`, the gateway's signal "
        "endpoint and signed webhooks' signals. Publishers may not publish here: an "
        "external system reaches runs only through triggers and correlation keys.",
        ["InboundEvent"],
        {"run_id": "The run id (one subject token).", "type": "The event's type."},
        sample=s.addressed(RUN, EVENT_TYPE),
        read_api=_stream_reads(s.events_stream),
        stream=s.events_stream,
        delivery="Stored in the events stream; read by the orchestrator's durable "
        "consumer `ingress` with every other inbound event.",
    )
