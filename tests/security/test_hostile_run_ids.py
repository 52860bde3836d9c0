"""Run ids that are not one subject token (``bad.id.>``, ``*``, ``>``) are refused
wherever an id enters: the CLI's arguments, the client, and events' ``runid`` extension
(dead-lettered at once with reason ``bad-run-id``). None of them creates, reads or merges
any run."""

from __future__ import annotations

import pytest

from interlock.core.ids import InvalidRunId, is_run_id
from interlock.transport.cloudevents import CloudEvent, encode_binary, encode_structured
from interlock.transport.subjects import Subjects
from support.hostile import (
    ECHO_FLOW,
    DeadLetters,
    bystander_completes,
    cli_env,
    run_cli,
    running_stack,
)

HOSTILE = ["bad.id.>", "*", ">", "a b", "", "x" * 129, "run\n2"]


@pytest.mark.parametrize("value", HOSTILE)
def test_no_hostile_value_is_a_run_id(value: str) -> None:
    assert not is_run_id(value)
    with pytest.raises(InvalidRunId):
        Subjects().run(value)


def test_generated_and_derived_ids_are_run_ids() -> None:
    assert is_run_id("r" + "0" * 24)
    assert is_run_id("my-run_1")


COMMANDS = [
    ("start", "bystander", "--run-id", "{id}"),
    ("logs", "{id}"),
    ("result", "{id}"),
    ("cancel", "{id}"),
    ("signal", "{id}", "approval.granted"),
    ("export", "{id}"),
]


@pytest.mark.parametrize("value", ["bad.id.>", "*", ">"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_the_cli_refuses_it_before_connecting(command: tuple[str, ...], value: str) -> None:
    # An address nothing listens on: the argument is refused before any connection.
    env = cli_env("nats://127.0.0.1:9", "nowhere")
    done = run_cli(*(a.format(id=value) for a in command), env=env, timeout=20)
    assert done.returncode == 2, done
    assert "invalid run id" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_client_and_events_refuse_it(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW]) as stack:
        client = stack.client
        for value in ("bad.id.>", "*", ">"):
            with pytest.raises(InvalidRunId):
                await client.start("bystander", {}, run_id=value)
            with pytest.raises(InvalidRunId):
                await client.read(value)
            with pytest.raises(ValueError, match="invalid run id"):
                await client.emit(
                    CloudEvent(
                        id="e1", source="test", type="approval.granted", extensions={"runid": value}
                    )
                )
        # Published by hand, past the client's check: the orchestrator dead-letters each
        # at once, in both content modes.
        async with DeadLetters(stack.js, subjects) as letters:
            for n, value in enumerate(("bad.id.>", "*", ">")):
                event = CloudEvent(
                    id=f"hostile-{n}",
                    source="test",
                    type="approval.granted",
                    extensions={"runid": value},
                )
                encode = encode_structured if n % 2 else encode_binary
                headers, payload = encode(event)
                await stack.js.publish(subjects.event("approval.granted"), payload, headers=headers)
            reasons = [
                (await letters.next()).headers.get("Interlock-Dead-Letter-Reason") for _ in range(3)
            ]
        assert reasons == ["bad-run-id"] * 3
        await bystander_completes(stack)
        info = await stack.js.stream_info(subjects.runs_stream, subjects_filter=">")
        assert all(is_run_id(s.rsplit(".", 1)[1]) for s in info.state.subjects or {})
