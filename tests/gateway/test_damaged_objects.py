"""A run whose payload kept by reference was damaged in its object bucket (overwritten, as
an operator with the object store's rights could): explain, replay and the run's
description over HTTP on a real socket answer a problem body that names the value and why
(500 stored-object-damaged: the stored data is at fault, nothing the caller sent), and
``interlock explain`` says the same in one line and exits 1. A caller's own reference as a
signal's body is a 400."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from nats.js.object_store import ObjectStore

from interlock.transport.objects import store_object, stream_of
from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack
from support.runtime import cli_env, yaml

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
SIZE = 300 * 1024  # over the object threshold (256 KiB)

HOLDING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: holding}
    spec:
      inputs:
        blob: {type: string, required: true}
      initial_state: waiting
      states:
        waiting:
          on:
            - {event: finish, guard: "size(inputs.blob) > 0", goto: done}
        done: {type: terminal}
    """
)


async def test_a_damaged_stored_object_is_a_problem_naming_it(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        gateway_stack(nats_url, subjects, [HOLDING], max_body=1 << 20) as gs,
        gs.http() as http,
    ):
        # Started by another party than the gateway, which has not read it yet.
        run_id = await gs.stack.client.start("holding", {"blob": "i" * SIZE})
        bucket = subjects.objects_bucket
        store = ObjectStore(bucket, stream_of(bucket), gs.stack.js)
        names = [o.name for o in await store.list() if o.name.startswith(f"{run_id}.")]
        assert names, "the input was not stored by reference"
        for name in names:  # same name, other bytes: the digest no longer matches
            await store_object(gs.stack.js, bucket, name, b'"' + b"x" * SIZE + b'"')

        for path in (
            f"/runs/{run_id}/explain",
            f"/runs/{run_id}/replay?against=1",
            f"/runs/{run_id}",
        ):
            got = await http.get(path)
            assert got.status_code == 500, got.text[:500]
            assert got.headers["content-type"] == "application/problem+json"
            body = got.json()
            assert body["type"].endswith("/stored-object-damaged"), body
            assert f"{bucket}/{names[0]}" in body["detail"], body
            assert "digest mismatch" in body["detail"], body
            which = (  # the value: in the record that holds it, or in the run's view
                f"the inputs of record {run_id}:1 (io.interlock.run.started)"
                if path != f"/runs/{run_id}"
                else "the run's inputs"
            )
            assert which in body["detail"], body

        # A caller's own reference that names nothing stored: its request is refused.
        ref = {"$object": {"bucket": bucket, "name": f"{run_id}.nope", "size": 3,
                           "digest": "SHA-256=" + "A" * 43 + "="}}  # fmt: skip
        got = await http.post(f"/runs/{run_id}/signals/finish", json=ref)
        assert got.status_code == 400, got.text
        assert got.json()["type"].endswith("/invalid-reference"), got.text
        event = {"specversion": "1.0", "id": "e1", "source": "https://x.example",
                 "type": "go.go", "data": ref}  # fmt: skip
        got = await http.post(
            "/events", json=event, headers={"content-type": "application/cloudevents+json"}
        )
        assert got.status_code == 400, got.text
        assert got.json()["type"].endswith("/invalid-reference"), got.text
        assert await gs.stored_events() == 0  # nothing published
        # As a run's inputs: it names nothing stored (it was a 500 with no problem body).
        got = await http.post("/runs", json={"workflow": "holding", "inputs": ref})
        assert got.status_code == 400, got.text
        assert got.json()["type"].endswith("/invalid-reference"), got.text
        assert "not found" in got.json()["detail"], got.text

        # The command line says the same, exits non-zero, and prints no traceback.
        proc = await asyncio.create_subprocess_exec(
            INTERLOCK, "explain", run_id, "--server", nats_url, "--prefix", subjects.prefix,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=cli_env(nats_url, subjects.prefix),
        )  # fmt: skip
        out, errs = await asyncio.wait_for(proc.communicate(), 60)
        lines = errs.decode().splitlines()
        assert proc.returncode == 1, (out, errs)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"interlock: run {run_id}: the inputs"), lines
        assert "digest mismatch" in lines[0], lines
