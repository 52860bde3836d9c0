"""A workflow's pause whose stored value is damaged (not JSON, as a stray write or a
reflected message leaves it) on a real nats-server, as an operator sees it through the
CLI: it is still a pause (the orchestrator holds the workflow's new runs), it is shown
as damaged, not as a pause with no reason nor as none, it is logged once, and resuming
or pausing again puts it right."""

from __future__ import annotations

import json
import logging

import pytest

from interlock.client.queues import list_queues
from interlock.runtime.pausing import DAMAGED
from interlock.transport.subjects import Subjects
from support.runtime import HELLO, cli, eventually, running_stack


async def test_a_damaged_pause_is_a_pause_shown_as_damaged(
    nats_url: str, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="interlock.foreign")
    async with running_stack(nats_url, subjects, [HELLO]) as stack:
        client = stack.client
        kv = await client.js.key_value(subjects.paused_bucket)
        await kv.put("wf.default.hello", b"\x00{not json")

        async def seen_paused() -> bool:
            return stack.orchestrator.flow.admission.pauses.holds("default", "hello")

        await eventually(seen_paused, what="the orchestrator holds the damaged pause")
        held = await client.start("hello", {"message": "held"})

        async def waiting() -> list[str] | None:
            found = await list_queues(client)
            return [q.limit for q in found] if found and found[0].queued == 1 else None

        assert await eventually(waiting, what="the run held") == ["default/hello@paused"]

        listed = await cli(nats_url, subjects, "workflows")
        assert f"paused: default/hello: {DAMAGED} (not JSON)" in listed, listed
        (shown,) = json.loads(await cli(nats_url, subjects, "workflows", "--json"))
        assert shown["paused"]["damaged"] is True
        warned = [r.getMessage() for r in caplog.records if "wf.default.hello" in r.getMessage()]
        assert warned, caplog.text
        assert "read as a pause until resumed" in warned[0]

        # Pausing again writes a pause over it; resuming lets the held run go on.
        said = await cli(nats_url, subjects, "pause", "workflow", "hello", "--reason", "fixed")
        assert "paused default/hello" in said, said
        (shown,) = json.loads(await cli(nats_url, subjects, "workflows", "--json"))
        assert shown["paused"]["reason"] == "fixed"
        assert "damaged" not in shown["paused"]
        await cli(nats_url, subjects, "resume", "workflow", "hello")
        assert (await stack.wait(held)).status == "completed"
