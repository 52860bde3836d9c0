"""An installation made when every party was a user of one account: its credentials keep
working (the HTTP gateway's too); the orchestrator answers none of their requests on a
subject that is not an inbox; ``interlock creds upgrade`` gives its agents, publishers and
gateways accounts of their own, the new credentials work, and revoking the old ones cuts
them off."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from nats.errors import Error as NatsError

from interlock.auth.accounts import JS_API_TAG
from interlock.auth.dev import DevAuth, prepare
from interlock.auth.jwt import creds_tags, creds_user
from interlock.auth.keys import KeyStore
from interlock.auth.roles import Role, inbox_prefix
from interlock.cli.dev import REFERENCE, reference_capabilities, start_stack, stop_stack
from interlock.core.engine import derive_run_id
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.answering import REPLY_REFUSED
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.runs import utc_now
from interlock.sdk import Worker
from interlock.sdk.runner import load_worker
from interlock.transport.cloudevents import CloudEvent, encode_structured
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from support.auth import MANIFESTS, SUBJECTS, old_layout
from support.runtime import interlock_bg

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
RUNS = SUBJECTS.runs_stream


@dataclass
class Old:
    server: EmbeddedNats
    auth: DevAuth
    creds: dict[str, Path]
    operator: InterlockClient
    home: Path
    stack: tuple[Any, list[Worker], list[asyncio.Task[None]], Any]

    async def cli(self, *args: str, creds: Path | None = None) -> tuple[int, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
        env["INTERLOCK_URL"] = self.server.url
        if creds is not None:
            env["INTERLOCK_CREDS"] = str(creds)
        proc = await asyncio.create_subprocess_exec(
            INTERLOCK,
            *args,
            cwd=self.home,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()

    async def emitted_run_completes(self, creds: Path, event_id: str) -> None:
        """A publisher on ``creds`` publishes the trigger of ``echoing`` as an external
        system does (nats-py, structured mode, a JetStream ack); the run completes."""
        event = CloudEvent(
            id=event_id,
            source="https://acme.example",
            type="acme.echo.requested",
            time=utc_now(),
            datacontenttype="application/json",
            data={},
        )
        nc = await nats.connect(
            self.server.url,
            user_credentials=str(creds),
            inbox_prefix=inbox_prefix(creds_user(creds)),
            allow_reconnect=False,
        )
        try:
            headers, payload = encode_structured(event)
            ack = await nc.jetstream().publish(SUBJECTS.event(event.type), payload, headers=headers)
            assert ack.stream == SUBJECTS.events_stream
        finally:
            await nc.close()
        definition, _ = await self.operator.registry.latest("echoing")
        run_id = derive_run_id(definition, event.source, event.id)
        state = await self.operator.wait(run_id, timeout=30)
        assert state.status == "completed"


async def gateway_serves(old: Old, creds: Path) -> None:
    """The HTTP gateway on ``creds``: a run started over HTTP completes, its result read
    back, and ``GET /live/runs`` hears its index entry written."""
    opts = ConnectOptions.resolve(old.server.url, creds_file=str(creds), name="gateway")
    nc = await connect(opts)
    gateway = Gateway(nc, SUBJECTS)
    server = HttpServer(build_app(gateway), 0, host="127.0.0.1")
    await server.start()
    token = await Tokens(old.operator.js, SUBJECTS).issue(f"ops-{creds.parent.name}", "operator")
    try:
        changes = await gateway.run_list.follow()
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            run_id = (await http.post("/runs", json={"workflow": "echoing"})).json()["run_id"]
            got = await http.get(f"/runs/{run_id}/result", params={"timeout": 30})
            assert got.json()["status"] == "completed", got.text
        while (change := await asyncio.wait_for(changes.get(), 10)) and change[0] != run_id:
            pass
        assert change is not None
    finally:
        await server.stop()
        await gateway.stop()
        await nc.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def old(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Old]:
    home = tmp_path_factory.mktemp("old")
    data = home / ".interlock"
    keys = KeyStore(data / "keys").ensure()
    creds_dir = data / "creds"
    creds_dir.mkdir()
    for role in ("orchestrator", "operator"):
        text, _ = keys.issue(Role(role), SUBJECTS, name=f"dev-{role}")
        (creds_dir / f"{role}.creds").write_text(text)
    creds = old_layout(
        keys,
        {
            "agents": Role("agent", capabilities=tuple(reference_capabilities())),
            "acme": Role("publisher", events=("acme.>",)),
            "gateway": Role("gateway"),
        },
        creds_dir,
    )
    (data / "jwt").mkdir()
    config = data / "auth.conf"
    config.write_text(keys.server_config((data / "jwt").resolve()))
    auth = DevAuth(keys=keys, config=config, creds_dir=creds_dir)
    server = EmbeddedNats(data, args=auth.server_args).start()
    stack = await start_stack(server.url, auth=auth)
    nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
    client = InterlockClient(nc, SUBJECTS)
    (await client.apply([("<upgrade>", MANIFESTS)])).compiled.raise_for_errors()
    try:
        yield Old(server=server, auth=auth, creds=creds, operator=client, home=home, stack=stack)
    finally:
        await nc.close()
        await stop_stack(*stack)
        server.stop()


async def test_the_old_credentials_work_and_the_orchestrator_replies_only_to_inboxes(
    old: Old,
) -> None:
    await old.emitted_run_completes(old.creds["acme"], "before-upgrade")
    run_id = await old.operator.start("guarded", {})
    await asyncio.sleep(0.5)
    runs_before = (await old.operator.js.stream_info(RUNS)).state.messages
    # An agent of the shared account names the reply subject of its answer request: the
    # JetStream API, a run log. The orchestrator's reply would be written with its rights.
    agent = old.creds["agents"]
    nc = await nats.connect(
        old.server.url,
        user_credentials=str(agent),
        inbox_prefix=inbox_prefix(creds_user(agent)),
        allow_reconnect=False,
    )
    try:
        for reply in (f"$JS.API.STREAM.PURGE.{RUNS}", SUBJECTS.run(run_id)):
            await nc.publish(SUBJECTS.answer("echo", run_id), b"{}", reply=reply)
        await nc.flush()
    finally:
        await nc.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while len(letters := await old.operator.dead_letters(REPLY_REFUSED)) < 2:
        assert loop.time() < deadline, "the refused replies were not dead-lettered"
        await asyncio.sleep(0.1)
    assert all("is not an inbox" in letter.detail for letter in letters)
    assert (await old.operator.js.stream_info(RUNS)).state.messages >= runs_before
    assert [r for r in await old.operator.read(run_id) if "forged" in repr(r)] == []


async def test_a_gateway_on_an_old_credential_says_to_replace_it(old: Old) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env.update(INTERLOCK_URL=old.server.url, INTERLOCK_CREDS=str(old.creds["gateway"]))
    gateway = interlock_bg("gateway", "--http-port", "0", "--host", "127.0.0.1", env=env)
    try:
        warned = await gateway.await_line(r"warning: .* of the orchestrator's account")
        assert "interlock creds upgrade" in warned.string
        await gateway.await_line("HTTP gateway at")  # it serves all the same
    finally:
        assert gateway.stop() == 0


async def test_creds_upgrade_gives_parties_accounts_of_their_own(old: Old) -> None:
    keys = str(old.auth.keys.dir)
    code, listed = await old.cli("creds", "list", "--keys", keys)
    assert code == 0, listed
    assert listed.count("SHARED-ACCOUNT") == 3

    code, out = await old.cli("creds", "upgrade", "-o", str(old.home / "new"), "--keys", keys)
    assert code == 0, out
    assert "pushed" in out
    new = {name: old.home / "new" / f"{name}.creds" for name in ("agents", "acme", "gateway")}
    assert all(path.is_file() for path in new.values())
    # Until revoked, the old credentials work (the agents serving are still on theirs).
    await old.emitted_run_completes(old.creds["acme"], "old-after-upgrade")
    await gateway_serves(old, old.creds["gateway"])
    code, listed = await old.cli("creds", "list", "--keys", keys)
    assert listed.count("SHARED-ACCOUNT") == 3
    # The new gateway credential: a user of an account of its own, serving the same.
    assert JS_API_TAG + SUBJECTS.party_js_api in creds_tags(str(new["gateway"]))
    await gateway_serves(old, new["gateway"])

    # The new ones: the agents restarted on theirs, a run started by the new publisher.
    for worker in old.stack[1]:
        await worker.stop()
    for task in old.stack[2]:
        await asyncio.wait_for(task, 10)
    agents = ConnectOptions.resolve(old.server.url, creds_file=str(new["agents"]))
    workers = [load_worker(name) for name in REFERENCE]
    serving = [asyncio.create_task(w.run(agents)) for w in workers]
    try:
        await old.emitted_run_completes(new["acme"], "new-after-upgrade")
    finally:
        for worker in workers:
            await worker.stop()
        await asyncio.gather(*serving)

    # Revoking the old ones cuts them off; the new ones stay.
    (line,) = [line for line in out.splitlines() if "still work" in line]
    olds = re.findall(r"\bU[A-Z2-7]{55}\b", line)
    assert len(olds) == 3, out
    code, done = await old.cli("creds", "revoke", *olds, "--keys", keys)
    assert code == 0, done
    with pytest.raises(NatsError, match=r"(?i)revoked|authorization violation"):
        await nats.connect(
            old.server.url, user_credentials=str(old.creds["acme"]), allow_reconnect=False
        )
    nc = await nats.connect(
        old.server.url, user_credentials=str(new["acme"]), allow_reconnect=False
    )
    await nc.close()
    code, listed = await old.cli("creds", "list", "--keys", keys)
    assert "SHARED-ACCOUNT" not in listed


async def test_interlock_dev_moves_its_gateway_to_an_account_of_its_own(tmp_path: Path) -> None:
    """A data folder whose gateway credential was a user of the orchestrator's account:
    the next ``interlock dev`` signs the same user key in an account of its own, and its
    JWTs of the shared account are revoked."""
    data = tmp_path / ".interlock"
    keys = KeyStore(data / "keys").ensure()
    (data / "creds").mkdir(parents=True)
    old_creds = old_layout(keys, {"gateway": Role("gateway")}, data / "creds")["gateway"]
    user = creds_user(old_creds)
    assert JS_API_TAG + SUBJECTS.party_js_api not in creds_tags(str(old_creds))
    auth = prepare(data, SUBJECTS, reference_capabilities())
    assert creds_user(auth.gateway) == user
    assert JS_API_TAG + SUBJECTS.party_js_api in creds_tags(str(auth.gateway))
    (record,) = [i for i in keys.issued() if i.public_key == user]
    assert record.account is not None
    assert not record.old_layout
    assert user in keys.revocations()  # the orchestrator's account: its old JWT is void
