"""Who may read and write which object bucket, tried by the party that would try it, with
plain nats-py on a credential issued as ``interlock creds issue`` makes it: an agent
reading another capability's task inputs or another party's uploads, a publisher writing
into another party's bucket or the orchestrator account's. Each is refused by the server
(no import leads there from the party's account, and its user's permissions deny it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as Nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_tags, creds_user
from interlock.auth.roles import Role, inbox_prefix
from interlock.cli.dev import start_stack, stop_stack
from interlock.client import Client
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.objects import Objects
from support.auth import SUBJECTS, Refusals, Secured, secured_server

__all__ = ["secured_server"]  # fixtures

pytestmark = pytest.mark.timeout(120)

API = SUBJECTS.party_js_api


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(secured_server: tuple[EmbeddedNats, DevAuth, Path]) -> AsyncIterator[Secured]:
    server, auth, data = secured_server
    running = await start_stack(server.url, auth=auth, agents=False)
    client = await Client.connect(server.url, creds=auth.operator)
    try:
        yield Secured(server=server, auth=auth, data=data, operator=client.ops)
    finally:
        await client.close()
        await stop_stack(*running)


async def _party(stack: Secured, role: Role, name: str) -> tuple[Nats, Refusals, str]:
    creds = stack.issue(role, name)
    stack.issued[name] = creds
    [bucket] = [t.removeprefix("objects:") for t in creds_tags(creds) if t.startswith("objects:")]
    refusals = Refusals()
    nc = await nats.connect(
        stack.url,
        user_credentials=str(creds),
        inbox_prefix=inbox_prefix(creds_user(creds)),
        error_cb=refusals.on_error,
        allow_reconnect=False,
    )
    return nc, refusals, bucket


async def _direct_get(nc: Nats, stream: str, subject: str, api: str = API) -> bytes | None:
    """What a direct get of the last message of ``subject`` returns (None: nothing
    answered it with a message)."""
    body = json.dumps({"last_by_subj": subject}).encode()
    try:
        msg = await nc.request(f"{api}.DIRECT.GET.{stream}", body, timeout=0.5)
    except (NoRespondersError, NatsTimeout):
        return None
    return msg.data if not (msg.headers or {}).get("Status") else None


@pytest.mark.asyncio(loop_scope="module")
async def test_an_agent_reads_its_own_capabilitys_inputs_and_nothing_else(stack: Secured) -> None:
    operator = stack.operator.payloads.objects
    own, other = SUBJECTS.inputs_bucket("ocr"), SUBJECTS.inputs_bucket("billing")
    for bucket in (own, other):
        await operator.ensure_bucket(bucket)
    mine = await operator.put(own, b'{"page": 1}')
    theirs = await operator.put(other, b'{"card": "4111"}')
    kept = await operator.put(SUBJECTS.objects_bucket, b'{"output": "secret"}')
    nc, refusals, _ = await _party(stack, Role("agent", capabilities=("ocr",)), "ocr-agent")
    try:
        # Its own capability's input: read, checked, as the SDK reads it.
        opts = ConnectOptions.resolve(stack.url, creds_file=str(stack.issued["ocr-agent"]))
        sdk = await connect(opts)
        try:
            assert await Objects(sdk).get(mine) == b'{"page": 1}'
        finally:
            await sdk.close()
        for ref in (theirs, kept):
            meta = f"$O.{ref.bucket}.M.{_b64(ref.name)}"
            assert await _direct_get(nc, f"OBJ_{ref.bucket}", meta) is None
            await refusals.wait_for("permissions violation", f"obj_{ref.bucket}".lower())
        # Nor through its account's own JetStream API: there is none (and it is denied).
        meta = f"$O.{other}.M.{_b64(theirs.name)}"
        assert await _direct_get(nc, f"OBJ_{other}", meta, api="$JS.API") is None
    finally:
        await nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_publisher_cannot_write_or_read_another_partys_objects(stack: Secured) -> None:
    victim, _, victim_bucket = await _party(
        stack, Role("publisher", events=("acme.>",)), "victim-publisher"
    )
    await victim.close()
    nc, refusals, own = await _party(stack, Role("publisher", events=("evil.>",)), "evil-pub")
    js = nc.jetstream(prefix=API, timeout=0.5)  # a refused request has no reply
    try:
        # Its own bucket takes its uploads.
        ack = await js.publish(f"$O.{own}.C.mine", b"chunk")
        assert ack.stream == f"OBJ_{own}"
        for bucket in (victim_bucket, SUBJECTS.objects_bucket, SUBJECTS.inputs_bucket("ocr")):
            with pytest.raises((NoRespondersError, NatsTimeout, nats.errors.Error)):
                await js.publish(f"$O.{bucket}.M.{_b64('doc')}", b"{}", timeout=0.5)
            await refusals.wait_for("permissions violation", f"$o.{bucket}".lower())
            assert await _direct_get(nc, f"OBJ_{bucket}", f"$O.{bucket}.M.{_b64('doc')}") is None
        # Nor purge its own (a put over an existing name may not clean up after itself).
        with pytest.raises((NoRespondersError, NatsTimeout, nats.errors.Error)):
            await js.purge_stream(f"OBJ_{own}")
        await asyncio.sleep(0)
    finally:
        await nc.close()
    info = await stack.operator.js.stream_info(f"OBJ_{victim_bucket}")
    assert info.state.messages == 0


def _b64(name: str) -> str:
    import base64

    return base64.urlsafe_b64encode(name.encode()).decode()
