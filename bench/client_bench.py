"""``python -m bench client``: what waiting on many runs costs the client, against a baseline
measured in the same run.

- Waiting: N runs waited on at once from one connection, ended by cancelling them. The
  client's waits (one subscription shared by all) against the naive way, one ordered
  JetStream consumer per wait (:func:`_consumer_wait`, written here as the baseline): the
  server's consumers while they wait, how many waits failed, and the time from the first
  cancel to the last result.

The CLI's own speed is ``python -m bench cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

GATED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: gated}
spec:
  initial_state: review
  states:
    review:
      type: human_in_the_loop
      on:
        - {event: approval.granted, goto: done}
    done:
      type: terminal
"""


async def _consumer_wait(js: Any, subjects: Any, run_id: str) -> str:
    """The baseline: a run's log through an ordered consumer of its own, until it ends."""
    from nats.js.api import DeliverPolicy

    from interlock.core import events as ev

    sub = await js.subscribe(
        subjects.run(run_id),
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        stream=subjects.runs_stream,
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=300)
            for record in ev.decode_batch(msg.data):
                if ev.record_type(record) in ev.TERMINAL_TYPES:
                    return ev.record_type(record)
    finally:
        await sub.unsubscribe()


async def _waits(url: str, n: int, old_way: bool) -> dict[str, Any]:
    import nats

    from interlock import Client
    from interlock.transport.subjects import Subjects

    subjects = Subjects(f"bw{os.getpid()}{'o' if old_way else 'n'}")
    nc = await nats.connect(url)
    client = Client(nc, subjects)
    await client.apply([("gated.yaml", GATED)])
    gate = asyncio.Semaphore(100)

    async def bounded(make: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await make()

    run_ids = await asyncio.gather(
        *(bounded(lambda i=i: client.start("gated", run_id=f"b{i}")) for i in range(n))
    )
    js = nc.jetstream()
    waits = [
        asyncio.ensure_future(
            _consumer_wait(js, subjects, r) if old_way else client.result(r, wait=True, timeout=300)
        )
        for r in run_ids
    ]
    await asyncio.sleep(2.0)  # every wait set up (or refused)
    consumers = (await nc.jetstream().stream_info(subjects.runs_stream)).state.consumer_count
    started = time.perf_counter()
    await asyncio.gather(*(bounded(lambda r=r: client.cancel(r)) for r in run_ids))
    outcomes = await asyncio.gather(*waits, return_exceptions=True)
    elapsed = time.perf_counter() - started
    failed = sum(1 for o in outcomes if isinstance(o, BaseException))
    await nc.close()
    return {"consumers": consumers, "failed": failed, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench client")
    parser.add_argument("--waits", type=int, default=2_000, help="runs waited on at once")
    args = parser.parse_args(argv)

    from interlock.runtime.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedNats(Path(data))
        server.start()
        try:
            for old_way, label in ((True, "a consumer per wait"), (False, "interlock.Client")):
                got = asyncio.run(_waits(server.url, args.waits, old_way))
                print(
                    f"{args.waits} waits, {label:20}: {got['consumers']:5} consumers, "
                    f"{got['failed']:5} failed, last result {got['seconds']:.2f} s after "
                    "the first cancel",
                    flush=True,
                )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
