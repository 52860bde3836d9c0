"""Streams and KV buckets of one installation, created or brought up to date.

``provision`` creates or updates every stream and bucket named by ``Subjects`` (their
configurations: :mod:`interlock.transport.streamconfigs`), sending raw JSON stream
configurations to the JetStream API (``$JS.API.STREAM.CREATE/UPDATE``) and comparing the
server's own JSON with them, so that a second run is a no-op. ``check_ready`` says which are
missing. Atomic appends to a run log: :mod:`interlock.transport.appends`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext

from interlock.transport.errors import JetStreamAPIError
from interlock.transport.jetstream import api_prefix, connection
from interlock.transport.natsclient import js_api
from interlock.transport.partitions import balance_leaders, first_map, read_map, write_map
from interlock.transport.streamconfigs import desired_configs
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.provision")

__all__ = ["check_ready", "provision", "provision_streams"]

_API_WAIT_S: Final = 5.0

# JetStream API error code (nats-server errors.json).
_ERR_STREAM_NOT_FOUND: Final = 10059


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
        if name == f"KV_{subjects.workers_bucket}" and _ttls_dropped(current, desired):
            await _made_again(nc, prefix, desired)
            continue
        if any(current.get(key) != value for key, value in desired.items()):
            # Keep what the server filled in or an operator set; change only our settings.
            await _api(
                nc,
                f"{prefix}.STREAM.UPDATE.{name}",
                current | desired,
                f"update stream {name}",
            )


def _ttls_dropped(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether ``desired`` takes no message TTLs where the stream takes them: the server
    turns that setting on, never off."""
    return bool(current.get("allow_msg_ttl")) and not desired.get("allow_msg_ttl")


async def _made_again(nc: Client, prefix: str, desired: dict[str, Any]) -> None:
    """Delete a stream and make it as ``desired``: for the workers bucket only, whose
    heartbeats are written again every few seconds, when a setting cannot be changed in
    place. Another process doing the same at once is no failure."""
    name = desired["name"]
    log.warning("making stream %s again: %s", name, "it took message TTLs of their writers")
    with contextlib.suppress(JetStreamAPIError):
        await _api(nc, f"{prefix}.STREAM.DELETE.{name}", None, f"delete stream {name}")
    try:
        await _api(nc, f"{prefix}.STREAM.CREATE.{name}", desired, f"create stream {name}")
    except JetStreamAPIError:
        current = await _stream_config(nc, prefix, name)
        if current is None or _ttls_dropped(current, desired):
            raise


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


async def jetstream_api(
    nc: Client, what: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One JetStream API request, ``what`` under the connection's API prefix (``STREAM.INFO.X``),
    its answer as JSON. Raises JetStreamAPIError for an error answer."""
    return await _api(nc, f"{js_api(nc)}.{what}", body, what)


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
        return js, js_api(js)
    return connection(js), api_prefix(js)
