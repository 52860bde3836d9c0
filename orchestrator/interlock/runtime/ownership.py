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

A lease decides who reads the partition's ``relay`` consumer (the outbox: dispatch,
timers, child runs, the run index), so that one replica acts on a partition's appends and
keeps those runs' states warm. It is not what keeps a run's log right: a replica that
still acts after its lease expired (paused, then resumed) appends under the same
optimistic check as always, and effects carry their deterministic ids.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import socket
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client

from interlock.transport.clock import utc_now
from interlock.transport.directget import read_messages
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.orchestrator")

LEASE_TTL_S = 6
"""How long a lease (and a replica's presence) lasts without a renewal, in seconds."""
ROUND_S = 2.0
"""How often a replica renews its leases and takes or releases partitions."""
_TIMEOUT = 5.0
_WRONG_LAST_SEQUENCE = 10071


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
    let some go: the next round comes sooner, so that a partition let go is taken at once)."""

    def _key(self, name: str) -> str:
        return f"$KV.{self.subjects.partitions_bucket}.{name}"

    async def round(self, partitions: int) -> set[int]:
        """Renew, then release or take up to a fair share of ``partitions``; the
        partitions held now."""
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
        live = len(replicas | {self.me})
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
            if found is not None and found[1]:
                continue  # held by a live lease
            taken = await self._put(
                f"owner.{p}", Lease(self.me, utc_now()), found[0] if found else 0
            )
            if taken is not None:
                log.info("partition %d: lease taken (%s)", p, share)
                self.held[p] = taken
                self.moves += 1
        self.short = len(self.held) < fair
        return set(self.held)

    async def release_all(self) -> None:
        """Let every lease go (a replica stopping: the others take them at once)."""
        for p in list(self.held):
            await self._release(p)

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

    async def _read(self) -> tuple[set[str], dict[int, tuple[int, bool]]]:
        """The live replicas, and each partition's lease key: (its revision, whether a
        live lease holds it)."""
        return await read_leases(self.nc, self.subjects)


async def read_leases(
    nc: Client, subjects: Subjects
) -> tuple[set[str], dict[int, tuple[int, bool]]]:
    """The live replicas, and each partition's lease key: (revision, whether held)."""
    bucket = subjects.partitions_bucket
    prefix = f"$KV.{bucket}."
    replicas: set[str] = set()
    owners: dict[int, tuple[int, bool]] = {}
    for seq, subject, value in await read_messages(nc, f"KV_{bucket}", f"{prefix}>"):
        key = subject[len(prefix) :]
        if key.startswith("replica.") and _lease(value) is not None:
            replicas.add(key.removeprefix("replica."))
        elif key.startswith("owner."):
            number = key.removeprefix("owner.")
            if number.isdigit():
                owners[int(number)] = (seq, _lease(value) is not None)
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
