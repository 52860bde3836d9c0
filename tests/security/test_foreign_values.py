"""Buckets, timers and secrets hold against values nobody of Interlock wrote.

Planted as a publisher can by reflection (an event published with a bucket key's subject
as its reply subject: JetStream writes its acknowledgement there) and as an admin of the
orchestrator's account can (junk published on the key's subject):

- a workflow's pointer, an AgentDef and a run-index entry that are not what their writer
  writes are skipped and reported: ``interlock start`` of that workflow says what is wrong
  (exit 1, no traceback) and ``apply`` mends it; ``workflows``, ``agents`` and ``runs``
  list the others;
- the secrets bucket takes no second value for a key (the task-token key and the log key
  stay as made), and the operator and the gateway read the log key but not the task-token
  key; agents and publishers read neither;
- an agent's rollup on its own heartbeat key is refused (every other key stays).

Damaged secrets, older installations' rollups and timers that cannot be handled:
test_secrets_and_timers.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from nats.aio.client import Client

from interlock.auth.roles import Role
from interlock.core.ids import capability_token
from interlock.transport.tokens import TOKEN_KEY
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOG_KEY = "shared.log-key"
"""The log key's key in the secrets bucket (docs/operations.md)."""
INTERLOCK = os.path.join(os.path.dirname(sys.executable), "interlock")
ACK = b'{"stream":"IL_EVENTS","seq":1}'
"""What a reflected JetStream acknowledgement looks like."""


async def cli(secured: Secured, *args: str) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` on the operator's credential (in a thread: the orchestrator runs
    on this event loop)."""
    env = dict(os.environ)
    env.pop("NATS_URL", None)
    env.update(INTERLOCK_URL=secured.url, INTERLOCK_CREDS=str(secured.auth.operator))
    return await asyncio.to_thread(
        subprocess.run,
        [INTERLOCK, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def reflect(secured: Secured, subject: str) -> None:
    """As a publisher of acme.> may: an event whose reply subject is ``subject`` (where
    the accounts keep parties apart, this lands nowhere)."""
    creds = secured.issued.get("pub") or secured.issue(Role("publisher", events=("acme.>",)), "pub")
    publisher = await plain_client(secured.url, creds, Refusals())
    try:
        await publisher.publish("il.events.acme.reflected", b"{}", reply=subject)
        await publisher.flush()
    finally:
        await publisher.close()


async def admin_publish(secured: Secured, subject: str, data: bytes) -> str | None:
    """As an admin of the orchestrator's account may: ``data`` on ``subject``; the error
    JetStream answered, if any."""
    admin: Client = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        await admin.jetstream().publish(subject, data)
    except Exception as exc:  # noqa: BLE001 - the refusal is what is looked at
        return str(exc)
    finally:
        await admin.close()
    return None


async def test_foreign_bucket_values_are_skipped_and_reported(secured: Secured) -> None:
    wf, agents, runs = SUBJECTS.workflows_bucket, SUBJECTS.agents_bucket, SUBJECTS.runs_bucket
    run_id = await secured.operator.start("awaiting", {})
    pointer = f"$KV.{wf}.latest.default.awaiting"
    await reflect(secured, pointer)
    await reflect(secured, f"$KV.{agents}.held")
    await reflect(secured, f"$KV.{runs}.{run_id}")
    assert await admin_publish(secured, f"$KV.{wf}.latest.default.echoing", b"[[[") is None
    assert await admin_publish(secured, f"$KV.{agents}.junk", b"\xff\x00") is None
    assert await admin_publish(secured, f"$KV.{runs}.rjunk", json.dumps([1]).encode()) is None
    assert await admin_publish(secured, pointer, ACK) is None

    started = await cli(secured, "start", "awaiting")
    assert started.returncode == 1, started.stdout + started.stderr
    assert "Traceback" not in started.stderr
    assert "not one Interlock wrote (apply the workflow again)" in started.stderr
    for args in (("workflows",), ("agents",), ("runs",), ("get", "workflow", "guarded")):
        done = await cli(secured, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
    listed = (await cli(secured, "workflows")).stdout
    assert "guarded" in listed
    assert "awaiting" not in listed
    assert "echoing" not in listed
    # The run's own entry is the orchestrator's to write again (the index is derived).
    assert "rjunk" not in (await cli(secured, "runs")).stdout

    # Applied again, the workflow starts as before.
    from support.auth import MANIFESTS

    applied = await secured.operator.apply([("<security>", MANIFESTS)])
    applied.compiled.raise_for_errors()
    started = await cli(secured, "start", "awaiting")
    assert started.returncode == 0, started.stderr


async def test_the_secrets_take_no_second_value(secured: Secured) -> None:
    bucket = SUBJECTS.secrets_bucket
    admin: Client = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        secrets = await admin.jetstream().key_value(bucket)
        token_before = (await secrets.get(TOKEN_KEY)).value
        log_before = (await secrets.get(LOG_KEY)).value
    finally:
        await admin.close()
    for key in (TOKEN_KEY, LOG_KEY):
        await reflect(secured, f"$KV.{bucket}.{key}")
        refused = await admin_publish(secured, f"$KV.{bucket}.{key}", b"AAAA")
        assert refused is not None
        assert "maximum messages per subject exceeded" in refused
    admin = await plain_client(secured.url, secured.auth.orchestrator, Refusals())
    try:
        secrets = await admin.jetstream().key_value(bucket)
        assert (await secrets.get(TOKEN_KEY)).value == token_before
        assert (await secrets.get(LOG_KEY)).value == log_before
        # No rollup purges one either.
        with pytest.raises(Exception, match="rollup not permitted"):
            await secrets.purge(TOKEN_KEY)
    finally:
        await admin.close()


@pytest.mark.parametrize("role", ["operator", "gateway", "agent", "publisher"])
async def test_who_reads_which_secret(secured: Secured, role: str) -> None:
    creds = {
        "operator": lambda: secured.auth.operator,
        "gateway": lambda: secured.issue(Role("gateway"), "gw-secrets"),
        "agent": lambda: secured.issue(Role("agent", capabilities=("held",)), "a-secrets"),
        "publisher": lambda: secured.issue(Role("publisher", events=("acme.>",)), "p-secrets"),
    }[role]()
    # The gateway, an agent and a publisher reach the JetStream API of the orchestrator's
    # account under their own account's prefix.
    prefix = "$JS.API" if role == "operator" else SUBJECTS.party_js_api
    api = f"{prefix}.DIRECT.GET.KV_{SUBJECTS.secrets_bucket}.$KV.{SUBJECTS.secrets_bucket}."
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        if role in ("operator", "gateway"):
            found = await nc.request(api + LOG_KEY, b"", timeout=5)
            assert json.loads(found.data)["key"]
        else:
            await nc.publish(api + LOG_KEY, b"", reply=nc.new_inbox())
            await refusals.wait_for("permissions violation", LOG_KEY)
        await nc.publish(api + TOKEN_KEY, b"", reply=nc.new_inbox())
        await refusals.wait_for("permissions violation", TOKEN_KEY)
    finally:
        await nc.close()


async def test_an_agents_rollup_on_its_own_heartbeat_is_refused(secured: Secured) -> None:
    workers = SUBJECTS.workers_bucket
    creds = secured.issue(Role("agent", capabilities=("held",)), "rollup-agent")
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        js = nc.jetstream()
        mine = f"$KV.{workers}.{capability_token('held')}.mine"
        for n in range(3):
            await js.publish(f"$KV.{workers}.{capability_token('held')}.w{n}", b"{}")
        before = await _keys(secured, workers)
        with pytest.raises(Exception, match="rollup not permitted"):
            await js.publish(mine, b"{}", headers={"Nats-Rollup": "all"})
        assert await _keys(secured, workers) == before
    finally:
        await nc.close()


async def _keys(secured: Secured, bucket: str) -> set[str]:
    from interlock.transport.kvread import bucket_values

    kv = await secured.operator.js.key_value(bucket)
    return set(await bucket_values(kv))
