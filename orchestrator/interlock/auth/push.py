"""Handing re-signed account JWTs to running servers (``$SYS.REQ.CLAIMS.UPDATE``)."""

from __future__ import annotations

import json

from nats.aio.client import Client

from interlock.auth.keys import KeyStore
from interlock.core.vocabulary import InterlockError
from interlock.transport.connection import ConnectOptions, connect

__all__ = ["PushFailed", "push_account"]

UPDATE = "$SYS.REQ.CLAIMS.UPDATE"


class PushFailed(InterlockError):
    """The server did not take the account update."""


async def push_account(
    opts: ConnectOptions, keys: KeyStore, tokens: list[str] | None = None, wait: float = 5.0
) -> str:
    """Send account JWTs (``tokens``; by default every account of ``keys``, the
    orchestrator's first) to the server(s) of ``opts`` as the system user.

    Returns the server's message for the last. A full resolver keeps each update (and
    shares it with the other servers of a cluster); clients of revoked users are
    disconnected at once. Then the object bucket of each party credential is made where
    it is missing (interlock.auth.buckets).
    """
    sys_opts = ConnectOptions(
        servers=opts.servers,
        creds_file=str(keys.system_creds),
        tls_ca=opts.tls_ca,
        tls_cert=opts.tls_cert,
        tls_key=opts.tls_key,
        name="interlock-creds",
        connect_wait=opts.connect_wait,
    )
    nc = await connect(sys_opts)
    try:
        message = "no account to push"
        for token in keys.account_jwts() if tokens is None else tokens:
            message = await _push_one(nc, token, wait)
    finally:
        await nc.close()
    # Each party's own object bucket, in the orchestrator's account (made once).
    from interlock.auth.buckets import ensure_party_buckets

    try:
        await ensure_party_buckets(opts, keys)
    except Exception as exc:
        raise PushFailed(
            f"pushed, but the parties' object buckets could not be made: {exc}"
        ) from exc
    return message


async def _push_one(nc: Client, account_jwt: str, wait: float) -> str:
    """Push one account JWT; the server's message."""
    try:
        reply = await nc.request(UPDATE, account_jwt.encode(), timeout=wait)
    except Exception as exc:
        raise PushFailed(f"no server answered the account update on {UPDATE}: {exc}") from exc
    try:
        body = json.loads(reply.data)
    except json.JSONDecodeError as exc:
        raise PushFailed(f"the server answered the update with {reply.data!r}") from exc
    if "error" in body:
        error = body["error"]
        detail = error.get("description", error) if isinstance(error, dict) else error
        raise PushFailed(f"the server refused the account update: {detail}")
    data = body.get("data", {})
    return str(data.get("message", "updated"))
