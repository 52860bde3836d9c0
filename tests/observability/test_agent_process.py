"""``interlock agent run`` serves /metrics, /healthz and /readyz on its metrics port."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.observability import TIMEOUT, connect, http_get


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_agent_process_endpoints(nats_url: str, subjects: Subjects) -> None:
    nc = await connect(nats_url)
    try:
        await provision(nc.jetstream(), subjects)
    finally:
        await nc.close()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INTERLOCK_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "interlock",
        "agent",
        "run",
        "echo",
        "--server",
        nats_url,
        "--prefix",
        subjects.prefix,
        "--metrics-port",
        str(port),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while True:
            try:
                status, body = await http_get(port, "/readyz")
            except OSError:
                status, body = 0, "not listening"
            if status == 200:
                break
            assert proc.returncode is None, "the agent exited"
            assert loop.time() < deadline, f"agent not ready: {status} {body}"
            await asyncio.sleep(0.05)
        assert await http_get(port, "/healthz") == (200, "ok\n")
        status, text = await http_get(port, "/metrics")
        assert status == 200
        for family in (
            "interlock_agent_tasks_total",
            "interlock_agent_task_duration_seconds",
            "interlock_agent_queue_wait_seconds",
            "interlock_agent_tasks_in_flight",
        ):
            assert f"# TYPE {family.removesuffix('_total')}" in text, family
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode == 0, err.decode()[-2000:]
