"""A damaged secret stops ``interlock serve`` with what is wrong and how to restore it
(and it starts again once that is done); an installation made before rollups were refused
on the workers bucket gets the setting on its next provisioning; a fired timer whose
delivery keeps failing is dead-lettered after a bound, not tried again for ever."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.runtime.timers import JetStreamTimers
from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from interlock.transport.tokens import TOKEN_KEY

LOG_KEY = "shared.log-key"
"""The log key's key in the secrets bucket (docs/operations.md)."""
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "code-review-cancelled.jsonl"
INTERLOCK = os.path.join(os.path.dirname(sys.executable), "interlock")


async def test_an_older_installation_gets_no_rollups_on_its_next_provisioning(
    js: JetStreamContext, subjects: Subjects
) -> None:
    await provision(js, subjects)
    name = f"KV_{subjects.workers_bucket}"
    info = await js.stream_info(name)
    config = info.config
    config.allow_rollup_hdrs = True  # as made before
    await js.update_stream(config)
    assert (await js.stream_info(name)).config.allow_rollup_hdrs
    await provision(js, subjects)
    assert not (await js.stream_info(name)).config.allow_rollup_hdrs


async def test_a_fired_timer_that_keeps_failing_is_dead_lettered(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    await provision(js, subjects)
    timers = JetStreamTimers(nc, subjects, max_deliveries=3, retry_cap=0.1)
    tried: list[str] = []

    async def deliver(run_id: str, timer_id: str) -> None:
        tried.append(timer_id)
        raise RuntimeError("cannot be handled")

    timers.start(deliver)
    try:
        body = json.dumps({"run_id": "r1", "timer_id": "t1"}).encode()
        await js.publish(subjects.timer_fired("r1"), body)
        for _ in range(200):
            info = await js.stream_info(subjects.dead_letter_stream)
            if info.state.messages:
                break
            await asyncio.sleep(0.05)
        letter = await js.get_msg(
            subjects.dead_letter_stream, subject=subjects.dead_letter("timer-failed")
        )
        assert letter.headers
        assert "failed 3 times" in letter.headers["Interlock-Dead-Letter-Detail"]
        await asyncio.sleep(0.5)
        assert tried == ["t1"] * 3
    finally:
        await timers.stop()


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        (TOKEN_KEY, b"not base64!", "not base64"),
        (TOKEN_KEY, base64.b64encode(b"short"), "5 bytes"),
        (LOG_KEY, b"junk", "not JSON"),
        (LOG_KEY, json.dumps({"key": "AAAA", "signed_after": 0}).encode(), "the key has 3 bytes"),
    ],
)
async def test_a_damaged_secret_stops_serve_with_how_to_restore_it(
    nats_url: str, js: JetStreamContext, key: str, value: bytes, said: str
) -> None:
    subjects = Subjects(f"t{uuid.uuid4().hex[:12]}")
    await provision(js, subjects)
    secrets = await js.key_value(subjects.secrets_bucket)
    await secrets.create(key, value)
    env = dict(os.environ)
    env.pop("NATS_URL", None)
    env.update(INTERLOCK_URL=nats_url, INTERLOCK_PREFIX=subjects.prefix)
    done = await asyncio.to_thread(
        subprocess.run,
        [INTERLOCK, "serve", "--metrics-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"the secret {subjects.secrets_bucket}/{key} is damaged ({said}" in done.stderr
    purge = f"nats stream purge KV_{subjects.secrets_bucket} --subject"
    assert purge in done.stderr
    # What it says to do, done through the API (the nats CLI's purge): it starts again.
    filter_ = f"$KV.{subjects.secrets_bucket}.{key}"
    reply = await js._nc.request(
        f"$JS.API.STREAM.PURGE.KV_{subjects.secrets_bucket}",
        json.dumps({"filter": filter_}).encode(),
    )
    assert json.loads(reply.data)["success"]
    served = await asyncio.create_subprocess_exec(
        INTERLOCK, "serve", "--metrics-port", "0", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert served.stderr is not None
        line = b""
        for _ in range(200):
            line = await asyncio.wait_for(served.stderr.readline(), 60)
            if b"orchestrator started" in line or not line:
                break
        assert b"orchestrator started" in line, line
    finally:
        served.terminate()
        await served.wait()


async def test_a_log_written_before_the_log_key_still_reads(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    """An installation upgraded from a version without the record MAC: a run's log written
    then (no MAC) reads whole once the key is made; what lands after the key without a
    MAC (a foreign message, or an older writer still running) is skipped, and appends go
    on after it."""
    from interlock.core import events as ev
    from interlock.core.state import fold
    from interlock.runtime.logstore import RunLog

    await provision(js, subjects)
    records = ev.decode_lines(GOLDEN.read_bytes())
    run_id = records[0].subject
    headers = {"Content-Type": ev.BATCH_CONTENT_TYPE}
    for record in records:  # as the older version appended them: one decision each
        await js.publish(subjects.run(run_id), ev.encode_batch([record]), headers=headers)
    log = RunLog(nc, subjects)
    key = await log.key()  # made now, after those records
    read, last = await log.read(run_id)
    assert [ev.encode(r) for r in read] == [ev.encode(r) for r in records]
    assert key.signed_after == last
    assert fold(read) == fold(records)
    # After the key, a message without a MAC is foreign, whatever it holds.
    await js.publish(subjects.run(run_id), ev.encode_batch([records[-1]]), headers=headers)
    found = await log.read_checked(run_id)
    assert len(found.messages) == len(records)
    assert [f.why for f in found.foreign] == ["it carries no record MAC"]
    assert found.last == last + 1


async def test_the_gateway_answers_503_saying_the_log_key_is_damaged(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    import httpx

    from interlock.gateway.app import build_app
    from interlock.gateway.auth import Tokens
    from interlock.gateway.service import Gateway
    from interlock.transport.httpserver import HttpServer

    await provision(js, subjects)
    secrets = await js.key_value(subjects.secrets_bucket)
    await secrets.create(LOG_KEY, b"junk")
    await js.publish(subjects.run("rdamaged"), b"[]")
    token = await Tokens(js, subjects).issue("ops", "operator")
    gateway = Gateway(nc, subjects)
    await gateway.start()
    server = HttpServer(build_app(gateway), 0, host="127.0.0.1")
    await server.start()
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            for path in ("/runs/rdamaged", "/runs/rdamaged/log"):
                r = await http.get(path)
                assert r.status_code == 503, r.text
                problem = r.json()
                assert problem["type"].endswith("/log-key-unavailable")
                assert (
                    f"{subjects.secrets_bucket}/{LOG_KEY} is damaged (not JSON)"
                    in problem["detail"]
                )
    finally:
        await server.stop()
        await gateway.stop()
