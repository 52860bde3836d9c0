"""Making the object bucket of each party credential (an agent's answers, a publisher's
events), in the orchestrator's account, where JetStream is: a party's own account has no
JetStream and may not make streams.

Whoever issues credentials holds the orchestrator account's key, so it signs itself a
user of that account for the moment (allowed only to read and make those buckets' streams,
never written anywhere but a temporary file, removed at once) and makes the buckets that
are missing. ``interlock creds issue`` and ``push`` do it after pushing the accounts;
``interlock dev`` once its server is up.
"""

from __future__ import annotations

import os
import tempfile

from interlock.auth import jwt
from interlock.auth.accounts import UPLOADING_ROLES
from interlock.auth.keys import Issued, KeyStore
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.objects import Objects
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects, inbox_prefix

__all__ = ["PARTY_MAX_AGE_S", "ensure_party_buckets", "party_buckets"]

PARTY_MAX_AGE_S = 7 * 86400
"""How long a party's uploads are kept: as long as events and answers wait in their
streams (the orchestrator copies what a run takes into the run's own objects)."""


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
    ``keys``) that the servers of ``opts`` do not have yet; the buckets wanted."""
    wanted = party_buckets(keys.issued() if records is None else records)
    if not wanted:
        return []
    user = jwt.new_key("user")
    api = "$JS.API.STREAM"
    claims = {
        "type": "user",
        "pub": {"allow": [f"{api}.{op}.OBJ_{b}" for b in wanted for op in ("INFO", "CREATE")]},
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
        for bucket in wanted:
            await objects.ensure_bucket(bucket, replicas=replicas, max_age_s=PARTY_MAX_AGE_S)
    finally:
        await nc.close()
    return wanted
