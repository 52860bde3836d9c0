"""Whether the NATS server fsyncs every write, and so whether run-log appends are
group-committed (:mod:`interlock.runtime.groupcommit`).

Group commit pays only on a server that syncs every write (``sync_interval: always``);
with the default interval a batch costs more than it saves. No subject a client account
may use says how the server syncs (``$JS.API.INFO`` reports the account's usage and
limits only; the ``$SYS`` requests that report the server's configuration need the
system account, which the orchestrator is not given). The server's monitoring endpoint
does: ``/varz`` has ``jetstream.config.sync_always``. So at start the orchestrator reads
``/varz`` at the address it is given (``INTERLOCK_NATS_MONITOR``), or by default at port
8222 of the host it is connected to (the port the NATS documentation and charts use),
and believes it only when it comes from the server it is connected to (the same
``server_id``) or from a server of the same cluster. When nothing answers, or another
server does, it does not guess: group commit stays off. Most servers run without a
monitoring port and with the default sync interval, where off is right, so that is said
at debug level only; an address the operator gave (``INTERLOCK_NATS_MONITOR``) that
cannot be read is a warning saying what to do. The orchestrator's start line says whether
group commit is on. ``interlock serve --group-commit N`` (0: off) overrides whatever is
found.

The embedded server (``interlock dev --fsync``) is started with a known configuration,
so there the orchestrator is told directly.

One GET at start, with the standard library (``urllib`` in a thread, 2 s at most): no
HTTP client library is worth adding for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client

log = logging.getLogger("interlock.durability")

DEFAULT_GROUP_COMMIT = 16
"""The batch size group commit uses when the server fsyncs every write (measured with
``python -m bench runtime --fsync always`` and ``python -m bench peers``)."""
MONITOR_PORT = 8222
"""The NATS monitoring port by convention (``nats-server -m 8222``)."""
TIMEOUT = 2.0


@dataclass(frozen=True)
class Durability:
    """What was found about the server's syncing."""

    fsync: bool | None
    """True: it syncs every write; False: it does not; None: not known."""
    source: str
    """Where it was read, or why it is not known (for the log)."""


def default_monitor_url(nc: Client) -> str | None:
    """``http://<host the client is connected to>:8222``, if connected."""
    url = nc.connected_url
    if url is None or not url.hostname:
        return None
    host = url.hostname
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"http://{host}:{MONITOR_PORT}"


def _get_varz(url: str) -> dict[str, Any]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"a monitoring address is http:// or https://, not {url!r}")
    varz = url.rstrip("/") + "/varz"
    with urllib.request.urlopen(varz, timeout=TIMEOUT) as reply:  # noqa: S310 - scheme checked
        body = reply.read(4 * 1024 * 1024)
    data = json.loads(body)
    if not isinstance(data, dict):
        data = {}  # not /varz: it says nothing of the server
    return data


def read_durability(varz: dict[str, Any], server_info: dict[str, Any], where: str) -> Durability:
    """What ``varz`` (a server's ``/varz``) says, if it comes from the server described by
    ``server_info`` (the INFO the client was sent) or one of its cluster."""
    if "server_id" not in varz:
        return Durability(None, f"{where} does not answer as a NATS server's /varz")
    same_server = varz.get("server_id") == server_info.get("server_id")
    cluster = server_info.get("cluster")
    varz_cluster = varz.get("cluster")
    same_cluster = (
        bool(cluster) and isinstance(varz_cluster, dict) and varz_cluster.get("name") == cluster
    )
    if not (same_server or same_cluster):
        return Durability(None, f"{where} is another server's ({varz.get('server_id')})")
    jetstream = varz.get("jetstream")
    config = jetstream.get("config") if isinstance(jetstream, dict) else None
    if not isinstance(config, dict):
        return Durability(None, f"{where} reports no JetStream configuration")
    return Durability(config.get("sync_always") is True, where)


async def detect(nc: Client, monitor_url: str | None = None) -> Durability:
    """Whether the server ``nc`` is connected to fsyncs every write, read from its
    monitoring endpoint (``monitor_url``, else port 8222 of the connected host)."""
    if monitor_url is not None and monitor_url.strip().lower() == "off":
        return Durability(None, "the monitoring address is off")
    url = monitor_url or default_monitor_url(nc)
    if not url:
        return Durability(None, "no monitoring address")
    where = url.rstrip("/") + "/varz"
    try:
        varz = await asyncio.to_thread(_get_varz, url)
    except (OSError, ValueError) as exc:  # unreachable, refused, not JSON, bad address
        return Durability(None, f"{where}: {exc}")
    server_info: dict[str, Any] = dict(getattr(nc, "_server_info", {}) or {})
    return read_durability(varz, server_info, where)


async def group_commit_for(nc: Client, explicit: int | None, monitor_url: str | None = None) -> int:
    """The group commit batch to use: ``explicit`` when given (0: off); else
    :data:`DEFAULT_GROUP_COMMIT` when the server fsyncs every write, 0 when it does not
    or it cannot be told (said in the log)."""
    if explicit is not None:
        log.info("group commit %s (set explicitly)", explicit or "off")
        return explicit
    found = await detect(nc, monitor_url)
    if found.fsync:
        log.info(
            "the server fsyncs every write (%s): run-log appends group-committed, batches of %d",
            found.source,
            DEFAULT_GROUP_COMMIT,
        )
        return DEFAULT_GROUP_COMMIT
    if found.fsync is False:
        log.debug("the server does not fsync every write (%s): group commit off", found.source)
        return 0
    given = monitor_url is not None and monitor_url.strip().lower() != "off"
    # Not told where to look and nothing there: the default (off) is right for a server
    # with the default sync interval, which is what most run; a note for those who look.
    (log.warning if given else log.debug)(
        "group commit off: could not tell whether the server fsyncs every write (%s); "
        "if it does (sync_interval: always), give its monitoring address "
        "(INTERLOCK_NATS_MONITOR) or --group-commit %d",
        found.source,
        DEFAULT_GROUP_COMMIT,
    )
    return 0
