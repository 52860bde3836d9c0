"""docs/client.md's examples run as written, in order, against a real installation: an
orchestrator and the reference echo agent, as ``interlock dev`` serves them."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from interlock import Client
from interlock.runtime.service import Orchestrator
from interlock.sdk.runner import load_worker
from interlock.transport.subjects import Subjects
from support.runtime import ECHO_MANIFEST, TIMEOUT, cli_env, connect

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_doc_has_examples() -> None:
    assert len(examples()) >= 5


@pytest.mark.timeout(300)
async def test_every_example_runs(nats_url: str, subjects: Subjects, tmp_path: Path) -> None:
    orchestrator = Orchestrator(await connect(nats_url), subjects)
    await orchestrator.start()
    worker = load_worker("echo")
    served = asyncio.create_task(worker.run(nats_url, prefix=subjects.prefix))
    try:
        async with await Client.connect(nats_url, prefix=subjects.prefix) as client:
            await client.apply([ECHO_MANIFEST])
        await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
        env = cli_env(nats_url, subjects.prefix)
        for n, code in enumerate(examples(), 1):
            ran = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", code],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert ran.returncode == 0, f"example {n} of {DOC.name}:\n{code}\n{ran.stderr}"
    finally:
        await worker.stop(force=True)
        await asyncio.wait_for(served, TIMEOUT)
        await orchestrator.stop()
        await orchestrator.nc.close()
