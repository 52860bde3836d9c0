"""Junk on the timers subject: 1,200 undecodable or forged-looking fired-timer messages are
dead-lettered at once (reason ``bad-timer``), and a run's 2 s state timeout still fires on
time, give or take, while an unrelated run completes."""

from __future__ import annotations

import json
import time

from interlock.core import events as ev
from interlock.runtime.timers import parse_time
from interlock.transport.subjects import Subjects
from support.hostile import (
    ECHO_FLOW,
    TIMEOUT,
    bystander_completes,
    eventually,
    running_stack,
    yaml,
)

JUNK = 1_200
LATE_S = 5.0
"""How late the timeout may fire (the unguarded consumer fired it 57 s late)."""

WAITER = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: waiter
    spec:
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          timeout: {after: 2s, goto: expired}
          on:
            - {event: approval.granted, goto: done}
        expired:
          type: terminal
        done:
          type: terminal
    """
)


def _junk(n: int) -> bytes:
    kinds = [
        b"not json",
        b"[1, 2, 3]",
        b'{"run_id": "bad.id.>", "timer_id": "t"}',
        b'{"run_id": "r1"}',
        b"[" * 5000 + b"]" * 5000,
        json.dumps({"run_id": "someone-else", "timer_id": f"t{n}"}).encode(),
    ]
    return kinds[n % len(kinds)]


async def test_junk_timers_are_dead_lettered_and_timeouts_fire_on_time(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW, WAITER]) as stack:
        for n in range(JUNK):
            await stack.js.publish(subjects.timer_fired("junk"), _junk(n))
        run_id = await stack.client.start("waiter", {})
        await bystander_completes(stack)
        # A bound on a hang only: how late the timeout fired is read from the log below.
        state = await stack.wait(run_id, 6 * TIMEOUT)
        assert state.status == "completed", state
        assert state.state == "expired", state
        records = await stack.records(run_id)
        scheduled = next(r for r in records if isinstance(r, ev.TimerScheduled))
        fired = next(r for r in records if isinstance(r, ev.TimerFired))
        late = (parse_time(fired.time) - parse_time(scheduled.data.fire_at)).total_seconds()
        assert late < LATE_S, f"the state timeout fired {late:.1f} s late"

        async def all_dead_lettered() -> bool:
            info = await stack.js.stream_info(
                subjects.dead_letter_stream, subjects_filter=subjects.dead_letter("bad-timer")
            )
            return info.state.messages >= JUNK

        started = time.monotonic()
        await eventually(all_dead_lettered, within=60, what="every junk timer dead-lettered")
        info = await stack.js.consumer_info(subjects.timers_stream, "timers")
        assert info.num_redelivered == 0
        assert info.num_ack_pending == 0
        after = time.monotonic() - started
        print(f"state timeout fired {late:.2f} s late; every letter in {after:.1f} s more")
