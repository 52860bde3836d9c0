"""A reader whose HTTP token is revoked while it follows ``/live/runs`` and a run's
``/log/stream``: both streams end within the 5 s its new requests take to be refused,
while a stream of a token that still stands goes on. The token is revoked with
``interlock tokens revoke`` from another process, as an operator does (the gateway's own
cache is not told); real nats-server, real socket."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from interlock.gateway.auth import Tokens
from interlock.transport.subjects import Subjects
from support.accounts import pooled_subjects, secured_nats_url
from support.gateway import PARKED, TIMEOUT, GatewayStack, gateway_stack

# The gateway on a server with authentication, on its own account's credential.
__all__ = ["pooled_subjects", "secured_nats_url"]  # fixtures: nats_url, subjects

pytestmark = pytest.mark.asyncio

REVOCATION_S = 5.0
"""How long a revoked token's new requests may still pass (the gateway's token cache)."""
SLACK_S = 3.0
"""For a busy machine: the bucket read, the server's write, the event loop."""


@pytest.fixture
async def gs(nats_url: str, subjects: Subjects):  # type: ignore[no-untyped-def]
    async with gateway_stack(nats_url, subjects, [PARKED]) as stack:
        yield stack


async def _follow(client: httpx.AsyncClient, path: str, lines: list[str]) -> float:
    """Read the stream into ``lines`` until it ends; when it ended (monotonic)."""
    async with client.stream("GET", path, timeout=httpx.Timeout(60, read=60)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            lines.append(line)
    return time.monotonic()


def _has(lines: list[str], line: str):  # type: ignore[no-untyped-def]
    async def probe() -> bool:
        return line in lines

    return probe


async def test_a_revoked_tokens_streams_end_within_the_revocation_delay(
    gs: GatewayStack, nats_url: str
) -> None:
    from support.runtime import cli_env, eventually, run_cli

    async with gs.http() as http:
        started = await http.post("/runs", json={"workflow": "parked"})
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
    kept_token = await Tokens(gs.stack.js, gs.stack.subjects).issue("still-here", "reader")
    headers = {"Authorization": f"Bearer {gs.tokens['reader']}"}
    revoked = httpx.AsyncClient(base_url=gs.url, headers=headers, timeout=TIMEOUT)
    kept = httpx.AsyncClient(
        base_url=gs.url, headers={"Authorization": f"Bearer {kept_token}"}, timeout=TIMEOUT
    )
    runs_lines: list[str] = []
    log_lines: list[str] = []
    kept_lines: list[str] = []
    async with revoked, kept:
        runs = asyncio.create_task(_follow(revoked, "/live/runs", runs_lines))
        log = asyncio.create_task(_follow(revoked, f"/runs/{run_id}/log/stream", log_lines))
        other = asyncio.create_task(_follow(kept, "/live/runs", kept_lines))
        await eventually(
            _has(runs_lines, "event: ready"), what="the revoked token's stream following"
        )
        await eventually(_has(kept_lines, "event: ready"), what="the other stream following")
        # The revoked token was in use a moment ago: the gateway holds it as valid.
        assert (await revoked.get("/runs")).status_code == 200
        done = await asyncio.to_thread(
            run_cli,
            "tokens",
            "revoke",
            "dash",
            env=cli_env(nats_url, gs.stack.subjects.prefix),
        )
        assert done.returncode == 0, done.stderr
        at = time.monotonic()
        bound = REVOCATION_S + SLACK_S
        ended = await asyncio.wait_for(asyncio.gather(runs, log), bound + 5)
        assert max(ended) - at <= bound, [round(t - at, 2) for t in ended]
        assert runs_lines[-3:-1] == ["event: revoked", 'data: {"detail": "the token was revoked"}']
        assert "event: revoked" in log_lines
        assert (await revoked.get("/live/runs")).status_code == 401
        # The other reader's stream still follows: a run started now reaches it.
        async with gs.http() as http:
            assert (await http.post("/runs", json={"workflow": "parked"})).status_code == 201
        await eventually(_has(kept_lines, "event: run"), what="the kept stream's next run")
        assert not other.done()
        other.cancel()
        await asyncio.gather(other, return_exceptions=True)
