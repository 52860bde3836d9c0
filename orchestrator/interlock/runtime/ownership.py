"""Which orchestrator replica relays each run-log partition: leases in the partitions bucket.

Each replica says it is alive (``replica.<id>``, a message with a TTL, put again every
round) and holds its partitions' leases (``owner.<p>``: its id, with a TTL, renewed every
round by a compare-and-set on the key's last revision). A lease is taken only where the
key is empty, expired or released (the append expects the revision found), so two
replicas never hold one partition at once; a replica whose renewal is refused (it was
paused past the TTL and another took it) lets the partition go. Each round a replica holds
its fair share, ``ceil(partitions / live replicas)``: it releases what it holds above it
(a released lease is free at once) and takes free ones up to it. A replica that dies
stops renewing: its leases expire within the TTL and the others take them in their next
round, so a partition moves within ``LEASE_TTL_S + ROUND_S``.

Sooner where the replica's connection is gone (killed, crashed, its host lost): each
replica answers requests on ``<prefix>.owner.replica.<id>`` (core NATS, orchestrators only),
and each round asks the others it sees (their presence or their leases). The server answers
at once when nobody subscribes there (no responders): a replica found so twice at least
:data:`GONE_AFTER_S` apart (a replica whose NATS node died is back on another by then) is
gone, its leases taken as if expired (a compare-and-set on the revision found, as ever)
and it is not counted among the live replicas. So a killed replica's partitions move
within a round and :data:`GONE_AFTER_S`. A replica that is alive but does not answer in
time (busy) is not gone: only the TTL takes its leases. One taken for gone that was not (its
connection lost for longer) finds its renewal refused and lets the partition go.

A replica that takes a partition asks the server to hand out again at once what the
partition's ``relay`` consumer had handed its last holder and not had acknowledged
(:func:`redeliver_now`: the consumer reset to its acknowledgement floor, nats-server 2.14),
rather than after the consumer's ack wait. The effects of those records are done again
as after any redelivery: with their deterministic ids, and the requests older than a
minute checked against the run's log first.

A lease decides who reads the partition's ``relay`` consumer (the outbox: dispatch,
timers, child runs, the run index), so that one replica acts on a partition's appends and
keeps those runs' states warm. It is not what keeps a run's log right: a replica that
still acts after its lease expired (paused, then resumed) appends under the same
optimistic check as always, and effects carry their deterministic ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError

from interlock.transport.clock import utc_now
from interlock.transport.directget import read_messages
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

LEASE_TTL_S = 6
"""How long a lease (and a replica's presence) lasts without a renewal, in seconds."""
ROUND_S = 2.0
"""How often a replica renews its leases and takes or releases partitions."""
GONE_AFTER_S = 1.0
"""How long a replica must be without a subscription (no responders) to be gone."""
_PING_S = 0.5
_TIMEOUT = 5.0
_WRONG_LAST_SEQUENCE = 10071


_RESETS = (2, 14)
"""The first nats-server version with ``CONSUMER.RESET``."""


async def redeliver_now(nc: Client, stream: str, consumer: str = "relay") -> int:
    """Hand out again at once what ``consumer`` of ``stream`` handed out and did not have
    acknowledged (its last reader is gone), resetting it to its acknowledgement floor; how
    many messages were waiting for an acknowledgement (0: none, or a server without the
    reset, where they come again after the consumer's ack wait)."""
    version = nc.connected_server_version
    if (version.major, version.minor) < _RESETS:
        return 0
    api = f"{js_api(nc)}.CONSUMER.%s.{stream}.{consumer}"
    try:
        info = json.loads((await nc.request(api % "INFO", b"", timeout=_TIMEOUT)).data)
        pending = int(info.get("num_ack_pending") or 0)
        if info.get("error") or not pending:
            return 0
        reply = json.loads((await nc.request(api % "RESET", b"", timeout=_TIMEOUT)).data)
    # They come again after the ack wait, as without the reset.
    except Exception as exc:  # noqa: BLE001
        log.warning("%s: cannot hand out again what its last reader had: %s", stream, exc)
        return 0
    if reply.get("error"):
        log.warning("%s: cannot hand out again what its last reader had: %s", stream, reply)
        return 0
    log.info("%s: %d message(s) its last reader had handed out again", stream, pending)
    return pending


def replica_name() -> str:
    """A name for this orchestrator process among the replicas: host, process, and a
    random part (a restarted process is a new replica)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40]
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class Lease(msgspec.Struct, frozen=True):
    owner: str
    since: str = ""


_decode_lease = msgspec.json.Decoder(Lease).decode


def _lease(value: bytes) -> Lease | None:
    """The lease a key holds; None for no value, or one that is not a lease: a JetStream
    acknowledgement written there by a user of the account that named the key as a reply
    subject has no TTL, and read as a live lease it kept the partition from every replica
    for good (its holder's next renewal found the key changed and let it go)."""
    if not value:
        return None
    try:
        found = _decode_lease(value)
    except msgspec.DecodeError:
        return None
    return found if found.owner else None


@dataclass(slots=True)
class Ownership:
    """One replica's leases."""

    nc: Client
    subjects: Subjects
    me: str
    ttl: int = LEASE_TTL_S
    held: dict[int, int] = field(default_factory=dict)
    """Partition -> the revision of this replica's lease on it."""
    moves: int = 0
    """Partitions taken or let go since start."""
    short: bool = False
    """Whether the last round left this replica below its fair share (another has yet to
    let some go: the next round comes sooner, so that a partition let go is taken at once),
    or found a replica that may be gone (to be sure of it sooner)."""
    taken: set[int] = field(default_factory=set)
    """The partitions the last round took."""
    gone: set[str] = field(default_factory=set)
    """The other replicas found gone (no subscription) by the last round."""
    _missing: dict[str, float] = field(default_factory=dict)
    """Replica -> when it was first found without a subscription (since, each round)."""
    _answered: set[str] = field(default_factory=set)
    """The replicas seen answering (one that never has, of a version that does not, is
    never taken for gone)."""
    _presence: Subscription | None = None

    def _key(self, name: str) -> str:
        return f"$KV.{self.subjects.partitions_bucket}.{name}"

    async def round(self, partitions: int) -> set[int]:
        """Renew, then release or take up to a fair share of ``partitions``; the
        partitions held now."""
        if self._presence is None:
            # Subscribed before this replica says it is alive: the others ask here.
            self._presence = await self.nc.subscribe(self._alive(self.me), cb=self._answer)
        self.taken = set()
        await self._put(f"replica.{self.me}", Lease(self.me, utc_now()), None)
        for p, revision in list(self.held.items()):
            renewed = await self._put(f"owner.{p}", Lease(self.me, utc_now()), revision)
            if renewed is None:
                log.warning("partition %d: the lease was taken by another replica", p)
                del self.held[p]
                self.moves += 1
            else:
                self.held[p] = renewed
        for p in [p for p in self.held if p >= partitions]:
            await self._release(p)
        replicas, owners = await self._read()
        self.gone = await self._gone(replicas | {o for _, o in owners.values() if o})
        live = len((replicas - self.gone) | {self.me})
        fair = math.ceil(partitions / live)
        share = f"a fair share of {fair} of {partitions} with {live} live replicas"
        for p in sorted(self.held, reverse=True)[: max(0, len(self.held) - fair)]:
            log.info("partition %d: letting the lease go (%s)", p, share)
            await self._release(p)
        # Free partitions, starting from one of this replica's own (replicas starting
        # together then try different ones first).
        start = hash(self.me) % max(1, partitions)
        for p in [(start + i) % partitions for i in range(partitions)]:
            if len(self.held) >= fair:
                break
            if p in self.held:
                continue
            found = owners.get(p)
            if found is not None and found[1] and found[1] not in self.gone:
                continue  # held by a live lease
            taken = await self._put(
                f"owner.{p}", Lease(self.me, utc_now()), found[0] if found else 0
            )
            if taken is not None:
                holder = found[1] if found else None
                before = f", from {holder}, gone" if holder in self.gone else ""
                log.info("partition %d: lease taken (%s%s)", p, share, before)
                self.held[p] = taken
                self.taken.add(p)
                self.moves += 1
        self.short = len(self.held) < fair or bool(set(self._missing) - self.gone)
        return set(self.held)

    def _alive(self, replica: str) -> str:
        return f"{self.subjects.prefix}.owner.replica.{replica}"

    async def _answer(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(b"")

    async def _gone(self, replicas: set[str]) -> set[str]:
        """The replicas of ``replicas`` (others) without a subscription, twice at least
        :data:`GONE_AFTER_S` apart (see the module)."""
        others = sorted(replicas - {self.me})
        found = dict(zip(others, await asyncio.gather(*map(self._unanswered, others)), strict=True))
        now = time.monotonic()
        answered = {r for r, unanswered in found.items() if unanswered is False}
        self._answered = answered | (self._answered & set(others))
        missing = {r for r, unanswered in found.items() if unanswered and r in self._answered}
        self._missing = {r: self._missing.get(r, now) for r in missing}
        gone = {r for r, since in self._missing.items() if now - since >= GONE_AFTER_S}
        for replica in sorted(gone - self.gone):
            log.warning("replica %s is gone (no subscription): its leases are free", replica)
        return gone

    async def _unanswered(self, replica: str) -> bool | None:
        """Whether nobody subscribes to ``replica``'s subject: True; False: it answered;
        None: it did not answer in time (alive, busy), or this connection had trouble."""
        try:
            await self.nc.request(self._alive(replica), b"", timeout=_PING_S)
        except NoRespondersError:
            return True
        except Exception:  # noqa: BLE001
            return None
        return False

    async def release_all(self) -> None:
        """Let every lease go (a replica stopping: the others take them at once)."""
        for p in list(self.held):
            await self._release(p)
        if self._presence is not None:
            subscription, self._presence = self._presence, None
            await subscription.unsubscribe()

    async def _release(self, p: int) -> None:
        revision = self.held.pop(p)
        self.moves += 1
        headers = {
            "KV-Operation": "DEL",
            "Nats-Expected-Last-Subject-Sequence": str(revision),
            "Nats-TTL": f"{self.ttl}s",
        }
        try:
            await self.nc.request(self._key(f"owner.{p}"), b"", headers=headers, timeout=_TIMEOUT)
        # An unreleased lease only expires.
        except Exception as exc:  # noqa: BLE001
            log.warning("partition %d: could not release the lease: %s", p, exc)

    async def _put(self, name: str, lease: Lease, expected: int | None) -> int | None:
        """The revision of the put (None: refused, the key is not at ``expected``)."""
        headers = {"Nats-TTL": f"{self.ttl}s"}
        if expected is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
        reply = await self.nc.request(
            self._key(name), msgspec.json.encode(lease), headers=headers, timeout=_TIMEOUT
        )
        ack = json.loads(reply.data)
        error = ack.get("error")
        if error:
            if error.get("err_code") == _WRONG_LAST_SEQUENCE:
                return None
            raise RuntimeError(f"{name}: {error.get('description', error)}")
        return int(ack["seq"])

    async def _read(self) -> tuple[set[str], dict[int, tuple[int, str]]]:
        """The live replicas, and each partition's lease key: (its revision, the replica
        a live lease holds it for, empty when none)."""
        return await read_leases(self.nc, self.subjects)


async def read_leases(
    nc: Client, subjects: Subjects
) -> tuple[set[str], dict[int, tuple[int, str]]]:
    """The live replicas, and each partition's lease key: (revision, its holder or "")."""
    bucket = subjects.partitions_bucket
    prefix = f"$KV.{bucket}."
    replicas: set[str] = set()
    owners: dict[int, tuple[int, str]] = {}
    for seq, subject, value in await read_messages(nc, f"KV_{bucket}", f"{prefix}>"):
        key = subject[len(prefix) :]
        if key.startswith("replica.") and _lease(value) is not None:
            replicas.add(key.removeprefix("replica."))
        elif key.startswith("owner."):
            number = key.removeprefix("owner.")
            if number.isdigit():
                lease = _lease(value)
                owners[int(number)] = (seq, lease.owner if lease else "")
    return replicas, owners


async def owners(nc: Client, subjects: Subjects) -> dict[int, str]:
    """Each partition's owner now (partitions no live lease holds are left out)."""
    bucket = subjects.partitions_bucket
    prefix = f"$KV.{bucket}.owner."
    out: dict[int, str] = {}
    for _, subject, value in await read_messages(nc, f"KV_{bucket}", f"{prefix}*"):
        number = subject[len(prefix) :]
        if not number.isdigit():
            continue
        lease = _lease(value)
        if lease is None:
            out.pop(int(number), None)
        else:
            out[int(number)] = lease.owner
    return out
