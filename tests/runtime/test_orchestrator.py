"""The orchestrator in-process against a real nats-server, with a real agent worker.

Each test runs the router, engine shell and relay (``Orchestrator``), a client as the CLI
uses it, and a worker of the test AgentDef (``support.runtime.make_worker``), each on its own
connection under a prefix of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from interlock.core import events as ev
from interlock.core.engine import Incoming, decide, derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.errors import InvalidInputs
from interlock.runtime.logstore import RunLog
from interlock.runtime.registry import Registry
from interlock.runtime.runs import Runs
from interlock.transport.cloudevents import (
    CloudEvent,
    decode_message,
    encode_binary,
    encode_structured,
)
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.runtime import (
    TIMEOUT,
    DeadLetters,
    Stack,
    consumer_settled,
    eventually,
    running_stack,
    yaml,
)

TRIGGERED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: on-push
    spec:
      inputs:
        repo: {type: string, required: true}
        n: {type: integer, default: 1}
      triggers:
        - event: com.example.push
          filter:
            branch: main
            $source: /git
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input:
                repo: "{{ inputs.repo }}"
                n: "{{ inputs.n }}"
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
          outputs:
            repo: "$.states.work.output.repo"
            n: "$.states.work.output.n"
    """
)

PARKED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: approval
    spec:
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - event: approval.granted
              goto: done
              set:
                by: "{{ data.by }}"
        done:
          type: terminal
          outputs:
            by: "{{ context.by }}"
            version: 1
    """
)


def push(
    event_id: str, *, branch: str = "main", source: str = "/git", data: Any = None
) -> CloudEvent:
    return CloudEvent(
        id=event_id,
        source=source,
        type="com.example.push",
        time="2026-11-01T10:00:00Z",
        datacontenttype="application/json",
        data={"branch": branch, "repo": "acme/app"} if data is None else data,
    )


async def publish(stack: Stack, event: CloudEvent, *, structured: bool = False) -> int:
    """Publish as an external system does (dedupe id = source + id), or, with a ``runid``,
    as the operator signals a run (on the run's own subject); the stream sequence."""
    headers, payload = encode_structured(event) if structured else encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    subject = stack.subjects.inbound(event.type, event.extensions.get("runid"))
    ack = await stack.js.publish(subject, payload, headers=headers)
    return int(ack.seq)


async def publish_raw(
    stack: Stack, subject_type: str, payload: bytes, headers: dict[str, str] | None = None
) -> int:
    ack = await stack.js.publish(stack.subjects.event(subject_type), payload, headers=headers)
    return int(ack.seq)


async def ingress_settled(stack: Stack, seq: int) -> Any:
    """Every event up to stream sequence ``seq`` has been handled and acked."""
    s = stack.subjects
    return await consumer_settled(stack.js, s.events_stream, "ingress", seq)


async def run_of(stack: Stack, workflow: str, event: CloudEvent) -> str:
    definition, _ = await stack.client.registry.latest(workflow)
    return derive_run_id(definition, event.source, event.id)


def types(records: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in records]


# --- triggers ----------------------------------------------------------------------------


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
async def test_a_trigger_event_starts_a_run_that_completes(
    nats_url: str, subjects: Subjects, structured: bool
) -> None:
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        event = push("e1")
        await publish(stack, event, structured=structured)
        run_id = await run_of(stack, "on-push", event)

        state = await stack.wait(run_id)

        assert state.status == "completed"
        assert state.outputs == {"repo": "acme/app", "n": 1}
        records = await stack.records(run_id)
        started = records[0]
        assert isinstance(started, ev.RunStarted)
        assert started.data.trigger is not None
        assert started.data.trigger["id"] == "e1"
        assert started.data.trigger["data"] == {"branch": "main", "repo": "acme/app"}
        assert types(records) == [
            "run.started",
            "state.entered",
            "action.requested",
            "action.completed",
            "transition.fired",
            "state.entered",
            "run.completed",
        ]
        assert stack.recorder.per_action() == {f"{run_id}:3": 1}
        [answered] = [r for r in records if isinstance(r, ev.ActionCompleted)]
        assert answered.data.source == "interlock://agent/testagent"  # the worker's name


BUMPED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: bumped
    spec:
      triggers:
        - event: com.example.bump
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - event: never.sent
              goto: done
        done:
          type: terminal
          outputs:
            version: 1
    """
)


async def test_an_event_published_right_after_an_apply_starts_the_version_applied(
    nats_url: str, subjects: Subjects
) -> None:
    """The ingress routes while it checks that it knows every workflow applied before
    the events it fetched were published: an event published as soon as an apply
    returns starts the workflow just applied, never the one before."""
    async with running_stack(nats_url, subjects, [BUMPED]) as stack:
        for version in range(2, 12):
            await stack.apply(BUMPED.replace("version: 1", f"version: {version}"))
            event = CloudEvent(
                id=f"bump-{version}", source="/test", type="com.example.bump", data={}
            )
            await publish(stack, event)
            run_id = await run_of(stack, "bumped", event)
            started = await eventually(lambda run_id=run_id: stack.records(run_id))
            assert isinstance(started[0], ev.RunStarted)
            assert started[0].data.version == version


async def test_actions_are_dispatched_once_their_request_is_appended_without_the_relay(
    nats_url: str, subjects: Subjects
) -> None:
    """The orchestrator that appended an action request publishes it at once: with its
    relay stopped, a run still goes from its trigger to its end (the answer comes by
    request), each action dispatched once."""
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        relay = stack.orchestrator._tasks[2]
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        event = push("e-early")
        await publish(stack, event)
        run_id = await run_of(stack, "on-push", event)

        state = await stack.wait(run_id)

        assert state.status == "completed"
        assert stack.recorder.per_action() == {f"{run_id}:3": 1}
        assert stack.orchestrator.counters["actions_dispatched"] == 1


async def test_a_task_request_is_made_ready_while_its_append_is_out(
    nats_url: str, subjects: Subjects
) -> None:
    """The records of a decision are told to ``on_appending`` once their append is sent
    and before its acknowledgement is handled: by then the task request of each action
    they ask for is encoded, and the acknowledgement is followed by its publish alone."""
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        orchestrator = stack.orchestrator
        runs = orchestrator.runs
        told: list[tuple[str, list[str]]] = []
        appending, appended = runs.on_appending, runs.on_appended
        assert appending is not None
        assert appended is not None

        def requests(records: Sequence[ev.AnyRecord]) -> list[str]:
            return [r.data.action_id for r in records if isinstance(r, ev.ActionRequested)]

        def on_appending(records: Sequence[ev.AnyRecord]) -> None:
            told.append(("appending", requests(records)))
            appending(records)

        def on_appended(records: Sequence[ev.AnyRecord]) -> None:
            ready = [key[0] for key in orchestrator.dispatcher._ready]
            told.append(("appended", [a for a in requests(records) if a in ready]))
            appended(records)

        runs.on_appending, runs.on_appended = on_appending, on_appended
        event = push("e-ready")
        await publish(stack, event)
        run_id = await run_of(stack, "on-push", event)

        assert (await stack.wait(run_id)).status == "completed"
        action = f"{run_id}:3"
        assert told[:2] == [("appending", [action]), ("appended", [action])]
        assert not orchestrator.dispatcher._ready  # taken when it was sent
        assert stack.recorder.per_action() == {action: 1}


async def test_the_orchestrator_recreates_a_consumer_deleted_under_it(
    nats_url: str, subjects: Subjects
) -> None:
    """An operator (or a botched migration) deletes the ingress and relay consumers while
    the orchestrator runs: it notices its open pulls are gone, makes the consumers again,
    and the next trigger still runs to the end."""
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        first = push("before")
        await publish(stack, first)
        assert (await stack.wait(await run_of(stack, "on-push", first))).status == "completed"
        js = stack.client.js
        await js.delete_consumer(subjects.events_stream, "ingress")
        await js.delete_consumer(subjects.runs_stream, "relay")

        event = push("after")
        await publish(stack, event)
        state = await asyncio.wait_for(stack.wait(await run_of(stack, "on-push", event)), 15)
        assert state.status == "completed"
        assert (await js.consumer_info(subjects.events_stream, "ingress")).config.durable_name


DEADLINED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: deadlined
    spec:
      deadline: {after: 1s, goto: expired, set: {why: "no approval within 1s"}}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: next}
        next:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: done}
        done: {type: terminal}
        expired:
          type: terminal
          fail: {message: "{{ context.why }}"}
    """
)


async def test_a_run_deadline_fires_on_the_real_timers_across_state_changes(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [DEADLINED]) as stack:
        run_id = await stack.client.start("deadlined", {})
        grant = CloudEvent(
            id="g1", source="/people", type="approval.granted", extensions={"runid": run_id}
        )
        await publish(stack, grant)

        async def moved() -> Any:
            return (await stack.client.state(run_id)).state == "next" or None

        await eventually(moved, what="the run moved on before its deadline")
        state = await asyncio.wait_for(stack.wait(run_id), 10)
        assert state.status == "failed"
        assert state.state == "expired"
        assert state.error is not None
        assert (state.error.error_class, state.error.message) == (
            "workflow_failed",
            "no approval within 1s",
        )
        fired = [r for r in await stack.records(run_id) if isinstance(r, ev.TimerFired)]
        assert [f.data.purpose for f in fired] == ["run-deadline"]


async def test_a_filter_mismatch_starts_nothing(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        wrong_branch = push("e1", branch="dev")
        wrong_source = push("e2", source="/elsewhere")
        no_branch = push("e3", data={"repo": "acme/app"})
        for event in (wrong_branch, wrong_source, no_branch):
            seq = await publish(stack, event)

        await ingress_settled(stack, seq)

        for event in (wrong_branch, wrong_source, no_branch):
            assert await stack.records(await run_of(stack, "on-push", event)) == []
        assert await stack.client.list_runs() == []
        assert stack.orchestrator.counters["events_unrouted"] == 3
        assert stack.recorder.handled == []


async def test_a_duplicate_trigger_event_starts_exactly_one_run(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        event = push("dup")
        first = await publish(stack, event)
        again = await publish(stack, event)
        assert again == first  # JetStream dropped the same Nats-Msg-Id
        # The same source+id under another Nats-Msg-Id is stored: the router must see
        # through it, and so must a structured-mode copy.
        headers, payload = encode_binary(event)
        headers["Nats-Msg-Id"] = "something-else"
        third = await publish_raw(stack, event.type, payload, headers)
        headers, payload = encode_structured(event)
        fourth = await publish_raw(stack, event.type, payload, headers)
        assert first < third < fourth

        run_id = await run_of(stack, "on-push", event)
        state = await stack.wait(run_id)
        await ingress_settled(stack, fourth)

        assert state.status == "completed"
        records = await stack.records(run_id)
        assert types(records).count("run.started") == 1
        assert types(records).count("run.completed") == 1
        assert len(stack.recorder.handled) == 1

        async def indexed() -> Any:
            return [r["run_id"] for r in await stack.client.list_runs()] == [run_id]

        # The run index is written behind the run: once it is, it lists the run once.
        await eventually(indexed, what="the run indexed")
        assert stack.orchestrator.counters["runs_started"] == 1
        assert stack.orchestrator.counters["triggers_duplicate"] == 2


# --- malformed events -------------------------------------------------------------------


MALFORMED = [
    pytest.param(
        {"ce-specversion": "1.0", "ce-source": "/x", "ce-type": "com.example.push"},
        b"{}",
        "missing-attribute",
        id="missing-id",
    ),
    pytest.param(
        {"ce-specversion": "0.3", "ce-id": "1", "ce-source": "/x", "ce-type": "com.example.push"},
        b"{}",
        "bad-specversion",
        id="wrong-specversion",
    ),
    pytest.param(
        {
            "ce-specversion": "1.0",
            "ce-id": "1",
            "ce-source": "/x",
            "ce-type": "com.example.push",
            "ce-datacontenttype": "application/json",
        },
        b"{not json",
        "undecodable-data",
        id="undecodable-json-data",
    ),
    pytest.param(
        {"Content-Type": "application/cloudevents+json"},
        b'{"specversion": "1.0", "id": "1", "source": "/x"',
        "bad-json",
        id="structured-not-json",
    ),
]


@pytest.mark.parametrize(("headers", "payload", "reason"), MALFORMED)
async def test_a_malformed_event_is_dead_lettered_and_the_router_goes_on(
    nats_url: str, subjects: Subjects, headers: dict[str, str], payload: bytes, reason: str
) -> None:
    async with running_stack(nats_url, subjects, [TRIGGERED]) as stack:
        async with DeadLetters(stack.js, subjects) as dead:
            # A Nats-Msg-Id of its own, so that dead-lettering cannot be deduplicated away.
            await publish_raw(
                stack, "com.example.push", payload, {**headers, "Nats-Msg-Id": "bad-1"}
            )
            good = push("after-the-bad-one")
            await publish(stack, good)

            letter = await dead.next()
            state = await stack.wait(await run_of(stack, "on-push", good))

        assert letter.subject == subjects.dead_letter(reason)
        assert letter.headers is not None
        assert letter.headers["Interlock-Dead-Letter-Reason"] == reason
        assert letter.headers["Interlock-Dead-Letter-Subject"] == subjects.event("com.example.push")
        assert letter.headers["Interlock-Dead-Letter-Detail"]
        assert letter.data == payload
        assert state.status == "completed"
        assert stack.orchestrator.counters[f"dead_lettered:{reason}"] == 1


# --- events reaching runs -----------------------------------------------------------------


async def test_an_event_with_a_runid_completes_a_parked_run(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        run_id = await stack.client.start("approval", {})
        # Not the run's: it must not be taken by it.
        other = CloudEvent(
            id="g0",
            source="/people",
            type="approval.granted",
            data={"by": "mallory"},
            extensions={"runid": "r-no-such-run"},
        )
        seq = await publish(stack, other)
        await ingress_settled(stack, seq)
        assert (await stack.client.state(run_id)).status == "running"

        grant = CloudEvent(
            id="g1",
            source="/people",
            type="approval.granted",
            datacontenttype="application/json",
            data={"by": "alice"},
            extensions={"runid": run_id},
        )
        await publish(stack, grant, structured=True)
        state = await stack.wait(run_id)

        assert state.status == "completed"
        assert state.outputs == {"by": "alice", "version": 1}
        received = [r for r in await stack.records(run_id) if isinstance(r, ev.EventReceived)]
        assert len(received) == 1
        assert received[0].data.event["id"] == "g1"
        assert received[0].data.event["data"] == {"by": "alice"}


async def test_an_event_nothing_waits_for_is_acked(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        run_id = await stack.client.start("approval", {})
        unrelated = CloudEvent(id="u1", source="/x", type="com.example.unrelated", data={})
        wrong_type = CloudEvent(
            id="u2", source="/x", type="approval.denied", extensions={"runid": run_id}
        )
        await publish(stack, unrelated)
        seq = await publish(stack, wrong_type)

        info = await ingress_settled(stack, seq)

        assert info.num_pending == 0
        assert info.num_ack_pending == 0
        assert info.num_redelivered == 0
        assert (await stack.client.state(run_id)).status == "running"
        assert types(await stack.records(run_id)) == ["run.started", "state.entered"]
        assert stack.orchestrator.counters["events_unrouted"] == 2


async def test_a_stop_ends_every_registry_check_still_out(
    nats_url: str, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fetched batches overlap (a batch whose events wait for their check is left to
    finish while the next is fetched), so the checks of several can be out at once:
    stopping ends each of them, not only the newest (none is left pending)."""
    checks: list[asyncio.Future[Any]] = []

    def sync_unanswered(**_: Any) -> asyncio.Future[None]:
        check: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        checks.append(check)  # never answered: each check stays out until it is ended
        return check

    async with running_stack(nats_url, subjects) as stack:
        monkeypatch.setattr(stack.orchestrator.registry, "sync_soon", sync_unanswered)
        for n in (1, 2, 3):
            event = CloudEvent(id=f"u{n}", source="/x", type="com.example.unrelated", data={})
            await publish(stack, event)

            async def out(n: int = n) -> bool:
                return len(checks) >= n

            await eventually(out, what=f"the registry check of batch {n}")

    assert len(checks) == 3
    assert [check.cancelled() for check in checks] == [True, True, True]


async def test_invalid_trigger_inputs_create_no_run_and_are_dead_lettered(
    nats_url: str, subjects: Subjects
) -> None:
    # Two workflows on the same trigger: one event, two refusals, two dead letters.
    twin = TRIGGERED.replace("name: on-push", "name: on-push-too")
    async with running_stack(nats_url, subjects, [TRIGGERED, twin]) as stack:
        async with DeadLetters(stack.js, subjects) as dead:
            missing = push("i1", data={"branch": "main"})
            mistyped = push("i2", data={"branch": "main", "repo": "acme/app", "n": "two"})
            await publish(stack, missing)
            seq = await publish(stack, mistyped)
            letters = [await dead.next() for _ in range(4)]
            await ingress_settled(stack, seq)

        details = []
        for letter in letters:
            assert letter.subject == subjects.dead_letter("invalid-inputs")
            assert letter.headers is not None
            assert letter.headers["Interlock-Dead-Letter-Reason"] == "invalid-inputs"
            details.append(letter.headers["Interlock-Dead-Letter-Detail"])
        assert sorted(details) == [
            "invalid inputs for workflow default/on-push-too: input 'n' must be integer, "
            "got string",
            "invalid inputs for workflow default/on-push-too: input 'repo' is required (string)",
            "invalid inputs for workflow default/on-push: input 'n' must be integer, got string",
            "invalid inputs for workflow default/on-push: input 'repo' is required (string)",
        ]
        info = await stack.js.stream_info(subjects.dead_letter_stream)
        assert info.state.messages == 4
        for event in (missing, mistyped):
            for workflow in ("on-push", "on-push-too"):
                assert await stack.records(await run_of(stack, workflow, event)) == []
        assert await stack.client.list_runs() == []
        # Started by hand, the same inputs are refused the same way.
        with pytest.raises(InvalidInputs, match="input 'repo' is required"):
            await stack.client.start("on-push", {})


# --- schemas ---------------------------------------------------------------------------

SCHEMAS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: schemas
    spec:
      inputs:
        capability: {type: string, required: true}
      initial_state: work
      states:
        work:
          actions:
            - capability: strict
              input:
                n: "not a number"
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
    """
)


async def test_an_input_schema_mismatch_fails_the_action_with_schema_error(
    nats_url: str, subjects: Subjects
) -> None:
    wf = SCHEMAS.replace("capability: {type: string, required: true}", "{}")
    async with running_stack(nats_url, subjects, [wf]) as stack:
        run_id = await stack.client.start("schemas", {})
        state = await stack.wait(run_id)

        assert state.status == "failed"
        assert state.error is not None
        assert state.error.error_class == "schema_error"
        assert "input_schema" in state.error.message
        assert "n" in state.error.message
        failed = [r for r in await stack.records(run_id) if isinstance(r, ev.ActionFailed)]
        assert [f.data.error.error_class for f in failed] == ["schema_error"]
        assert stack.recorder.handled == []  # never reached an agent


async def test_an_output_schema_mismatch_fails_the_action_with_schema_error(
    nats_url: str, subjects: Subjects
) -> None:
    wf = SCHEMAS.replace("capability: {type: string, required: true}", "{}").replace(
        "- capability: strict", "- capability: liar"
    )
    async with running_stack(nats_url, subjects, [wf]) as stack:
        run_id = await stack.client.start("schemas", {})
        state = await stack.wait(run_id)

        assert state.status == "failed"
        assert state.error is not None
        assert state.error.error_class == "schema_error"
        assert "output_schema" in state.error.message
        assert "score" in state.error.message
        assert len(stack.recorder.handled) == 1
        records = await stack.records(run_id)
        assert not any(isinstance(r, ev.ActionCompleted) for r in records)


# --- guards and versions ---------------------------------------------------------------

GUARDED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: guarded
    spec:
      inputs:
        score: {type: integer, required: true}
      initial_state: review
      states:
        review:
          actions:
            - capability: echo
              input:
                score: "{{ inputs.score }}"
          on:
            - event: task.completed
              guard: "result.score > 7"
              goto: merge
            - event: task.completed
              guard: "result.nothing > 1"
              goto: merge
            - event: task.completed
              goto: rework
        merge:
          type: terminal
          outputs: {route: merge}
        rework:
          type: terminal
          outputs: {route: rework}
    """
)


async def test_a_guard_on_the_result_routes(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [GUARDED]) as stack:
        high = await stack.client.start("guarded", {"score": 9})
        low = await stack.client.start("guarded", {"score": 3})

        high_state, low_state = await asyncio.gather(stack.wait(high), stack.wait(low))

        assert high_state.outputs == {"route": "merge"}
        assert low_state.outputs == {"route": "rework"}
        # The guard that errors on the low run (no such field) did not fire, and says so.
        guard_failures = [r for r in await stack.records(low) if isinstance(r, ev.GuardFailed)]
        assert [g.data.guard for g in guard_failures] == ["result.nothing > 1"]


async def test_a_run_keeps_its_version_when_the_workflow_changes(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        old_run = await stack.client.start("approval", {})
        changed = PARKED.replace("version: 1", "version: 2")

        applied = await stack.apply(changed)
        assert [(a.name, a.version, a.changed) for a in applied if a.kind == "Workflow"] == [
            ("approval", 2, True)
        ]
        assert [(a.version, a.changed) for a in await stack.apply(changed)][-1] == (2, False)
        new_run = await stack.client.start("approval", {})

        for run_id, who in ((old_run, "old"), (new_run, "new")):
            grant = CloudEvent(
                id=f"grant-{who}",
                source="/people",
                type="approval.granted",
                data={"by": who},
                extensions={"runid": run_id},
            )
            await publish(stack, grant)
        old_state, new_state = await asyncio.gather(stack.wait(old_run), stack.wait(new_run))

        assert (old_state.version, old_state.outputs) == (1, {"by": "old", "version": 1})
        assert (new_state.version, new_state.outputs) == (2, {"by": "new", "version": 2})


# --- cancellation ------------------------------------------------------------------------

SLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: slow
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: slow
          on:
            - event: task.completed
              goto: done
        done:
          type: terminal
    """
)


async def test_cancelling_a_parked_run(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        run_id = await stack.client.start("approval", {})

        assert await stack.client.cancel(run_id, "no longer needed")
        state = await stack.wait(run_id)

        assert state.status == "cancelled"
        assert not await stack.client.cancel(run_id)  # already finished: nothing appended
        last = (await stack.records(run_id))[-1]
        assert isinstance(last, ev.RunCancelled)
        assert last.data.reason == "no longer needed"
        assert last.data.cancelled_actions == []

        async def indexed() -> Any:
            runs = await stack.client.list_runs(status="cancelled")
            return [r["run_id"] for r in runs] == [run_id]

        await eventually(indexed, what="the run index says cancelled")


async def test_cancelling_a_run_tells_agents_about_its_action_in_flight(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [SLOW]) as stack:
        notices: asyncio.Queue[Msg] = asyncio.Queue()

        async def on_notice(msg: Msg) -> None:
            notices.put_nowait(msg)

        control = await stack.client.nc.subscribe(subjects.control_all, cb=on_notice)
        run_id = await stack.client.start("slow", {})
        action_id = await asyncio.wait_for(stack.recorder.slow_started.get(), TIMEOUT)

        assert await stack.client.cancel(run_id)
        notice = await asyncio.wait_for(notices.get(), TIMEOUT)
        await control.unsubscribe()

        assert notice.subject == subjects.control("slow", run_id)
        event = decode_message(notice.headers, notice.data)
        assert event.type == "io.interlock.task.cancel"
        assert event.extensions["actionid"] == action_id
        assert event.extensions["runid"] == run_id
        # The worker stops the handler, and its late answer changes nothing.
        await _wait_cancelled(stack, action_id)
        state = await stack.wait(run_id)
        assert state.status == "cancelled"
        records = await stack.records(run_id)
        assert isinstance(records[-1], ev.RunCancelled)
        assert records[-1].data.cancelled_actions == [action_id]


async def _wait_cancelled(stack: Stack, action_id: str) -> None:
    async def stopped() -> bool:
        return action_id in stack.recorder.cancelled

    await eventually(stopped, what="the handler was cancelled")


# --- the relay's bookkeeping -------------------------------------------------------------


async def test_the_run_index_never_goes_back(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [GUARDED]) as stack:
        run_id = await stack.client.start("guarded", {"score": 9})
        await stack.wait(run_id)

        async def completed() -> Any:
            runs = await stack.client.list_runs()
            return runs if runs and runs[0]["status"] == "completed" else None

        before = await eventually(completed, what="the run indexed as completed")
        # What a redelivery after a crash hands the relay: the run's first records, again.
        await stack.orchestrator.index.update(run_id, (await stack.records(run_id))[:2])

        assert await stack.client.list_runs() == before
        assert before[0]["state"] == "merge"


async def test_a_run_index_entry_deleted_by_hand_is_written_again(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        run_id = await stack.client.start("approval", {})

        async def indexed(status: str) -> Any:
            runs = await stack.client.list_runs()
            found = [(r["run_id"], r["status"]) for r in runs]
            return runs if found == [(run_id, status)] else None

        await eventually(lambda: indexed("running"), what="the run indexed as running")
        index = await stack.client.js.key_value(subjects.runs_bucket)
        await index.delete(run_id)  # a tombstone: a plain create would now be refused
        assert await stack.client.list_runs() == []

        grant = CloudEvent(
            id="g1",
            source="/people",
            type="approval.granted",
            data={"by": "alice"},
            extensions={"runid": run_id},
        )
        await publish(stack, grant)
        assert (await stack.wait(run_id)).status == "completed"
        [entry] = await eventually(lambda: indexed("completed"), what="indexed again")
        assert entry["state"] == "done"


async def test_consumers_made_by_an_earlier_version_are_brought_up_to_date(
    nats_url: str, subjects: Subjects, js: JetStreamContext
) -> None:
    # Made by an earlier version: "ack all" lets one process ack what another had taken.
    await provision(js, subjects)
    await js.add_consumer(
        subjects.runs_stream,
        ConsumerConfig(
            durable_name="relay",
            filter_subject=subjects.runs_all,
            ack_policy=AckPolicy.ALL,
            ack_wait=30,
        ),
    )
    # ... and with the ack wait of the time, too long to wait for after a crash.
    await js.add_consumer(
        subjects.events_stream,
        ConsumerConfig(
            durable_name="ingress",
            filter_subject=subjects.events_all,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30,
        ),
    )
    async with running_stack(nats_url, subjects, [GUARDED]) as stack:
        ack_wait = stack.orchestrator.ack_wait

        # Each consumer loop brings its consumer up to date as it starts, which may be
        # after start() has returned (the relay consumer is recreated: for a moment there
        # is none).
        async def up_to_date() -> bool:
            try:
                relay = await js.consumer_info(subjects.runs_stream, "relay")
                ingress = await js.consumer_info(subjects.events_stream, "ingress")
            except NotFoundError:
                return False
            return (relay.config.ack_policy, relay.config.ack_wait, ingress.config.ack_wait) == (
                AckPolicy.EXPLICIT,
                ack_wait,
                ack_wait,
            )

        await eventually(up_to_date, what="relay and ingress consumers up to date")
        run_id = await stack.client.start("guarded", {"score": 9})
        assert (await stack.wait(run_id)).outputs == {"route": "merge"}


async def test_no_per_run_lock_outlives_the_events_of_a_run(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [GUARDED]) as stack:
        run_ids = [await stack.client.start("guarded", {"score": n}) for n in range(20)]
        await asyncio.gather(*(stack.wait(r) for r in run_ids))

        # Every answer has been decided on; nothing about these runs is held any more.
        async def released() -> bool:
            return not stack.orchestrator.runs._locks

        await eventually(released, what="no per-run lock left")


async def test_concurrent_applies_of_one_workflow_each_get_their_own_version(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [PARKED]) as stack:
        variants = [PARKED.replace("version: 1", f"version: {n}") for n in range(2, 8)]
        clients = [InterlockClient(stack.client.nc, subjects) for _ in variants]

        results = await asyncio.gather(
            *(c.apply([("v", text)]) for c, text in zip(clients, variants, strict=True))
        )

        versions = sorted(r.applied[-1].version for r in results)
        assert len(set(versions)) == len(variants)
        assert versions[0] >= 2
        # Each version holds the manifest that was given that number, and no other.
        hashes = {r.applied[-1].version: r.compiled.workflows[0].spec_hash for r in results}
        reader = Registry(stack.js, subjects)
        for version, spec_hash in hashes.items():
            stored = await reader.definition("default", "approval", version)
            assert stored.spec_hash == spec_hash, version
        latest, latest_version = await reader.latest("approval")
        assert latest_version == versions[-1]
        assert latest.spec_hash == hashes[latest_version]


# --- several writers (orchestrator replicas, the CLI) ----------------------------------------

TWO_STEPS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: two-steps
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: slow
            - capability: slow
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def answer(action_id: str) -> Incoming:
    return Incoming(
        type="task.completed",
        source="interlock://agent/elsewhere",
        id=f"{action_id}.1.result",
        data={"ok": True},
        extensions={"actionid": action_id},
    )


async def test_an_answer_decided_on_a_stale_cached_state_is_not_dropped(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [TWO_STEPS], worker=False) as stack:
        mine = stack.orchestrator.runs
        run_id = await stack.client.start("two-steps", {})
        entry = await mine.load(run_id)  # this replica caches the run: first action pending
        assert entry is not None
        [first] = entry.state.pending
        # Another replica takes the first answer and requests the second action.
        other = Runs(RunLog(stack.client.nc, subjects), Registry(stack.js, subjects))
        appended = await other.apply(run_id, lambda d, s: decide(d, s, answer(first), "now"))
        [second] = [r.data.action_id for r in appended if isinstance(r, ev.ActionRequested)]

        # The answer to the second action reaches this replica, whose cache is stale.
        taken = await mine.apply(run_id, lambda d, s: decide(d, s, answer(second), "now"))

        assert types(taken)[:1] == ["action.completed"]
        assert (await stack.client.state(run_id)).status == "completed"
