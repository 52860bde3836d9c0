"""A client's read of the AgentDefs before a start rides through a server that does not
answer for a while (a stream's leader election in a cluster: 4 to 7 s)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_waiting import paused

from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.registry import READ_ATTEMPTS, Registry
from interlock.transport.jetstream import JetStream
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.runtime import TIMEOUT, connect

# Reads time out after 0.1-0.3 s while the server is stopped (SIGSTOP): another test
# process busy beside it on a 2-core machine makes those timeouts a race.
pytestmark = pytest.mark.serial


@contextlib.asynccontextmanager
async def client_registry(
    tmp_path: Path, subjects: Subjects, read_timeout: float
) -> AsyncIterator[tuple[EmbeddedNats, Registry]]:
    """A server of its own (to pause) and a client's registry whose reads time out after
    ``read_timeout`` seconds."""
    with EmbeddedNats(tmp_path) as server:
        nc = await connect(server.url)
        try:
            js = JetStream(nc, timeout=read_timeout)
            await provision(js, subjects)
            yield server, Registry(js, subjects)
        finally:
            await nc.close()


async def test_a_read_that_times_out_is_asked_again(tmp_path: Path, subjects: Subjects) -> None:
    async with client_registry(tmp_path, subjects, 0.3) as (server, registry):
        with paused(server):
            reading = asyncio.create_task(registry.current_agents())
            for _ in range(int(TIMEOUT / 0.02)):
                if registry.reads_asked_again or reading.done():
                    break
                await asyncio.sleep(0.02)
            assert not reading.done(), "the read gave up at its first timeout"
            assert registry.reads_asked_again == 1
        await asyncio.wait_for(reading, TIMEOUT)  # answered once the server is back
        assert registry.reads_asked_again < READ_ATTEMPTS


async def test_it_gives_up_after_its_attempts(tmp_path: Path, subjects: Subjects) -> None:
    async with client_registry(tmp_path, subjects, 0.1) as (server, registry):
        with paused(server):
            try:
                await asyncio.wait_for(registry.current_agents(), TIMEOUT)
            except TimeoutError:
                pass
            else:
                raise AssertionError("a read no server answered returned")
        assert registry.reads_asked_again == READ_ATTEMPTS - 1


async def test_a_read_of_the_agentdefs_that_times_out_is_asked_again(
    tmp_path: Path, subjects: Subjects
) -> None:
    """The server stops answering between the bucket's revision and the AgentDefs: the
    whole read is asked again, not only its first request."""
    async with client_registry(tmp_path, subjects, 0.3) as (server, registry):
        paused_once = contextlib.ExitStack()
        read_specs = registry.agent_specs
        calls = 0

        async def paused_on_the_first_call() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            if calls == 1:
                paused_once.enter_context(paused(server))
            return await read_specs()

        registry.agent_specs = paused_on_the_first_call  # type: ignore[method-assign]
        reading = asyncio.create_task(registry.current_agents())
        for _ in range(int(TIMEOUT / 0.02)):
            if registry.reads_asked_again or reading.done():
                break
            await asyncio.sleep(0.02)
        paused_once.close()  # the server answers again
        await asyncio.wait_for(reading, TIMEOUT)
        assert registry.reads_asked_again >= 1
        assert calls >= 2
