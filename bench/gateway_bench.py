"""``python -m bench gateway``: what ``POST /events`` costs next to ``Client.emit``.

One nats-server, one workflow with a trigger (so each event is matched against it, as in
production), and one ``interlock gateway`` process with a publisher's bearer token. The
same number of events is then sent one after another (the next once the previous is
stored and answered) two ways, in the same run:

- ``Client.emit(event, wait=0)`` from this process (the baseline);
- ``POST /events`` (binary mode) over one keep-alive HTTP connection;

and then as batches (batched mode, ``--batch`` events each, the next once the previous
is answered) over the same connection.

It prints each rate and the ratio ``/events`` : ``Client.emit`` (1.0: HTTP costs nothing
over the client; the gateway does what the client does, plus HTTP and the token check),
and what one batch takes next to one single-event post (a batch's events are published
together: about one round trip plus each event's own work, not one round trip each).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOOKED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: hooked}
spec:
  triggers:
    - event: com.example.bench
      filter: {lang: fr}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: approval.granted, goto: done}
    done:
      type: terminal
"""
"""A trigger on the benchmark's event type whose filter the events do not match: each
event is checked against it and starts nothing (no orchestrator is needed)."""


async def _emits(url: str, prefix: str, n: int) -> float:
    from interlock import Client

    async with await Client.connect(url, prefix=prefix) as client:
        await client.emit(type="com.example.bench", source="bench", data={"i": -1}, wait=0)
        started = time.perf_counter()
        for i in range(n):
            await client.emit(
                type="com.example.bench", source="bench", data={"lang": "en", "i": i}, wait=0
            )
        return n / (time.perf_counter() - started)


async def _posts(base: str, token: str, n: int) -> float:
    import httpx

    headers = {
        "Authorization": f"Bearer {token}",
        "ce-specversion": "1.0",
        "ce-type": "com.example.bench",
        "ce-source": "bench-http",
        "content-type": "application/json",
    }
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        first = await http.post("/events", headers={**headers, "ce-id": "warm"}, content=b"{}")
        first.raise_for_status()
        started = time.perf_counter()
        for i in range(n):
            body = b'{"lang": "en", "i": %d}' % i
            answer = await http.post("/events", headers={**headers, "ce-id": f"e{i}"}, content=body)
            if answer.status_code != 202:
                raise RuntimeError(f"POST /events: {answer.status_code} {answer.text}")
        return n / (time.perf_counter() - started)


async def _batches(base: str, token: str, n: int, size: int) -> float:
    """Seconds per batch of ``size`` events, ``n`` events in all."""
    import json

    import httpx

    headers = {
        "Authorization": f"Bearer {token}",
        "content-type": "application/cloudevents-batch+json",
    }

    def event(i: int) -> dict[str, object]:
        return {
            "specversion": "1.0", "id": f"b{i}", "source": "bench-batch",
            "type": "com.example.bench", "data": {"lang": "en", "i": i},
        }  # fmt: skip

    batches = [
        json.dumps([event(i) for i in range(start, min(start + size, n))])
        for start in range(0, n, size)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        warm = await http.post("/events", headers=headers, content=json.dumps([event(-1)]))
        warm.raise_for_status()
        started = time.perf_counter()
        for body in batches:
            answer = await http.post("/events", headers=headers, content=body)
            if answer.status_code != 202:
                raise RuntimeError(f"POST /events: {answer.status_code} {answer.text}")
        return (time.perf_counter() - started) / len(batches)


def _run(interlock: str, env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [interlock, *args], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gateway")
    parser.add_argument("--events", type=int, default=300, help="events sent each way")
    parser.add_argument("--batch", type=int, default=100, help="events in one batched post")
    args = parser.parse_args(argv)

    from interlock.runtime.embedded import EmbeddedNats

    interlock = str(Path(sys.executable).with_name("interlock"))
    prefix = f"bg{os.getpid()}"
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedNats(Path(data))
        server.start()
        gateway = None
        try:
            env = {**os.environ, "INTERLOCK_URL": server.url, "INTERLOCK_PREFIX": prefix}
            (Path(data) / "hooked.yaml").write_text(HOOKED)
            _run(interlock, env, "apply", str(Path(data) / "hooked.yaml"))
            token = _run(
                interlock, env, "tokens", "create", "bench", "--role", "publisher",
                "--events", "com.example.>",
            )  # fmt: skip
            gateway = subprocess.Popen(
                [interlock, "gateway", "--host", "127.0.0.1", "--http-port", "0"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert gateway.stdout is not None
            line = gateway.stdout.readline()
            if not line.startswith("HTTP gateway at "):
                raise RuntimeError(f"the gateway did not start: {line!r}")
            base = line.removeprefix("HTTP gateway at ").strip()
            client_rate = asyncio.run(_emits(server.url, prefix, args.events))
            http_rate = asyncio.run(_posts(base, token, args.events))
            per_batch = asyncio.run(_batches(base, token, args.events, args.batch))
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(10)
            server.stop()
    print(f"Client.emit   {client_rate:8.1f} events/s  (sequential, {args.events} events)")
    print(f"POST /events  {http_rate:8.1f} events/s  (sequential, one keep-alive connection)")
    print(f"ratio /events : Client.emit = {http_rate / client_rate:.2f}")
    size = min(args.batch, args.events)
    print(
        f"POST /events  {size / per_batch:8.1f} events/s  (batches of {size}: "
        f"{per_batch * 1000:.1f} ms each, one event {1000 / http_rate:.1f} ms)"
    )
    print(f"ratio batch of {size} : one event = {per_batch * http_rate:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
