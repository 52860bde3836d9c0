"""Making the object bucket of each party credential (an agent's answers, a publisher's
events), in the orchestrator's account, where JetStream is: a party's own account has no
JetStream and may not make streams.

Whoever issues credentials holds the orchestrator account's key, so it signs itself a
user of that account for the moment (allowed only to read and make those buckets' streams,
never written anywhere but a temporary file, removed at once) and makes the buckets that
are missing. ``interlock creds issue`` and ``push`` do it after pushing the accounts;
``interlock dev`` once its server is up.

Each bucket is bounded (``max_bytes``, :data:`DEFAULT_UPLOAD_LIMIT` unless the credential
was issued with ``--upload-limit``): a party writes its own bucket as much as it likes,
and without a bound it could fill the servers' disk, which every stream of the
installation shares. A put past the bound is refused by the server, and the SDK says so
(``BucketFull``). The bounds set are kept beside the keys, in ``upload-limits.json``
(account public key -> bytes).
"""

from __future__ import annotations

import json
import os
import tempfile

from interlock.auth import jwt
from interlock.auth.accounts import UPLOADING_ROLES
from interlock.auth.keys import Issued, KeyStore
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.objects import Objects, parse_bytes
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects, inbox_prefix

__all__ = [
    "DEFAULT_UPLOAD_LIMIT",
    "PARTY_MAX_AGE_S",
    "bucket_limits",
    "ensure_party_bucket",
    "ensure_party_buckets",
    "party_buckets",
    "set_upload_limit",
    "upload_limits",
]

PARTY_MAX_AGE_S = 7 * 86400
"""How long a party's uploads are kept: as long as events and answers wait in their
streams (the orchestrator copies what a run takes into the run's own objects)."""
DEFAULT_UPLOAD_LIMIT = 1 << 30
"""The bytes a party's bucket holds at most unless its credential says otherwise (1 GiB:
sixteen payloads at the largest size taken by reference, 64 MiB)."""
_LIMITS_FILE = "upload-limits.json"


def upload_limits(keys: KeyStore) -> dict[str, int]:
    """The bounds set on parties' buckets, by account public key (the others have
    :data:`DEFAULT_UPLOAD_LIMIT`)."""
    path = keys.dir / _LIMITS_FILE
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def set_upload_limit(keys: KeyStore, account: str, size: str | int) -> int:
    """Keep ``size`` (bytes, or ``2GiB``...) as the bound of ``account``'s bucket; the
    bytes. Applied when the buckets are next made (``interlock creds issue``/``push``)."""
    limit = size if isinstance(size, int) else parse_bytes(size)
    if limit < 1 << 20:
        raise ValueError(f"an upload limit of {limit} bytes: at least 1MiB")
    limits = upload_limits(keys)
    limits[account] = limit
    (keys.dir / _LIMITS_FILE).write_text(json.dumps(limits, indent=2, sort_keys=True) + "\n")
    return limit


async def ensure_party_bucket(
    objects: Objects, bucket: str, limit: int | None, replicas: int = 1
) -> None:
    """Make (or bring to its settings) one party's bucket: its objects kept
    :data:`PARTY_MAX_AGE_S`, at most ``limit`` bytes (None: the default), rollups taken
    (NATS object store clients put with ``Nats-Rollup: sub``; one of ``all`` there purges
    that party's own objects only)."""
    await objects.ensure_bucket(
        bucket,
        replicas=replicas,
        max_age_s=PARTY_MAX_AGE_S,
        max_bytes=limit or DEFAULT_UPLOAD_LIMIT,
        rollups=True,
    )


def party_buckets(records: list[Issued]) -> list[str]:
    """The object buckets of the party credentials among ``records`` not revoked."""
    return sorted(
        {
            Subjects(r.prefix or DEFAULT_PREFIX).party_bucket(r.account)
            for r in records
            if r.account is not None and r.revoked_at is None and r.role in UPLOADING_ROLES
        }
    )


async def ensure_party_buckets(
    opts: ConnectOptions, keys: KeyStore, records: list[Issued] | None = None, replicas: int = 1
) -> list[str]:
    """Make the object buckets of ``records`` (by default every credential issued from
    ``keys``) that the servers of ``opts`` do not have yet, and bring those they have to
    their bounds; the buckets wanted."""
    wanted = party_buckets(keys.issued() if records is None else records)
    if not wanted:
        return []
    user = jwt.new_key("user")
    api = "$JS.API.STREAM"
    claims = {
        "type": "user",
        "pub": {
            "allow": [f"{api}.{op}.OBJ_{b}" for b in wanted for op in ("INFO", "CREATE", "UPDATE")]
        },
        "sub": {"allow": [f"{inbox_prefix(user.public_key)}.>"]},
        "subs": -1,
        "data": -1,
        "payload": -1,
    }
    token = jwt.encode(keys.account_key(), user.public_key, "interlock-creds-buckets", claims)
    fd, path = tempfile.mkstemp(prefix="interlock-buckets-", suffix=".creds")
    os.close(fd)
    try:
        jwt.write_creds(path, token, user.seed)
        nc = await connect(
            ConnectOptions(
                servers=opts.servers,
                creds_file=path,
                tls_ca=opts.tls_ca,
                tls_cert=opts.tls_cert,
                tls_key=opts.tls_key,
                name="interlock-creds",
                connect_wait=opts.connect_wait,
            )
        )
    finally:
        os.unlink(path)
    try:
        objects = Objects(nc)
        limits = bucket_limits(keys)
        for bucket in wanted:
            await ensure_party_bucket(objects, bucket, limits.get(bucket), replicas)
    finally:
        await nc.close()
    return wanted


def bucket_limits(keys: KeyStore) -> dict[str, int]:
    """The bounds set on parties' buckets, by bucket name."""
    out: dict[str, int] = {}
    limits = upload_limits(keys)
    for record in keys.issued():
        limit = limits.get(record.account or "")
        if limit is not None and record.account is not None:
            bucket = Subjects(record.prefix or DEFAULT_PREFIX).party_bucket(record.account)
            out[bucket] = limit
    return out
