"""An agent credential for many capabilities carries a user JWT larger than nats-server's
default control-line limit (4 KB, reached at 8 capabilities): the server configuration
Interlock writes raises the limit, so such an agent connects and serves its capabilities.
Real nats-server with Interlock's decentralized auth, a worker of the SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from interlock.auth.jwt import creds_user
from interlock.auth.keys import MAX_CONTROL_LINE
from interlock.auth.roles import Role
from interlock.sdk import Worker
from interlock.transport.connection import ConnectOptions
from support.auth import Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

CAPABILITIES = tuple(f"many-{n:02d}" for n in range(20))
DEFAULT_CONTROL_LINE = 4096


def _manifests() -> str:
    capabilities = "".join(
        f"        - name: {name}\n"
        "          input_schema: {type: object}\n"
        "          output_schema: {type: object}\n"
        for name in CAPABILITIES
    )
    return (
        "apiVersion: interlock.io/v1\n"
        "kind: AgentDef\n"
        "metadata:\n"
        "  name: many\n"
        "spec:\n"
        "  capabilities:\n"
        f"{capabilities}"
        "---\n"
        "apiVersion: interlock.io/v1\n"
        "kind: Workflow\n"
        "metadata:\n"
        "  name: many-last\n"
        "spec:\n"
        "  initial_state: work\n"
        "  states:\n"
        "    work:\n"
        "      actions:\n"
        f"        - capability: {CAPABILITIES[-1]}\n"
        "          input: {n: 20}\n"
        "      on:\n"
        "        - event: task.completed\n"
        "          goto: done\n"
        "    done:\n"
        "      type: terminal\n"
        "      outputs:\n"
        '        served_by: "$.states.work.output.served_by"\n'
    )


def _jwt_size(creds_text: str) -> int:
    return len(creds_text.split("-----BEGIN NATS USER JWT-----")[1].split("------END")[0].strip())


def _handler(name: str) -> Callable[[dict[str, int]], Awaitable[dict[str, str]]]:
    async def serve(inp: dict[str, int]) -> dict[str, str]:
        return {"served_by": name}

    return serve


async def test_an_agent_of_twenty_capabilities_connects_and_serves_the_last(
    secured: Secured,
) -> None:
    applied = await secured.operator.apply([("<many>", _manifests())])
    applied.compiled.raise_for_errors()
    creds = secured.issue(Role("agent", capabilities=CAPABILITIES), "many-agent")
    size = _jwt_size(creds.read_text())
    # What the test is about: the credential alone is over the default limit.
    assert DEFAULT_CONTROL_LINE < size < MAX_CONTROL_LINE, size
    assert creds_user(creds)

    worker = Worker("many-agent", grace_period=1.0)
    for name in CAPABILITIES:
        worker.capability(name)(_handler(name))

    serving = asyncio.create_task(
        worker.run(ConnectOptions.resolve(secured.url, creds_file=str(creds)))
    )
    try:
        await asyncio.wait_for(worker.wait_ready(), 60)
        run_id = await secured.operator.start("many-last", {})
        state = await secured.operator.wait(run_id, timeout=60)
        assert state.status == "completed", state
        assert state.outputs == {"served_by": CAPABILITIES[-1]}
    finally:
        await worker.stop(force=True)
        await serving
