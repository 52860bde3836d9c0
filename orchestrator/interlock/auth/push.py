"""Handing a re-signed account JWT to running servers (``$SYS.REQ.CLAIMS.UPDATE``)."""

from __future__ import annotations

import json

from interlock.auth.keys import KeyStore
from interlock.core.vocabulary import InterlockError
from interlock.transport.connection import ConnectOptions, connect

__all__ = ["PushFailed", "push_account"]

UPDATE = "$SYS.REQ.CLAIMS.UPDATE"


class PushFailed(InterlockError):
    """The server did not take the account update."""


async def push_account(opts: ConnectOptions, keys: KeyStore, wait: float = 5.0) -> str:
    """Send the account JWT in ``keys`` to the server(s) of ``opts`` as the system user.

    Returns the server's message. A full resolver keeps the update (and shares it with
    the other servers of a cluster); clients of revoked users are disconnected at once.
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
        account_jwt = keys.read_jwt("account")
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
    finally:
        await nc.close()
