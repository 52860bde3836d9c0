"""Events of 10 MB, by reference, on a real nats-server with Interlock's auth: through
``interlock emit`` on a publisher's credential (issued as ``interlock creds issue``
makes it), and as a CloudEvent POSTed to the HTTP gateway, which runs on its own gateway
credential; the run's result, with a 10 MB output, read back over HTTP. A publisher that
replaces an object a run references gets it refused by the digest check: before the
orchestrator took it (the event is dead-lettered, no run starts), and after (reading the
run's records says which object no longer matches; no decision changes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import pytest_asyncio
from nats.js.object_store import ObjectStore

from interlock.auth.dev import DevAuth
from interlock.auth.jwt import creds_tags, creds_user
from interlock.auth.roles import Role, inbox_prefix
from interlock.cli.dev import start_stack, stop_stack
from interlock.client import Client
from interlock.core import events as ev
from interlock.core.objects import ObjectError, digest_of, name_of, parse_ref
from interlock.gateway.app import build_app
from interlock.gateway.auth import Tokens
from interlock.gateway.service import Gateway
from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.payloads import run_objects
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from interlock.transport.objects import store_object, stream_of
from support.auth import SUBJECTS, Secured, secured_server

__all__ = ["secured_server"]  # fixtures

pytestmark = pytest.mark.timeout(180)

BIG = 10 * 1000 * 1000
INTERLOCK = str(Path(sys.executable).with_name("interlock"))

MANIFEST = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: ingest}
    spec:
      inputs:
        blob: {type: string, required: true}
      triggers:
        - event: acme.bulk.posted
          input: {blob: "{{ data.blob }}"}
      initial_state: hold
      states:
        hold:
          type: human_in_the_loop
          on:
            - {event: acme.bulk.more, guard: 'size(inputs.blob) > 1000000', goto: done}
        done:
          type: terminal
          outputs:
            size: "{{ size(inputs.blob) }}"
            blob: "{{ inputs.blob }}"
    """
)

LEDGER = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: ledger}
    spec:
      inputs:
        account: {type: string, required: true}
      correlate:
        key: "{{ inputs.account }}"
        events: {acme.ledger.entry: data.account}
      initial_state: open
      states:
        open:
          on:
            - event: acme.ledger.entry
              guard: 'size(data.blob) > 300000'
              goto: done
              set: {size: "{{ size(data.blob) }}"}
        done:
          type: terminal
          outputs:
            size: "{{ context.size }}"
    """
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(secured_server: tuple[EmbeddedNats, DevAuth, Path]) -> AsyncIterator[Secured]:
    server, auth, data = secured_server
    running = await start_stack(server.url, auth=auth, agents=False)
    client = await Client.connect(server.url, creds=auth.operator)
    applied = await client.ops.apply([("<events>", MANIFEST), ("<ledger>", LEDGER)])
    applied.compiled.raise_for_errors()
    secured = Secured(server=server, auth=auth, data=data, operator=client.ops)
    secured.orchestrator = running[0]
    try:
        yield secured
    finally:
        await client.close()
        await stop_stack(*running)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK, *args, env=_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _run_of(client: Client, event_id: str) -> str:
    """The run the event with ``event_id`` started (read from the runs' first records)."""
    for _ in range(600):
        for summary in await client.runs(workflow="ingest"):
            [started] = (await client.ops.read(summary.run_id))[:1]
            assert isinstance(started, ev.RunStarted)
            if (started.data.trigger or {}).get("id") == event_id:
                return summary.run_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"no run started by event {event_id}")


async def _dead_letter(client: Client, run_id: str) -> Any:
    for _ in range(600):
        found = [d for d in await client.dead_letters("bad-object") if run_id in d.subject]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no bad-object dead letter for {run_id}")


def _publisher(stack: Secured, name: str) -> tuple[Path, str]:
    creds = stack.issue(Role("publisher", events=("acme.>",)), name)
    [bucket] = [t.removeprefix("objects:") for t in creds_tags(creds) if t.startswith("objects:")]
    return creds, bucket


@pytest.mark.asyncio(loop_scope="module")
async def test_a_10_mb_event_through_interlock_emit_on_a_publishers_credential(
    stack: Secured, tmp_path: Path
) -> None:
    creds, bucket = _publisher(stack, "bulk-publisher")
    data = tmp_path / "event.json"
    data.write_text(json.dumps({"blob": "e" * BIG}))
    code, _, err = await _cli(
        "emit", "acme.bulk.posted", "--source", "https://acme.example", "--id", "bulk-1",
        "--data", f"@{data}", "--creds", str(creds), "-s", stack.url, "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    client = await Client.connect(stack.url, creds=stack.auth.operator)
    try:
        run_id = await _run_of(client, "bulk-1")
        # The log names the publisher's own bucket in the event's place.
        [started] = (await client.ops.read(run_id))[:1]
        assert isinstance(started, ev.RunStarted)
        assert started.data.trigger is not None
        # The log names the run's own copy; the publisher's upload stays in its bucket.
        ref = parse_ref(started.data.trigger["data"])
        assert ref.bucket == SUBJECTS.objects_bucket
        assert ref.name.startswith(f"{run_id}.")
        info = await client.ops.js.stream_info(stream_of(bucket))
        assert info.state.bytes > BIG
        moved = await client.signal(run_id, "acme.bulk.more", {})
        assert moved.outcome == "moved", moved
        result = await client.result(run_id, wait=True, timeout=60)
        assert result.outputs is not None
        assert result.outputs["size"] == BIG
        assert result.outputs["blob"] == "e" * BIG
        # Deleted with an archive: the file holds the payloads, and replays with no server.
        refs = await run_objects(SUBJECTS, await client.ops.read(run_id), run_id)
        deleted = await client.delete_run(run_id, archive_dir=str(tmp_path / "archive"))
        assert deleted.archived_to is not None
        for gone in refs:
            with pytest.raises(ObjectError, match="not found"):
                await client.ops.payloads.objects.get(gone)
        code, out, err = await _cli("replay", "--file", deleted.archived_to, "--json")
        assert code == 0, err
        assert "e" * BIG in out
    finally:
        await client.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_10_mb_cloudevent_posted_to_the_gateway(stack: Secured) -> None:
    nc = await connect(ConnectOptions.resolve(stack.url, creds_file=str(stack.auth.gateway)))
    gateway = Gateway(nc, SUBJECTS)
    await gateway.start()
    server = HttpServer(build_app(gateway, console=None), 0)
    await server.start()
    operator = await Client.connect(stack.url, creds=stack.auth.operator)
    tokens = Tokens(operator.ops.js, SUBJECTS)
    publisher = await tokens.issue("bulk-http", "publisher", ["acme.>"])
    reader = await tokens.issue("bulk-reader", "operator")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            body = json.dumps({"blob": "h" * BIG})
            posted = await http.post(
                "/events",
                content=body,
                headers={
                    "Authorization": f"Bearer {publisher}",
                    "ce-specversion": "1.0",
                    "ce-id": "bulk-http-1",
                    "ce-source": "https://acme.example",
                    "ce-type": "acme.bulk.posted",
                    "Content-Type": "application/json",
                },
            )
            assert posted.status_code == 202, posted.text
            run_id = await _run_of(operator, "bulk-http-1")
            auth = {"Authorization": f"Bearer {reader}"}
            signalled = await http.post(
                f"/runs/{run_id}/signals/acme.bulk.more", json={}, headers=auth
            )
            assert signalled.json()["outcome"] == "moved", signalled.text
            got = await http.get(f"/runs/{run_id}/result", params={"timeout": 60}, headers=auth)
            assert got.status_code == 200, got.text[:500]
            outputs = got.json()["outputs"]
            assert outputs["size"] == BIG
            assert outputs["blob"] == "h" * BIG
            # A run started over HTTP with large inputs: stored by the gateway, read whole.
            blob = "i" * 2_000_000
            started = await http.post(
                "/runs", json={"workflow": "ingest", "inputs": {"blob": blob}}, headers=auth
            )
            assert started.status_code == 201, started.text
            begun = started.json()["run_id"]
            described = await http.get(f"/runs/{begun}", headers=auth)
            assert described.json()["inputs"] == {"blob": blob}
            [first] = (await operator.ops.read(begun))[:1]
            assert isinstance(first, ev.RunStarted)
            assert parse_ref(first.data.inputs).name.startswith(f"{begun}.")
            explained = (await http.get(f"/runs/{begun}/explain", headers=auth)).json()
            assert explained["reproduces"] is True, explained.get("mismatch")
            replayed = (await http.get(f"/runs/{begun}/replay?against=1", headers=auth)).json()
            assert replayed["agree"] is True, replayed.get("divergence")
    finally:
        await operator.close()
        await server.stop()
        await gateway.stop()
        await nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_large_event_reaches_the_run_its_correlation_key_names(
    stack: Secured, tmp_path: Path
) -> None:
    """``interlock emit`` of an event over the threshold, on a publisher's credential,
    whose ``data.account`` names a running run: the key is read from the event's data,
    not from the reference that stands for it, and the run takes it."""
    creds, _ = _publisher(stack, "ledger-publisher")
    client = await Client.connect(stack.url, creds=stack.auth.operator)
    try:
        run_id = await client.start("ledger", {"account": "acct-7"})
        data = tmp_path / "entry.json"
        data.write_text(json.dumps({"account": "acct-7", "blob": "l" * 400_000}))
        code, _, err = await _cli(
            "emit", "acme.ledger.entry", "--source", "https://acme.example", "--id", "entry-1",
            "--data", f"@{data}", "--creds", str(creds), "-s", stack.url,
        )  # fmt: skip
        assert code == 0, err
        result = await client.result(run_id, wait=True, timeout=30)
        assert result.status == "completed", result
        assert result.outputs == {"size": 400_000}
        # Its own version explains and replays it, deciding on the event it loaded.
        operator = str(stack.auth.operator)
        code, out, err = await _cli(
            "explain", run_id, "--json", "--creds", operator, "-s", stack.url
        )
        assert code == 0, err
        assert json.loads(out)["reproduces"] is True, out[:2000]
        code, out, err = await _cli(
            "replay", run_id, "--against", "1", "--creds", operator, "-s", stack.url
        )
        assert code == 0, out[:2000]
        (tmp_path / "ledger.yaml").write_text(LEDGER)
        code, out, err = await _cli(
            "shadow", "ledger", "--candidate", str(tmp_path / "ledger.yaml"), "--json",
            "--creds", operator, "-s", stack.url,
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["diverge"] == 0, out[:2000]
    finally:
        await client.close()


async def _plain_publisher(stack: Secured, creds: Path) -> Any:
    return await nats.connect(
        stack.url, user_credentials=str(creds), inbox_prefix=inbox_prefix(creds_user(creds))
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_a_publisher_replacing_an_object_before_it_is_taken_starts_nothing(
    stack: Secured,
) -> None:
    creds, bucket = _publisher(stack, "bulk-tamper-before")
    nc = await _plain_publisher(stack, creds)
    js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=0.5)  # a refused purge: no reply
    store = ObjectStore(bucket, stream_of(bucket), js)
    try:
        data = json.dumps({"blob": "t" * 2_000_000}).encode()
        info = await store.put("doc", data)
        ref = {"bucket": bucket, "name": "doc", "size": info.size, "digest": info.digest}
        # The same name, other bytes (the meta is replaced; its put may not purge the old
        # chunks, and raises then).
        with contextlib.suppress(Exception):
            await store.put("doc", json.dumps({"blob": "short"}).encode())
        headers = {
            "ce-specversion": "1.0", "ce-id": "tampered-1", "ce-source": "https://acme.example",
            "ce-type": "acme.bulk.posted", "Content-Type": "application/json",
        }  # fmt: skip
        body = json.dumps({"$object": ref}).encode()
        await js.publish(f"{SUBJECTS.prefix}.events.acme.bulk.posted", body, headers=headers)
    finally:
        await nc.close()
    client = await Client.connect(stack.url, creds=stack.auth.operator)
    try:
        for _ in range(600):
            letters = [
                d
                for d in await client.dead_letters("bad-object")
                if "tampered-1" in json.dumps(d.headers)
            ]
            if letters:
                break
            await asyncio.sleep(0.05)
        assert letters, "the event was not dead-lettered"
        assert "digest mismatch" in letters[0].detail
        assert not [
            s for s in await client.runs(workflow="ingest")
            if ((await client.ops.read(s.run_id))[0].data.trigger or {}).get("id") == "tampered-1"  # type: ignore[union-attr]
        ]  # fmt: skip
    finally:
        await client.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_changed_object_of_a_run_fails_its_reads_and_changes_no_decision(
    stack: Secured, tmp_path: Path
) -> None:
    """What a run's log references is the run's own copy: the publisher replacing its
    upload afterwards changes nothing. Whoever could write the orchestrator's account
    and changed the copy gets every read of it refused (``digest mismatch``, naming the
    object): the next event is dead-lettered and the run does not move; ``export``
    fails saying so. Deleting the run deletes its objects."""
    creds, bucket = _publisher(stack, "bulk-after")
    data = tmp_path / "event.json"
    data.write_text(json.dumps({"blob": "a" * 1_000_001}))
    async with await Client.connect(stack.url, creds=creds) as publisher:
        await publisher.emit(
            type="acme.bulk.posted", source="https://acme.example", id="after-1",
            data=json.loads(data.read_text()), wait=0,
        )  # fmt: skip
    client = await Client.connect(stack.url, creds=stack.auth.operator)
    operator = str(stack.auth.operator)
    try:
        run_id = await _run_of(client, "after-1")
        # The publisher puts other bytes under the name of its upload: nothing changes.
        upload = name_of(digest_of(data.read_bytes().replace(b" ", b"")))
        nc = await _plain_publisher(stack, creds)
        try:
            js = nc.jetstream(prefix=SUBJECTS.party_js_api, timeout=0.5)
            store = ObjectStore(bucket, stream_of(bucket), js)
            with contextlib.suppress(Exception):  # the meta is replaced before the purge fails
                await store.put(upload, json.dumps({"blob": "forged"}).encode())
        finally:
            await nc.close()
        loaded = await client.records(run_id)
        assert isinstance(loaded[0], ev.RunStarted)
        assert loaded[0].data.inputs["blob"] == "a" * 1_000_001
        # The run's own copy of its inputs, changed in the orchestrator's account.
        [started] = (await client.ops.read(run_id))[:1]
        assert isinstance(started, ev.RunStarted)
        ref = parse_ref(started.data.inputs)
        # (Its bucket takes no rollup: written as Interlock writes, a meta without one.)
        await store_object(
            client.ops.js, ref.bucket, ref.name, b'{"blob": "' + b"b" * 1_000_001 + b'"}'
        )
        # An orchestrator without the value at hand (restarted, or its cache moved on).
        stack.orchestrator.payloads.forget()
        said = await client.signal(run_id, "acme.bulk.more", {}, wait=0.5)
        assert said.outcome == "unanswered", said
        letter = await _dead_letter(client, run_id)
        assert "digest mismatch" in letter.detail
        assert ref.name in letter.detail
        assert (await client.run(run_id)).state == "hold"
        client.ops.payloads.forget()  # this client read it before the change
        with pytest.raises(ObjectError, match="digest mismatch"):
            await client.records(run_id)
        code, _, err = await _cli("export", run_id, "--creds", operator, "-s", stack.url)
        assert code != 0
        assert "digest mismatch" in err
        assert ref.name in err
        # Ended, then deleted: its objects go with its log.
        await client.cancel(run_id)
        refs = await run_objects(SUBJECTS, await client.ops.read(run_id), run_id)
        assert refs
        # Its archive would not hold the run's payloads: refused, nothing deleted.
        with pytest.raises(ObjectError, match="digest mismatch"):
            await client.delete_run(run_id, archive_dir=str(tmp_path / "archive"))
        assert await client.ops.read(run_id)
        deleted = await client.delete_run(run_id)
        assert deleted.records > 0
        for gone in refs:
            with pytest.raises(ObjectError, match="not found"):
                await client.ops.payloads.objects.get(gone)
    finally:
        await client.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_an_export_keeps_each_large_payload_once_and_replays_with_no_server(
    stack: Secured, tmp_path: Path
) -> None:
    """A 2 MB event carried into the run's inputs, its trigger and an output: the export
    writes each value once, named by its digest where it stood, and replay and explain of
    the file (no server) see every value; an export of the earlier form (each payload in
    its records) reads as before."""
    size = 2 * 1000 * 1000
    creds, _ = _publisher(stack, "export-publisher")
    data = tmp_path / "event.json"
    data.write_text(json.dumps({"blob": "x" * size}))
    code, _, err = await _cli(
        "emit", "acme.bulk.posted", "--source", "https://acme.example", "--id", "export-1",
        "--data", f"@{data}", "--creds", str(creds), "-s", stack.url, "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    client = await Client.connect(stack.url, creds=stack.auth.operator)
    try:
        run_id = await _run_of(client, "export-1")
        assert (await client.signal(run_id, "acme.bulk.more", {})).outcome == "moved"
        await client.result(run_id, wait=True, timeout=60)
        loaded = await client.records(run_id)
    finally:
        await client.close()
    operator = str(stack.auth.operator)
    exported = tmp_path / "run.jsonl"
    code, _, err = await _cli("export", run_id, "-o", str(exported), "--creds", operator,
                              "-s", stack.url)  # fmt: skip
    assert code == 0, err
    lines = exported.read_bytes().splitlines()
    objects = [json.loads(line) for line in lines if line.startswith(b'{"object":')]
    # The event's data and the inputs it made are one value; the output blob another.
    assert sorted(type(o["value"]).__name__ for o in objects) == ["dict", "str"]
    assert len({o["object"] for o in objects}) == len(objects)
    inline = sum(len(ev.encode(r)) + 1 for r in loaded)  # every payload in its records
    assert exported.stat().st_size < 2.1 * size < 2.9 * size < inline
    # Replay with no server: every place the value stood holds it again.
    code, replayed, err = await _cli("replay", "--file", str(exported), "--json")
    assert code == 0, err
    assert replayed.count("x" * size) >= 3
    manifest = tmp_path / "ingest.yaml"
    manifest.write_text(MANIFEST)
    code, out, err = await _cli("explain", "--file", str(exported), "--workflow", str(manifest))
    assert code == 0, err
    assert "does not reproduce" not in out
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(ev.encode(r) + b"\n" for r in loaded))
    code, again, err = await _cli("replay", "--file", str(old), "--json")
    assert code == 0, err
    assert again == replayed
