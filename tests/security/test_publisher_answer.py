"""What a publisher is told of its event, as the publisher: ``interlock emit`` on its own
credential (made by ``interlock creds issue``) and ``POST /events`` with its own token over a
real socket say the same: the event is stored (its sequence, whether a duplicate) and no
more. Neither names a run, a workflow or a correlation key of the team whose workflows take
its events (a run another team started with the key the event carries, a workflow with no
run of a key yet, a trigger's refusal), while an operator's token, posting the same kind of
event, is told all of it (the control)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from interlock.auth.dev import DevAuth
from interlock.cli.dev import start_stack, stop_stack
from interlock.client import Client
from interlock.client.emitting import NOT_READ
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.correlation import CorrelationIndex
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from support.auth import SUBJECTS, secured_server
from support.runtime import eventually

__all__ = ["secured_server"]  # fixtures

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

INTERLOCK = str(Path(sys.executable).with_name("interlock"))

# Another team's workflows, in a namespace of their own, that take the publisher's type:
# one correlates it by account, one starts a run from it, one refuses what it lacks.
LEDGER = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: ledger, namespace: globex}
    spec:
      inputs:
        account: {type: string, required: true}
      correlate:
        key: "{{ inputs.account }}"
        events: {acme.pay.settled: data.account}
      initial_state: open
      states:
        open:
          type: human_in_the_loop
          on:
            - {event: acme.pay.settled, guard: 'data.account == "closed"', goto: done}
        done: {type: terminal}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: receipts, namespace: globex}
    spec:
      inputs:
        account: {type: string, required: true}
      triggers:
        - event: acme.pay.settled
          input: {account: "{{ data.account }}"}
      initial_state: held
      states:
        held:
          type: human_in_the_loop
          on:
            - {event: globex.receipt.sent, goto: done}
        done: {type: terminal}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: audits, namespace: globex}
    spec:
      inputs:
        auditor: {type: string, required: true}
      triggers:
        - event: acme.pay.settled
      initial_state: done
      states:
        done: {type: terminal}
    """
)
SECRET_ACCOUNT = "globex-acct-7"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    secured_server: tuple[EmbeddedNats, DevAuth, Path],
) -> AsyncIterator[tuple[str, Client, HttpServer, Path]]:
    server, auth, data = secured_server
    running = await start_stack(server.url, auth=auth, agents=False)
    operator = await Client.connect(server.url, creds=auth.operator)
    (await operator.ops.apply([("<globex>", LEDGER)])).compiled.raise_for_errors()
    nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.gateway)))
    gateway = Gateway(nc, SUBJECTS)
    await gateway.start()
    http = HttpServer(build_app(gateway, console=None), 0)
    await http.start()
    try:
        yield server.url, operator, http, data
    finally:
        await http.stop()
        await gateway.stop()
        await nc.close()
        await operator.close()
        await stop_stack(*running)


async def _cli(url: str, data: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_URL"] = url
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK, *args, cwd=data, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _post(http: httpx.AsyncClient, token: str, event_id: str) -> dict[str, Any]:
    r = await http.post(
        "/events",
        params={"wait": 5},
        headers={
            "Authorization": f"Bearer {token}",
            "ce-specversion": "1.0",
            "ce-id": event_id,
            "ce-source": "https://acme.example/pay",
            "ce-type": "acme.pay.settled",
            "Content-Type": "application/json",
        },
        json={"account": SECRET_ACCOUNT},
    )
    assert r.status_code == 202, r.text
    [answer] = r.json()["events"]
    return dict(answer)


def _told(answer: dict[str, Any]) -> dict[str, Any]:
    """What an answer says beyond the event's own identity and place in the stream."""
    return {k: v for k, v in answer.items() if k not in ("id", "seq")}


async def test_a_publisher_is_told_the_same_on_nats_and_http_and_nothing_of_others_runs(
    stack: tuple[str, Client, HttpServer, Path],
) -> None:
    url, operator, server, data = stack
    # Another team's run, waiting for the account's settlement by its correlation key.
    theirs = await operator.start("globex/ledger", {"account": SECRET_ACCOUNT})
    index = CorrelationIndex(operator.ops.nc, SUBJECTS)

    async def indexed() -> bool:
        return theirs in await index.runs("globex", "ledger", SECRET_ACCOUNT)

    await eventually(indexed, what="the run's correlation key indexed")
    creds = data / "pay-publisher.creds"
    code, _, err = await _cli(
        url, data,
        "creds", "issue", "publisher", "--events", "acme.pay.>", "--name", "pay-publisher",
        "-o", str(creds), "--keys", str(data / "keys"),
    )  # fmt: skip
    assert code == 0, err
    tokens = Tokens(operator.ops.js, SUBJECTS)
    publisher_token = await tokens.issue("pay-http", "publisher", ["acme.pay.>"])
    operator_token = await tokens.issue("pay-operator", "operator")

    code, out, err = await _cli(
        url, data,
        "emit", "acme.pay.settled", "--source", "https://acme.example/pay", "--id", "nats-1",
        "--data", json.dumps({"account": SECRET_ACCOUNT}), "--creds", str(creds),
        "--output", "json",
    )  # fmt: skip
    assert code == 0, err
    over_nats = json.loads(out)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        over_http = await _post(http, publisher_token, "http-1")
        # The control: an operator's token is told the runs, workflows and refusals.
        told_operator = await _post(http, operator_token, "operator-1")

    assert _told(over_nats) == _told(over_http)
    assert over_http["unknown"] == NOT_READ
    assert over_http["seq"] > over_nats["seq"] > 0
    assert (over_http["duplicate"], over_http["run_id"]) == (False, None)
    for said in (over_nats, over_http):
        assert said["started"] == said["reached"] == said["parked"] == []
        assert said["refused"] == said["gathered"] == []
        text = json.dumps(said)
        for secret in (theirs, "globex", "ledger", "receipts", "audits", SECRET_ACCOUNT):
            assert secret not in text, (secret, text)

    assert told_operator["unknown"] is None
    assert told_operator["reached"] == [theirs]
    assert [(s["namespace"], s["workflow"]) for s in told_operator["started"]] == [
        ("globex", "receipts")
    ]
    assert [(r["workflow"], r["reason"]) for r in told_operator["refused"]] == [
        ("audits", "invalid-inputs")
    ]

    # The publisher's events did what they do all the same: each started its run.
    async def receipts() -> list[str]:
        runs = await operator.runs(workflow="globex/receipts")
        return [r.run_id for r in runs] if len(runs) == 3 else []

    assert told_operator["started"][0]["run_id"] in await eventually(receipts, what="3 runs")


async def test_a_publishers_cli_says_its_event_is_stored_and_why_no_more(
    stack: tuple[str, Client, HttpServer, Path],
) -> None:
    url, _, _, data = stack
    creds = data / "pay-publisher-2.creds"
    code, _, err = await _cli(
        url, data,
        "creds", "issue", "publisher", "--events", "acme.pay.>", "--name", "pay-publisher-2",
        "-o", str(creds), "--keys", str(data / "keys"),
    )  # fmt: skip
    assert code == 0, err
    code, out, err = await _cli(
        url, data,
        "emit", "acme.pay.settled", "--source", "https://acme.example/pay", "--id", "nats-2",
        "--data", json.dumps({"account": SECRET_ACCOUNT}), "--creds", str(creds),
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.splitlines() == ["sent acme.pay.settled id=nats-2", NOT_READ]
