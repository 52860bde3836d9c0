"""Streams and KV buckets of one installation, and atomic appends to a run log.

``provision`` creates or updates every stream and bucket named by ``Subjects``. It sends
raw JSON stream configurations to the JetStream API (``$JS.API.STREAM.CREATE/UPDATE``):
``allow_atomic`` (atomic batch publish) and ``allow_msg_schedules`` (message scheduling)
are nats-server 2.12 settings that client libraries model unevenly, and comparing the
server's own JSON with ours is what makes a second run a no-op. KV buckets are streams
too (``KV_<bucket>``, laid out as NATS KV clients expect), so one code path serves all.

``append_batch`` appends several records to one run subject in one atomic batch
(ADR-50: ``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit``), guarded by
``Nats-Expected-Last-Subject-Sequence`` so that concurrent writers cannot interleave.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from interlock.core.vocabulary import InterlockError
from interlock.transport.errors import AppendConflict
from interlock.transport.jetstream import api_prefix, connection, jetstream
from interlock.transport.partitions import balance_leaders, first_map, read_map, write_map
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.provision")

__all__ = [
    "AppendConflict",
    "JetStreamAPIError",
    "append_batch",
    "check_ready",
    "desired_configs",
    "provision",
]

_NS: Final = 1_000_000_000
_DEFAULT_API_PREFIX: Final = "$JS.API"
_API_WAIT_S: Final = 5.0
DUPLICATE_WINDOW_S: Final = 120.0
DEAD_LETTER_MAX_AGE_S: Final = 14 * 86400.0
WORKERS_TTL_S: Final = 15.0
DELIVERIES_MAX_AGE_S: Final = 7 * 86400.0
MAX_BATCH: Final = 1000  # the server's limit on messages in one atomic batch

# JetStream API error codes (nats-server errors.json).
_ERR_STREAM_NOT_FOUND: Final = 10059
_ERR_WRONG_LAST_SEQUENCE: Final = 10071
_EXPECTED_LAST_SUBJECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"


class JetStreamAPIError(InterlockError):
    """The JetStream API refused a request; carries the server's codes and description."""

    def __init__(self, what: str, error: dict[str, Any]) -> None:
        self.code = int(error.get("code", 0))
        self.err_code = int(error.get("err_code", 0))
        self.description = str(error.get("description", "unknown error"))
        super().__init__(f"{what}: {self.description} (err_code {self.err_code})")


# --- configurations -------------------------------------------------------------------


PARKED_MAX_AGE_S = 15 * 60
"""How long an event is kept for a correlated run that is not waiting for it yet."""


def _stream(name: str, subjects: list[str], replicas: int, **settings: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "subjects": subjects,
        "retention": "limits",
        "storage": "file",
        "discard": "old",
        "num_replicas": replicas,
        "max_age": 0,
        "duplicate_window": int(DUPLICATE_WINDOW_S * _NS),
    }
    config.update(settings)
    return config


def _bucket(
    bucket: str,
    replicas: int,
    *,
    history: int,
    ttl_s: float = 0.0,
    rollups: bool = False,
    **settings: Any,
) -> dict[str, Any]:
    """The layout NATS KV clients create and expect (nats-py create_key_value, ADR-8),
    without rollups: nothing of Interlock's purges a key by one (it deletes keys, which
    leaves a marker as a purge does where one value is kept), and a message stored with
    ``Nats-Rollup: all`` wipes every key of its bucket: on a bucket agents write, one on
    an agent's own key; on any, a copy a user of the orchestrator's account has made the
    server write there (a direct get of a message it stored with that header, the copy's
    reply subject naming a key of the bucket). ``rollups``: allow them all the same."""
    ttl = int(ttl_s * _NS)
    window = min(ttl, int(DUPLICATE_WINDOW_S * _NS)) if ttl else int(DUPLICATE_WINDOW_S * _NS)
    return _stream(
        f"KV_{bucket}",
        [f"$KV.{bucket}.>"],
        replicas,
        discard="new",
        max_age=ttl,
        duplicate_window=window,
        max_msgs_per_subject=history,
        allow_rollup_hdrs=rollups,
        allow_msg_ttl=True,
        deny_delete=True,
        allow_direct=True,
        **settings,
    )


def _run_logs(s: Subjects, replicas: int, streams: int) -> list[dict[str, Any]]:
    """The run-log streams of ``streams`` partitions (one: ``<BASE>_RUNS`` alone, storing
    every run-log subject, as before partitions)."""
    partitioned = streams > 1
    return [
        _stream(
            s.runs_stream_of(p),
            [s.runs_of(p, partitioned=partitioned)],
            replicas,
            allow_direct=True,
            allow_atomic=True,
        )
        for p in range(streams)
    ]


def _tasks(s: Subjects, replicas: int) -> dict[str, Any]:
    """The task requests' work queue: the keeper's subject beside the tasks', rolled up to
    its newest message; direct gets, so that the requests of a cancelled run are looked
    for in the whole queue (runtime/taskqueue.py)."""
    return _stream(
        s.tasks_stream,
        [s.capabilities_all, s.tasks_keeper],
        replicas,
        retention="workqueue",
        allow_rollup_hdrs=True,
        allow_direct=True,
    )


def desired_configs(
    subjects: Subjects,
    *,
    replicas: int = 1,
    event_max_age_s: float = 7 * 86400,
    streams: int = 1,
) -> list[dict[str, Any]]:
    """The JetStream stream configurations (as the server's JSON) of one installation,
    with ``streams`` run-log streams (one per partition any layout used)."""
    s = subjects
    event_age = int(event_max_age_s * _NS)
    return [
        _stream(s.events_stream, [s.events_all], replicas, max_age=event_age),
        *_run_logs(s, replicas, streams),
        _tasks(s, replicas),
        # Results are copied into run logs as they arrive; keep them as long as events.
        _stream(s.results_stream, [s.results_all], replicas, max_age=event_age),
        _stream(
            s.dead_letter_stream,
            [s.dead_letters_all],
            replicas,
            max_age=int(DEAD_LETTER_MAX_AGE_S * _NS),
        ),
        # Work-queue: a schedule stays until it fires (the server then purges it) and a fired
        # timer until the orchestrator has taken it, so the stream holds only live timers.
        _stream(
            s.timers_stream,
            [s.timers_all],
            replicas,
            retention="workqueue",
            allow_msg_schedules=True,
        ),
        _stream(
            s.parked_stream,
            [s.parked_all],
            replicas,
            max_age=int(PARKED_MAX_AGE_S * _NS),
            allow_direct=True,
        ),
        # Deletions of runs (retention, `interlock runs delete`): kept for good, and
        # neither purged nor trimmed by the API.
        _stream(s.audit_stream, [s.audit_all], replicas, deny_delete=True, deny_purge=True),
        _bucket(s.workflows_bucket, replicas, history=64),
        _bucket(s.agents_bucket, replicas, history=16),
        # Agents write their own heartbeats here (no rollups, as on every bucket: one on
        # an agent's own key would purge every other key).
        _bucket(s.workers_bucket, replicas, history=1, ttl_s=WORKERS_TTL_S),
        _bucket(s.runs_bucket, replicas, history=1),
        _bucket(s.snapshots_bucket, replicas, history=1),
        _bucket(s.correlation_bucket, replicas, history=1),
        # Several keys of a limit (its holders, its lines) change in one atomic batch.
        _bucket(s.slots_bucket, replicas, history=1, allow_atomic=True),
        _bucket(s.triggers_bucket, replicas, history=1),
        _bucket(s.paused_bucket, replicas, history=1),
        # The partition map (its revisions are the layouts' history, in the value) and
        # the partitions' owners, each key kept by its owner's renewals (a message TTL).
        _bucket(s.partitions_bucket, replicas, history=1),
        # A secret is written once: a second value for a key is refused (by anyone, a
        # message reflected there included), and no rollup can purge one.
        _bucket(s.secrets_bucket, replicas, history=1, discard_new_per_subject=True),
        _bucket(s.webhooks_bucket, replicas, history=16),
        _bucket(s.http_tokens_bucket, replicas, history=1),
        # A delivery is remembered for its webhook's replay window, at most this long.
        _bucket(s.deliveries_bucket, replicas, history=1, ttl_s=DELIVERIES_MAX_AGE_S),
        *_object_buckets(s, replicas, event_age),
    ]


def _object_buckets(s: Subjects, replicas: int, event_age: int) -> list[dict[str, Any]]:
    """Payloads kept by reference: runs' own (deleted with their run), and the operators'
    and the gateway's uploads (kept as long as events; a run keeps a copy). The task-input
    and party buckets are made as they are needed."""
    return [
        _object_bucket(s.objects_bucket, replicas),
        _object_bucket(s.uploads_bucket, replicas, max_age=event_age),
    ]


def _object_bucket(bucket: str, replicas: int, **settings: Any) -> dict[str, Any]:
    """The layout NATS object store clients create and expect (nats-py
    create_object_store, ADR-20)."""
    return _stream(
        f"OBJ_{bucket}",
        [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        replicas,
        discard="new",
        allow_rollup_hdrs=True,
        allow_direct=True,
        **settings,
    )


# --- provisioning ---------------------------------------------------------------------


async def provision(
    js: JetStreamContext | Client,
    subjects: Subjects,
    *,
    replicas: int = 1,
    event_max_age_s: float = 7 * 86400,
    secrets: bool = False,
    partitions: int | None = None,
) -> None:
    """Create the streams and buckets of ``subjects``, or update those that differ.

    Idempotent: a stream whose settings already match is left alone. The secrets bucket
    is updated only with ``secrets`` (the orchestrator's: no other role may change it);
    others create it when it is missing. ``partitions``: the run-log partitions of an
    installation that has no partition map yet (one when not given; an installation that
    has one keeps it: ``interlock partitions set`` changes it); a stream for each
    partition any layout of the map uses.

    Raises:
        JetStreamAPIError: the server refused a configuration (for example a setting that
            cannot change on an existing stream, or a server older than 2.12).
    """
    nc, prefix = _connection(js)
    found, revision = await read_map(nc, subjects)
    wanted = found
    if revision and partitions is not None and partitions != found.current.count:
        log.warning(
            "%d partitions asked (--partitions, INTERLOCK_PARTITIONS) are for an installation "
            "provisioned for the first time: this one keeps its %d (`interlock partitions "
            "set N` changes them)",
            partitions,
            found.current.count,
        )
    if not revision and partitions is not None and partitions != found.current.count:
        runs = await _stream_info(nc, prefix, subjects.runs_stream)
        stored = int((runs or {}).get("state", {}).get("messages", 0))
        wanted = first_map(partitions, stored=bool(stored))
    await provision_streams(
        nc,
        prefix,
        subjects,
        desired_configs(
            subjects,
            replicas=replicas,
            event_max_age_s=event_max_age_s,
            streams=wanted.streams,
        ),
        secrets=secrets,
    )
    if wanted is not found:
        # Streams first: no run is placed in a partition whose stream is not there yet.
        # Another process provisioning at once may have written it: theirs stands.
        with contextlib.suppress(Exception):
            await write_map(nc, subjects, wanted, revision)
    if wanted.streams > 1:
        await balance_leaders(nc, subjects, wanted.streams)


async def provision_streams(
    nc: Client,
    prefix: str,
    subjects: Subjects,
    configs: list[dict[str, Any]],
    *,
    secrets: bool = False,
) -> None:
    """Create the streams of ``configs``, or update those that differ (see
    :func:`provision`)."""
    for desired in configs:
        name = desired["name"]
        current = await _stream_config(nc, prefix, name)
        if current is None:
            await _api(nc, f"{prefix}.STREAM.CREATE.{name}", desired, f"create stream {name}")
            continue
        if name == f"KV_{subjects.secrets_bucket}" and not secrets:
            continue
        # Never scale a stream down by accident: a process started without
        # INTERLOCK_REPLICAS must not turn R3 streams back into R1.
        desired["num_replicas"] = max(desired["num_replicas"], current.get("num_replicas", 1))
        if any(current.get(key) != value for key, value in desired.items()):
            # Keep what the server filled in or an operator set; change only our settings.
            await _api(
                nc,
                f"{prefix}.STREAM.UPDATE.{name}",
                current | desired,
                f"update stream {name}",
            )


async def check_ready(js: JetStreamContext | Client, subjects: Subjects) -> list[str]:
    """Names of the streams and buckets of ``subjects`` that do not exist (empty: ready)."""
    nc, prefix = _connection(js)
    missing: list[str] = []
    for desired in desired_configs(subjects):
        name: str = desired["name"]
        if await _stream_config(nc, prefix, name) is None:
            missing.append(name.removeprefix("KV_").removeprefix("OBJ_"))
    return missing


async def _stream_config(nc: Client, prefix: str, name: str) -> dict[str, Any] | None:
    info = await _stream_info(nc, prefix, name)
    if info is None:
        return None
    config: dict[str, Any] = info["config"]
    return config


async def _stream_info(nc: Client, prefix: str, name: str) -> dict[str, Any] | None:
    try:
        return await _api(nc, f"{prefix}.STREAM.INFO.{name}", None, f"stream info {name}")
    except JetStreamAPIError as exc:
        if exc.err_code == _ERR_STREAM_NOT_FOUND:
            return None
        raise


async def _api(nc: Client, subject: str, body: dict[str, Any] | None, what: str) -> dict[str, Any]:
    payload = msgspec.json.encode(body) if body is not None else b""
    try:
        msg = await nc.request(subject, payload, timeout=_API_WAIT_S)
    except NoRespondersError as exc:
        raise JetStreamAPIError(
            what, {"description": "JetStream is not enabled on this server (no responders)"}
        ) from exc
    reply: dict[str, Any] = msgspec.json.decode(msg.data)
    error = reply.get("error")
    if error:
        raise JetStreamAPIError(what, error)
    return reply


def _connection(js: JetStreamContext | Client) -> tuple[Client, str]:
    """The core connection and API prefix behind a JetStream context (or a bare client)."""
    if isinstance(js, Client):
        return js, _DEFAULT_API_PREFIX
    return connection(js), api_prefix(js)


# --- atomic appends -------------------------------------------------------------------


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    batch: str = ""
    count: int = 0
    error: dict[str, Any] | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


async def append_batch(
    js_or_nc: JetStreamContext | Client,
    subject: str,
    payloads: Sequence[tuple[dict[str, str], bytes]],
    expected_last_subject_seq: int | None,
    *,
    ack_wait: float = 5.0,
) -> int:
    """Append ``payloads`` (headers, data) to ``subject``, all or nothing.

    With ``expected_last_subject_seq`` set, the append only happens if the subject's last
    message is at that stream sequence (0: the subject is empty). Several messages go as
    one atomic batch: the server stores them with consecutive sequences or not at all.

    Returns:
        The stream sequence of the last message appended.

    Raises:
        AppendConflict: the subject moved past ``expected_last_subject_seq``; nothing
            of the batch is stored.
        JetStreamAPIError: any other refusal (no stream, stream without atomic publish...).
    """
    if not payloads:
        raise ValueError("append_batch needs at least one message")
    if len(payloads) > MAX_BATCH:
        raise ValueError(f"an atomic batch holds at most {MAX_BATCH} messages")
    nc = js_or_nc if isinstance(js_or_nc, Client) else _connection(js_or_nc)[0]
    last = len(payloads) - 1
    batch_id = uuid.uuid4().hex if last else ""
    for index, (headers, data) in enumerate(payloads):
        hdrs = dict(headers)
        if index == 0 and expected_last_subject_seq is not None:
            hdrs[_EXPECTED_LAST_SUBJECT_SEQ] = str(expected_last_subject_seq)
        if batch_id:
            hdrs["Nats-Batch-Id"] = batch_id
            hdrs["Nats-Batch-Sequence"] = str(index + 1)
        if index < last:
            # Only the commit is acknowledged: one round trip for the whole batch.
            await nc.publish(subject, data, headers=hdrs)
            continue
        if batch_id:
            hdrs["Nats-Batch-Commit"] = "1"
        try:
            reply = await jetstream(nc).request_ack(subject, data, headers=hdrs, ack_wait=ack_wait)
        except NoRespondersError as exc:
            raise JetStreamAPIError(f"append to {subject!r}", {"description": _NO_STREAM}) from exc
        except NatsTimeoutError as exc:
            raise JetStreamAPIError(
                f"append to {subject!r}", {"description": f"no acknowledgement in {ack_wait:g} s"}
            ) from exc
        return _appended(subject, reply, expected_last_subject_seq)
    raise AssertionError("unreachable")


_NO_STREAM = (
    "no stream answered: none stores this subject, or its stream has no leader yet "
    "(an election after a node's loss)"
)
"""Why an append got no answer from JetStream at all (no responders)."""


def _appended(subject: str, reply: Msg, expected: int | None) -> int:
    ack = _decode_ack(reply.data)
    if ack.error:
        if ack.error.get("err_code") == _ERR_WRONG_LAST_SEQUENCE:
            raise AppendConflict(subject, expected, ack.error["description"])
        raise JetStreamAPIError(f"append to {subject!r}", ack.error)
    return ack.seq


def append_soon(
    nc: Client, subject: str, data: bytes, expected_last_subject_seq: int
) -> Callable[[], Awaitable[int]] | None:
    """:func:`append_batch` of one message, sent now in one plain call: what it returns,
    called, is awaited for the sequence (or the same errors). None, with nothing sent,
    where the publish would have to wait: the caller awaits :func:`append_batch`."""
    headers = {_EXPECTED_LAST_SUBJECT_SEQ: str(expected_last_subject_seq)}
    sent = jetstream(nc).request_ack_soon(subject, data, headers=headers)
    if sent is None:
        return None
    future = sent

    async def appended() -> int:
        try:
            reply = await future
        except NatsTimeoutError as exc:
            raise JetStreamAPIError(
                f"append to {subject!r}", {"description": "no acknowledgement in time"}
            ) from exc
        if reply.headers and reply.headers.get("Status") == "503" and not reply.data:
            raise JetStreamAPIError(f"append to {subject!r}", {"description": _NO_STREAM})
        return _appended(subject, reply, expected_last_subject_seq)

    return appended
