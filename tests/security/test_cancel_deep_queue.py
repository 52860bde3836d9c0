"""A cancelled run's task request leaves its capability's queue however deep the queue is,
cancelled by the operator's CLI on its own credential and handled by an orchestrator that
did not dispatch it (one started after the replica that did stopped, on an installation
whose task stream was made before it allowed direct gets)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_user
from interlock.auth.roles import inbox_prefix
from interlock.cli.dev import start_stack, stop_stack
from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.directget import scan_headers
from interlock.transport.tasks import MSG_ID_HEADER
from support.auth import SUBJECTS, secured_server

__all__ = ["secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
HELD = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: held}
spec:
  capabilities:
    - {name: held, input_schema: {type: object}, timeout_seconds: 3600}
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: guarded}
spec:
  initial_state: work
  states:
    work:
      actions:
        - {capability: held, input: {}}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
"""
"""``held`` is served by nobody: its requests stay queued."""
DEPTH = 300
"""Requests queued: deeper than the 256 an earlier lookup went through."""
MANY = 60
"""Runs cancelled at once."""


async def queued(client: InterlockClient) -> dict[str, int]:
    """``Nats-Msg-Id`` -> stream sequence of every request queued for ``held``."""
    found: dict[str, int] = {}
    async for batch in scan_headers(client.nc, SUBJECTS.tasks_stream, SUBJECTS.capability("held")):
        found.update({headers[MSG_ID_HEADER]: seq for seq, headers in batch})
    return found


async def cancel(server: EmbeddedNats, auth: DevAuth, run_id: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env |= {"INTERLOCK_URL": server.url, "INTERLOCK_CREDS": str(auth.operator)}
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK,
        "cancel",
        run_id,
        "--reason",
        "not wanted",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, errs = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out, errs)


async def test_a_request_deep_in_the_queue_leaves_it_when_another_replica_cancels(
    secured_server: tuple[EmbeddedNats, DevAuth, Path],
) -> None:
    server, auth, _ = secured_server
    nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
    operator = InterlockClient(nc, SUBJECTS)
    first = await start_stack(server.url, auth=auth, agents=False)
    try:
        (await operator.apply([("held.yaml", HELD)])).compiled.raise_for_errors()
        runs = [await operator.start("guarded", {}) for _ in range(DEPTH)]
        for _ in range(600):
            if len(await queued(operator)) == DEPTH:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the requests were never all queued")
    finally:
        await stop_stack(*first)
    # An installation made before its task stream allowed direct gets: the orchestrator
    # that starts now updates it.
    info = await operator.js.stream_info(SUBJECTS.tasks_stream)
    config = info.config
    config.allow_direct = False
    await operator.js.update_stream(config)
    second = await start_stack(server.url, auth=auth, agents=False)
    try:
        info = await operator.js.stream_info(SUBJECTS.tasks_stream)
        assert info.config.allow_direct
        before = await queued(operator)
        last, middle = runs[-1], runs[DEPTH // 2]
        ids = {}
        for run_id in (last, middle):
            (requested,) = [
                r for r in await operator.read(run_id) if isinstance(r, ev.ActionRequested)
            ]
            ids[run_id] = f"{requested.data.action_id}.{requested.data.attempt}"
        assert sorted(before.values()).index(before[ids[last]]) == DEPTH - 1
        for run_id in (last, middle):
            await cancel(server, auth, run_id)
        for _ in range(600):
            now = await queued(operator)
            if len(now) == DEPTH - 2:
                break
            await asyncio.sleep(0.05)
        gone = set(before) - set(now)
        assert gone == set(ids.values()), json.dumps(sorted(gone))
        assert second[0].queue.scans >= 1  # looked for: this replica dispatched none of them
        # Many cancelled at once: their lookups share scans of the queue.
        scans = second[0].queue.scans
        many = [r for r in runs if r not in (last, middle)][-MANY:]
        await asyncio.gather(*(operator.cancel(run_id, "not wanted") for run_id in many))
        for _ in range(600):
            now = await queued(operator)
            if len(now) == DEPTH - 2 - MANY:
                break
            await asyncio.sleep(0.05)
        assert len(now) == DEPTH - 2 - MANY
        print(f"{MANY} cancels at once: {second[0].queue.scans - scans} scans")
        assert second[0].queue.scans - scans < MANY // 2
    finally:
        await stop_stack(*second)
        await nc.close()


async def test_an_agent_cannot_read_the_queue_by_direct_gets(
    secured_server: tuple[EmbeddedNats, DevAuth, Path],
) -> None:
    """The task stream allows direct gets, for the orchestrator: an agent that asks for
    another capability's queued requests (their inputs and tokens) that way gets none."""
    server, auth, _ = secured_server
    nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
    operator = InterlockClient(nc, SUBJECTS)
    assert len(await queued(operator)) == DEPTH - 2 - MANY  # what the first test left
    agent = await nats.connect(
        server.url,
        user_credentials=str(auth.agents),
        inbox_prefix=inbox_prefix(creds_user(auth.agents)),
        allow_reconnect=False,
    )
    try:
        body = json.dumps({"seq": 1, "next_by_subj": SUBJECTS.capability("held")}).encode()
        for api in (f"{SUBJECTS.party_js_api}", "$JS.API"):
            for subject in (
                f"{api}.DIRECT.GET.{SUBJECTS.tasks_stream}",
                f"{api}.DIRECT.GET.{SUBJECTS.tasks_stream}.{SUBJECTS.capability('held')}",
            ):
                try:
                    msg = await agent.request(subject, body, timeout=0.25)
                except (NoRespondersError, NatsTimeout):
                    continue
                assert (msg.headers or {}).get("Status"), (subject, msg.headers)
    finally:
        await agent.close()
        await nc.close()
