"""The Python client's pauses bound their reason as the CLI and the HTTP API do: a reason
of more than 1,024 characters is refused with a clear error before anything is sent (no
``run.paused`` in the run's log, no pause stored), on an operator's credential as
``interlock creds issue`` makes it; one of 1,024 is taken."""

from __future__ import annotations

import pytest

from interlock.client import Client
from interlock.client.capqueues import pause_capability
from interlock.client.queues import pause_workflow
from interlock.core import events as ev
from interlock.runtime.pausing import Pauses
from interlock.transport.subjects import Subjects
from support.accounts import issued_creds, pooled_subjects, secured_nats_url
from support.runtime import eventually, running_stack

__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects

WAITING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: waiting}
spec:
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""
TOO_LONG = "x" * 1025
REFUSED = "a reason is at most 1,024 characters; this one is 1,025"


async def test_a_pause_reason_past_1024_characters_is_refused_before_anything_is_sent(
    nats_url: str, subjects: Subjects
) -> None:
    operator = await issued_creds(nats_url, subjects, "operator")
    assert operator is not None
    async with running_stack(nats_url, subjects, [WAITING]) as stack:
        client = await Client.connect(nats_url, creds=operator, prefix=subjects.prefix)
        async with client:
            run_id = await client.start("waiting", run_id="pr-run")

            async def waits() -> bool:
                records = await client.records(run_id)
                return any(isinstance(r, ev.StateEntered) for r in records)

            await eventually(waits, what="the run in its waiting state")
            before = len(await client.records(run_id))
            with pytest.raises(ValueError, match=REFUSED):
                await client.pause_run(run_id, TOO_LONG)
            with pytest.raises(ValueError, match=REFUSED):
                await pause_workflow(client.ops, "waiting", TOO_LONG, runs=True)
            with pytest.raises(ValueError, match=REFUSED):
                await pause_capability(client.ops, "echo", TOO_LONG)
            with pytest.raises(TypeError, match="a reason is text"):
                await client.pause_run(run_id, 5)  # type: ignore[arg-type]
            # Nothing was written: no record, no pause.
            assert len(await client.records(run_id)) == before
            pauses = Pauses(stack.client.nc, subjects)
            assert await pauses.all_paused() == {}
            # At the bound, it is taken.
            assert await client.pause_run(run_id, "y" * 1024)
            (paused,) = [r for r in await client.records(run_id) if isinstance(r, ev.RunPaused)]
            assert paused.data.reason == "y" * 1024
