"""Provisioning streams and buckets, and atomic appends, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from interlock.transport.appends import append_batch
from interlock.transport.errors import AppendConflict, JetStreamAPIError
from interlock.transport.provision import check_ready, provision
from interlock.transport.streamconfigs import desired_configs
from interlock.transport.subjects import Subjects


def _all_names(s: Subjects) -> list[str]:
    streams = [s.events_stream, s.runs_stream, s.tasks_stream, s.results_stream]
    streams += [s.dead_letter_stream, s.timers_stream, s.parked_stream, s.audit_stream]
    buckets = [s.workflows_bucket, s.agents_bucket, s.workers_bucket, s.runs_bucket]
    buckets += [s.snapshots_bucket]
    buckets += [
        s.correlation_bucket,
        s.slots_bucket,
        s.triggers_bucket,
        s.paused_bucket,
        s.partitions_bucket,
        s.secrets_bucket,
        s.webhooks_bucket,
    ]
    objects = [s.objects_bucket, s.uploads_bucket]
    return [*streams, *buckets, s.http_tokens_bucket, s.deliveries_bucket, *objects]


async def _api_calls(nc: Client, kind: str) -> list[str]:
    """Records the subjects of JetStream API requests of one kind (CREATE, UPDATE) on nc."""
    seen: list[str] = []

    async def record(msg: Msg) -> None:
        seen.append(msg.subject)

    await nc.subscribe(f"$JS.API.STREAM.{kind}.>", cb=record)
    return seen


# --- provision ------------------------------------------------------------------------


async def test_provision_creates_everything(js: JetStreamContext, subjects: Subjects) -> None:
    assert await check_ready(js, subjects) == _all_names(subjects)
    await provision(js, subjects, event_max_age_s=3600)
    assert await check_ready(js, subjects) == []

    events = (await js.stream_info(subjects.events_stream)).config
    assert events.subjects == [subjects.events_all]
    assert events.max_age == 3600
    assert events.duplicate_window == 120
    runs = (await js.stream_info(subjects.runs_stream)).config
    assert runs.retention == RetentionPolicy.LIMITS
    assert runs.allow_direct
    assert runs.allow_atomic
    tasks = (await js.stream_info(subjects.tasks_stream)).config
    assert tasks.retention == RetentionPolicy.WORK_QUEUE
    assert tasks.subjects == [subjects.capabilities_all, subjects.tasks_keeper]
    assert not tasks.allow_rollup_hdrs  # one `Nats-Rollup: all` would drop every task
    dlq = (await js.stream_info(subjects.dead_letter_stream)).config
    assert dlq.max_age == 14 * 86400
    timers = (await js.stream_info(subjects.timers_stream)).config
    assert timers.allow_msg_schedules


async def test_buckets_work_as_kv(js: JetStreamContext, subjects: Subjects) -> None:
    await provision(js, subjects)
    workflows = await js.key_value(subjects.workflows_bucket)
    await workflows.put("approval", b"v1")
    await workflows.put("approval", b"v2")
    assert [e.value for e in await workflows.history("approval")] == [b"v1", b"v2"]
    assert (await workflows.status()).history == 64
    assert (await (await js.key_value(subjects.agents_bucket)).status()).history == 16
    workers = await (await js.key_value(subjects.workers_bucket)).status()
    assert (workers.history, workers.ttl) == (1, 15)
    runs = await js.key_value(subjects.runs_bucket)
    await runs.put("r1", b"running")
    await runs.put("r1", b"done")
    assert [e.value for e in await runs.history("r1")] == [b"done"]


async def test_timers_stream_accepts_schedules(js: JetStreamContext, subjects: Subjects) -> None:
    await provision(js, subjects)
    at = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    headers = {"Nats-Schedule": f"@at {at}", "Nats-Schedule-Target": subjects.timer_fired("r1")}
    ack = await js.publish(subjects.timer_schedule("t1"), b"", headers=headers)
    assert ack.stream == subjects.timers_stream
    # A stream without message scheduling refuses the same message.
    with pytest.raises(Exception, match="schedules"):
        await js.publish(subjects.run("r1"), b"", headers=headers)


async def test_second_run_changes_nothing(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    await provision(js, subjects)
    before = {n: (await js.stream_info(n)).config for n in (subjects.runs_stream,)}
    creates = await _api_calls(nc, "CREATE")
    updates = await _api_calls(nc, "UPDATE")
    await provision(js, subjects)
    await nc.flush()
    assert creates == []
    assert updates == []
    assert (await js.stream_info(subjects.runs_stream)).config == before[subjects.runs_stream]


async def test_differing_settings_are_updated_and_others_kept(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    await js.add_stream(
        StreamConfig(
            name=subjects.runs_stream,
            subjects=[subjects.runs_all],
            description="set by an operator",
            max_msg_size=1 << 20,
        )
    )
    await js.add_stream(name=subjects.events_stream, subjects=[subjects.events_all], max_age=60)
    updates = await _api_calls(nc, "UPDATE")
    await provision(js, subjects, event_max_age_s=7200)
    await nc.flush()
    assert sorted(updates) == sorted(
        f"$JS.API.STREAM.UPDATE.{n}" for n in (subjects.runs_stream, subjects.events_stream)
    )
    runs = (await js.stream_info(subjects.runs_stream)).config
    assert runs.allow_atomic
    assert runs.allow_direct
    assert runs.description == "set by an operator"
    assert runs.max_msg_size == 1 << 20
    assert (await js.stream_info(subjects.events_stream)).config.max_age == 7200


async def test_a_workers_bucket_that_took_message_ttls_is_made_again_without(
    nc: Client, js: JetStreamContext, subjects: Subjects
) -> None:
    """The server turns a stream's message TTLs on, never off: a workers bucket made when it
    took them (a heartbeat with ``Nats-TTL: never`` outlived its 15 s) is made again, its
    heartbeats gone (their workers write them again within seconds)."""
    stream = f"KV_{subjects.workers_bucket}"
    old = next(c for c in desired_configs(subjects) if c["name"] == stream)
    await _raw(nc, f"$JS.API.STREAM.CREATE.{stream}", {**old, "allow_msg_ttl": True})
    key = f"$KV.{subjects.workers_bucket}.echo.forever"
    await js.publish(key, b"{}", headers={"Nats-TTL": "never"})
    await provision(js, subjects)
    assert not (await js.stream_info(stream)).config.allow_msg_ttl
    assert (await js.stream_info(stream)).state.messages == 0
    with pytest.raises(BadRequestError, match="TTL"):
        await js.publish(key, b"{}", headers={"Nats-TTL": "never"})
    await provision(js, subjects)  # and once so, left as it is
    assert (await js.stream_info(stream)).state.messages == 0


async def _raw(nc: Client, subject: str, body: dict[str, object]) -> None:
    reply = json.loads((await nc.request(subject, json.dumps(body).encode())).data)
    assert "error" not in reply, reply


async def test_refused_settings_name_the_stream(js: JetStreamContext, subjects: Subjects) -> None:
    with pytest.raises(JetStreamAPIError, match=subjects.events_stream) as caught:
        await provision(js, subjects, replicas=3)  # one server cannot hold three replicas
    assert caught.value.description


async def test_check_ready_names_what_is_missing(js: JetStreamContext, subjects: Subjects) -> None:
    await provision(js, subjects)
    await js.delete_stream(subjects.timers_stream)
    await js.delete_key_value(subjects.workers_bucket)
    assert await check_ready(js, subjects) == [subjects.timers_stream, subjects.workers_bucket]


# --- append_batch ---------------------------------------------------------------------


@pytest.fixture
async def runs(js: JetStreamContext, subjects: Subjects) -> Subjects:
    await provision(js, subjects)
    return subjects


async def _read(js: JetStreamContext, stream: str, subject: str) -> list[tuple[int, bytes]]:
    out = []
    info = await js.stream_info(stream, subjects_filter=subject)
    seq = info.state.first_seq
    while seq and seq <= info.state.last_seq:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            break
        assert msg.seq is not None
        out.append((msg.seq, msg.data or b""))
        seq = msg.seq + 1
    return out


async def test_batch_is_stored_in_order(js: JetStreamContext, runs: Subjects) -> None:
    subject = runs.run("r1")
    payloads = [({"ce-id": f"e{i}"}, f"record {i}".encode()) for i in range(3)]
    last = await append_batch(js, subject, payloads, expected_last_subject_seq=0)
    stored = await _read(js, runs.runs_stream, subject)
    assert stored == [(last - 2, b"record 0"), (last - 1, b"record 1"), (last, b"record 2")]
    msg = await js.get_msg(runs.runs_stream, seq=last - 1)
    assert msg.headers is not None
    assert msg.headers["ce-id"] == "e1"


async def test_stale_sequence_stores_nothing(
    nc: Client, js: JetStreamContext, runs: Subjects
) -> None:
    subject = runs.run("r2")
    first = await append_batch(nc, subject, [({}, b"a"), ({}, b"b")], 0)
    with pytest.raises(AppendConflict) as caught:
        await append_batch(nc, subject, [({}, b"c"), ({}, b"d"), ({}, b"e")], first - 1)
    assert (caught.value.subject, caught.value.expected) == (subject, first - 1)
    with pytest.raises(AppendConflict):
        await append_batch(nc, subject, [({}, b"c"), ({}, b"d")], 0)
    assert [d for _, d in await _read(js, runs.runs_stream, subject)] == [b"a", b"b"]
    # The winner's sequence lets the next append through.
    assert await append_batch(nc, subject, [({}, b"c"), ({}, b"d")], first) == first + 2


async def test_single_message_appends(js: JetStreamContext, runs: Subjects) -> None:
    subject = runs.run("r3")
    seq = await append_batch(js, subject, [({}, b"only")], 0)
    with pytest.raises(AppendConflict):
        await append_batch(js, subject, [({}, b"late")], 0)
    assert await append_batch(js, subject, [({}, b"next")], seq) > seq
    assert await append_batch(js, subject, [({}, b"unguarded")], None) > seq


async def test_concurrent_appenders_exactly_one_wins(js: JetStreamContext, runs: Subjects) -> None:
    subject = runs.run("r4")
    base = await append_batch(js, subject, [({}, b"started")], 0)

    async def contender(n: int) -> int | None:
        batch = [({}, f"{n}:{i}".encode()) for i in range(3)]
        try:
            return await append_batch(js, subject, batch, base)
        except AppendConflict:
            return None

    results = await asyncio.gather(*(contender(n) for n in range(8)))
    winners = [n for n, seq in enumerate(results) if seq is not None]
    assert len(winners) == 1
    stored = [d for _, d in await _read(js, runs.runs_stream, subject)]
    w = winners[0]
    assert stored == [b"started", f"{w}:0".encode(), f"{w}:1".encode(), f"{w}:2".encode()]


async def test_batches_need_an_atomic_stream(js: JetStreamContext, runs: Subjects) -> None:
    with pytest.raises(JetStreamAPIError, match="atomic publish is disabled"):
        await append_batch(js, runs.event("x"), [({}, b"a"), ({}, b"b")], None)


async def test_no_stream_for_the_subject(nc: Client, subjects: Subjects) -> None:
    with pytest.raises(JetStreamAPIError, match="no stream"):
        await append_batch(nc, subjects.run("nowhere"), [({}, b"a")], None)


async def test_empty_batch_is_refused(nc: Client, subjects: Subjects) -> None:
    with pytest.raises(ValueError, match="at least one"):
        await append_batch(nc, subjects.run("r"), [], 0)
