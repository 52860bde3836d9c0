"""docs/operations.md's backups as an operator takes them: a NATS client on the operator's
credential, replies on that credential's own inbox (`nats --inbox-prefix _INBOX.<its user
key>`), snapshots every stream the backup table says to keep and reads the log key; the
secrets bucket's stream is the orchestrator's alone to snapshot. Without the inbox a
request is never answered: the server refuses the subscription to its replies."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.auth.jwt import creds_user
from support.auth import Refusals, Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SECRETS = "KV_il_secrets"


def backed_up() -> list[str]:
    """The streams the backup table says to keep (`yes`), of a one-partition installation."""
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Backup and restore", 1)[1].split("\n\n")[2]
    names = []
    for row in table.splitlines():
        cells = row.split("|")
        if len(cells) > 3 and "yes" in cells[3]:
            names += re.findall(r"`((?:IL|KV)_[A-Za-z_]+)`", cells[2])
    return names


async def connect(secured: Secured, creds: Path, refusals: Refusals, *, inbox: bool) -> Client:
    prefix = f"_INBOX.{creds_user(creds)}" if inbox else "_INBOX"
    return await nats.connect(
        secured.url,
        user_credentials=str(creds),
        inbox_prefix=prefix,
        error_cb=refusals.on_error,
        allow_reconnect=False,
    )


async def snapshot(nc: Client, stream: str) -> int:
    """`nats stream backup STREAM`: the bytes of its snapshot, each chunk acknowledged."""
    inbox = nc.new_inbox()
    end: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    size = 0

    async def chunk(msg: Msg) -> None:
        nonlocal size
        if not msg.data:  # the snapshot's end
            if not end.done():
                end.set_result(size)
            return
        size += len(msg.data)
        if msg.reply:
            await nc.publish(msg.reply, b"")

    sub = await nc.subscribe(inbox, cb=chunk)
    try:
        asked = {"deliver_subject": inbox, "chunk_size": 65536}
        reply = await nc.request(f"$JS.API.STREAM.SNAPSHOT.{stream}", json.dumps(asked).encode())
        assert json.loads(reply.data).get("error") is None, (stream, reply.data)
        return await asyncio.wait_for(end, 30)
    finally:
        await sub.unsubscribe()


async def test_the_operator_backs_up_what_the_table_says_on_its_own_inbox(
    secured: Secured,
) -> None:
    streams = backed_up()
    assert {"IL_RUNS", "IL_TIMERS", "KV_il_workflows", SECRETS} <= set(streams), streams
    await secured.operator.start("awaiting", {}, run_id="backed-up")
    refusals = Refusals()
    nc = await connect(secured, secured.auth.operator, refusals, inbox=True)
    try:
        for stream in streams:
            if stream != SECRETS:
                assert await snapshot(nc, stream) > 0, stream
        # `nats kv get il_secrets shared.log-key`: a direct get of the key's subject.
        key = "$JS.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.shared.log-key"
        got = await nc.request(key, b"", timeout=10)
        assert (got.headers or {}).get("Nats-Subject") == "$KV.il_secrets.shared.log-key"
        assert got.data
        with pytest.raises(nats.errors.TimeoutError):
            await snapshot_refused(nc, SECRETS)
        said = await refusals.wait_for("permissions violation", "snapshot.kv_il_secrets")
        assert "publish" in said
    finally:
        await nc.close()
    orchestrator = await connect(secured, secured.auth.orchestrator, Refusals(), inbox=True)
    try:
        assert await snapshot(orchestrator, SECRETS) > 0
    finally:
        await orchestrator.close()


async def snapshot_refused(nc: Client, stream: str) -> None:
    asked = {"deliver_subject": nc.new_inbox(), "chunk_size": 65536}
    await nc.request(f"$JS.API.STREAM.SNAPSHOT.{stream}", json.dumps(asked).encode(), timeout=2)


async def test_without_its_inbox_the_operator_is_never_answered(secured: Secured) -> None:
    refusals = Refusals()
    nc = await connect(secured, secured.auth.operator, refusals, inbox=False)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request("$JS.API.STREAM.INFO.IL_RUNS", b"", timeout=2)
        said = await refusals.wait_for("permissions violation", "subscription", "_inbox")
        assert "_inbox." in said.lower()
    finally:
        await nc.close()
