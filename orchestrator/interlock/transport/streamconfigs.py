"""The stream and KV bucket configurations of one installation, as the server's JSON.

:func:`desired_configs` is what :func:`interlock.transport.provision.provision` creates or
brings up to date: raw JetStream stream configurations (``allow_atomic``,
``allow_msg_schedules`` and the like are nats-server 2.12 settings client libraries model
unevenly; comparing the server's own JSON with these is what makes a second provisioning a
no-op). KV buckets and object stores are streams too (``KV_<bucket>``, ``OBJ_<bucket>``,
laid out as NATS clients expect them), so one shape serves all.
"""

from __future__ import annotations

from typing import Any, Final

from interlock.transport.subjects import Subjects

__all__ = [
    "DEAD_LETTER_MAX_AGE_S",
    "DELIVERIES_MAX_AGE_S",
    "DUPLICATE_WINDOW_S",
    "MARKER_KEPT_S",
    "PARKED_MAX_AGE_S",
    "SHARED_DUPLICATE_WINDOW_S",
    "WORKERS_MAX_BYTES",
    "WORKERS_MAX_MSG",
    "WORKERS_TTL_S",
    "desired_configs",
]

_NS: Final = 1_000_000_000
DUPLICATE_WINDOW_S: Final = 120.0
SHARED_DUPLICATE_WINDOW_S: Final = 0.1
"""The duplicate window of a stream parties of different teams write where its reader
takes each message once by itself (the results): the shortest the server allows. A
window is a way for one writer to have another's message dropped, by sending its id
first."""
DEAD_LETTER_MAX_AGE_S: Final = 14 * 86400.0
WORKERS_TTL_S: Final = 15.0
MARKER_KEPT_S = 900
"""How long the marker a key's delete leaves stays (its message's TTL): long past what
reads a deletion after the fact (a sweep's round), so that keys deleted once and never
written again (a run's index entry, snapshot and correlation key after its end or its
deletion, a limit's key) do not pile up in their buckets for good."""
WORKERS_MAX_MSG = 64 * 1024
"""The largest heartbeat the workers bucket takes: a record naming every capability of
the largest agent credential (some 150, what a connection's control line holds) fits."""
WORKERS_MAX_BYTES = 64 * 1024 * 1024
"""What the workers bucket holds at most. Agents write it (each its own capabilities'
keys, any instance name, any bytes) and every listing of workers, the orchestrator's
metrics every 10 s among them, reads all of it: unbounded, one agent's flood made each
read as large as the flood. Full, it takes no heartbeat until its keys expire
(:data:`WORKERS_TTL_S`): listings then show fewer workers; nothing else reads it."""
DELIVERIES_MAX_AGE_S: Final = 7 * 86400.0


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
    message_ttls: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """The layout NATS KV clients create and expect (nats-py create_key_value, ADR-8),
    without rollups: nothing of Interlock's purges a key by one (it deletes keys, which
    leaves a marker as a purge does where one value is kept), and a message stored with
    ``Nats-Rollup: all`` wipes every key of its bucket: on a bucket agents write, one on
    an agent's own key; on any, a copy a user of the orchestrator's account has made the
    server write there (a direct get of a message it stored with that header, the copy's
    reply subject naming a key of the bucket). ``rollups``: allow them all the same.
    ``message_ttls``: take a message's own ``Nats-TTL`` (the orchestrator's markers and
    leases); a message with one outlives the bucket's ``max_age``."""
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
        allow_msg_ttl=message_ttls,
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
    """The task requests' work queue: the keeper's subject beside the tasks' (purged to
    its newest message by its writer); direct gets, so that the requests of a cancelled
    run are looked for in the whole queue (runtime/taskqueue.py). No rollups: one message
    stored with ``Nats-Rollup: all`` would drop every queued task of every capability."""
    return _stream(
        s.tasks_stream,
        [s.capabilities_all, s.tasks_keeper],
        replicas,
        retention="workqueue",
        allow_rollup_hdrs=False,
        allow_direct=True,
    )


def _results(s: Subjects, replicas: int, max_age: int) -> dict[str, Any]:
    """The answers' stream: copied into run logs as they arrive, kept as long as events.
    Every capability's agents and the orchestrator write it, and a ``Nats-Msg-Id`` is its
    sender's text: within a long window an agent that sent another's answer id first had
    that answer dropped. The orchestrator takes an answer once whatever the stream holds,
    so the window is the shortest the server takes."""
    return _stream(
        s.results_stream,
        [s.results_all],
        replicas,
        max_age=max_age,
        duplicate_window=int(SHARED_DUPLICATE_WINDOW_S * _NS),
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
        _results(s, replicas, event_age),
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
        # an agent's own key would purge every other key), and no TTL of their own: one
        # of "never" outlived the bucket's 15 s, and such heartbeats filled it for good,
        # refusing every other agent's (listings and metrics then showed no worker).
        _bucket(
            s.workers_bucket,
            replicas,
            history=1,
            ttl_s=WORKERS_TTL_S,
            message_ttls=False,
            max_bytes=WORKERS_MAX_BYTES,
            max_msg_size=WORKERS_MAX_MSG,
        ),
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
    create_object_store, ADR-20), without rollups: one message stored with
    ``Nats-Rollup: all`` would purge every object of the bucket (every run's payloads),
    and Interlock writes its objects without them (transport/objects.py)."""
    return _stream(
        f"OBJ_{bucket}",
        [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        replicas,
        discard="new",
        allow_rollup_hdrs=False,
        allow_direct=True,
        **settings,
    )
