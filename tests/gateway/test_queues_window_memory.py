"""What a publisher's batches make a reader's ``GET /queues`` hold, over a real socket: a
publisher's token posts events of a batched trigger, each naming a key of its own and
carrying data near the bound, so each key's window keeps its event (a batch keeps every
event, up to half the server's payload limit per window). The listing read the whole
triggers bucket into memory at each request (and the orchestrator did at each start):
the sum of every open window, as large as publishers make it, once per request. It reads
the bucket a bounded batch at a time and keeps a line per window, so a request holds a
batch and the lines, however large the windows are."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from interlock.transport import kvread
from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack
from support.runtime import eventually, yaml

BLOBS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: blobs}
    spec:
      inputs: {events: {type: list, required: true}}
      triggers:
        - event: com.example.blob
          batch: {key: data.k, max_events: 1000, max_wait: 1h}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: com.example.go, goto: done}
        done: {type: terminal}
    """
)
WINDOWS = 40
DATA = 150_000


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvread, "SCAN_BYTES", 256 * 1024)


async def test_a_readers_queues_hold_a_batch_of_windows_not_all(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, [BLOBS], max_body=256 * 1024) as gs:
        async with gs.http("publisher") as http:
            for n in range(WINDOWS):
                event = {
                    "specversion": "1.0",
                    "id": f"blob-{n}",
                    "source": "https://publisher.example",
                    "type": "com.example.blob",
                    "data": {"k": f"key-{n:03d}", "blob": "x" * DATA},
                }
                r = await http.post(
                    "/events",
                    headers={"Content-Type": "application/cloudevents+json"},
                    content=json.dumps(event),
                )
                assert r.status_code == 202, r.text
        async with gs.http("reader") as reader:

            async def windows() -> list[dict[str, object]]:
                r = await reader.get("/queues")
                assert r.status_code == 200, r.text
                found = [q for q in r.json() if str(q["limit"]).endswith("@batch")]
                return found if len(found) == WINDOWS else []

            await eventually(windows, what=f"{WINDOWS} open windows listed")
            tracemalloc.start()
            try:
                r = await reader.get("/queues")
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert r.status_code == 200, r.text
        listed = [q for q in r.json() if str(q["limit"]).endswith("@batch")]
        assert sorted(str(q["key"]) for q in listed) == [f"key-{n:03d}" for n in range(WINDOWS)]
        assert all(q["queued"] == 1 for q in listed)
        # The windows hold WINDOWS * DATA bytes (6 MB). Read whole, a request held about
        # twice that (7.9 MB for 24 windows, measured); a batch at a time, 1.3 MB.
        assert peak < WINDOWS * DATA / 3, f"GET /queues held {peak:,} bytes at its peak"
