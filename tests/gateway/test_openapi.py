"""Each REST endpoint checked against the gateway's own OpenAPI document by schemathesis
(generated requests, valid and invalid, and the stateful links from POST /runs), over a
real socket against a real stack."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.transport.subjects import Subjects
from support.gateway import HELLO, GatewayStack, gateway_stack

pytestmark = pytest.mark.asyncio

CONFIG = Path(__file__).with_name("schemathesis.toml")


def _st() -> str:
    found = shutil.which("st", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    return found


@pytest.mark.timeout(600)
async def test_every_endpoint_answers_as_its_openapi_document_says(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    st = _st()
    async with gateway_stack(nats_url, subjects, [HELLO]) as gs:
        await _run(gs, st, "operator", tmp_path)


async def _run(gs: GatewayStack, st: str, role: str, cwd: Path) -> None:
    argv = [
        st,
        "--config-file",
        str(CONFIG),
        "run",
        f"{gs.url}/openapi.json",
        "-H",
        f"Authorization: Bearer {gs.tokens[role]}",
        "--max-examples",
        "10",
        "--generation-deterministic",
        "--no-color",
    ]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, cwd=cwd, timeout=540, check=False
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "generated" in done.stdout
