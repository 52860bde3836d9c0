"""NATS decentralized-auth JWTs and nkeys: make keys, sign and read claims, write creds files.

A NATS JWT is ``base64url(header).base64url(claims).base64url(ed25519 signature)`` where the
signature is made with the issuer's nkey over the first two parts, and the claims name the
issuer (``iss``) and subject (``sub``) by their nkey public keys. The server checks the
chain operator -> account -> user with the public keys alone. ``nkeys`` (the NATS
project's own package, already a dependency of nats-py's ``nkeys`` extra) does the keys and
the signatures; the claims are plain JSON (see docs/architecture.md for why no JWT package).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import nkeys

__all__ = [
    "KeyPair",
    "decode_claims",
    "encode",
    "new_key",
    "parse_creds",
    "read_key",
    "write_creds",
]

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}


@dataclass(frozen=True)
class KeyPair:
    """An nkey: the seed (secret, ``S...``) and its public key (``O...``/``A...``/``U...``)."""

    seed: str
    public_key: str

    def sign(self, data: bytes) -> bytes:
        kp = nkeys.from_seed(self.seed.encode())
        try:
            return bytes(kp.sign(data))
        finally:
            kp.wipe()


def new_key(kind: str) -> KeyPair:
    """A fresh random nkey of ``kind`` (``operator``, ``account`` or ``user``)."""
    seed = nkeys.encode_seed(os.urandom(32), _PREFIXES[kind]).decode()
    return read_key(seed)


def read_key(seed: str) -> KeyPair:
    """The key pair of an nkey seed (``nkeys.ErrInvalidSeed`` when it is not one)."""
    kp = nkeys.from_seed(seed.strip().encode())
    try:
        return KeyPair(seed=seed.strip(), public_key=kp.public_key.decode())
    finally:
        kp.wipe()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(issuer: KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A JWT issued (signed) by ``issuer`` for ``subject`` (a public key), with the ``nats``
    claims (which carry their ``type`` and ``version``)."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public_key,
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    # The id is a hash of the claims without it, as the NATS tools make it.
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps(_HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = issuer.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(signature)}"


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, without checking its signature (the server does that)."""
    try:
        _head, body, _sig = token.strip().split(".")
        claims = json.loads(_unb64(body))
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a NATS JWT: {exc}") from exc
    if not isinstance(claims, dict):
        # Bad content, not a bad call: callers catch ValueError.
        raise ValueError("not a NATS JWT: its claims are not an object")  # noqa: TRY004
    return claims


_CREDS = """-----BEGIN NATS USER JWT-----
{jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{seed}
------END USER NKEY SEED------

*************************************************************
"""

_BLOCK = re.compile(r"-{3,}BEGIN [A-Z ]+-{3,}\s*\n\s*(\S+)\s*\n\s*-{3,}END [A-Z ]+-{3,}")


def creds_text(user_jwt: str, seed: str) -> str:
    """A ``.creds`` file's text: the user JWT and its nkey seed, in the NATS tools' format."""
    return _CREDS.format(jwt=user_jwt, seed=seed)


def write_creds(path: str | os.PathLike[str], user_jwt: str, seed: str) -> None:
    """Write a creds file readable by its owner only, replacing any file there atomically."""
    write_secret(path, creds_text(user_jwt, seed))


def write_secret(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (a temporary file renamed)."""
    target = os.fspath(path)
    tmp = f"{target}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def parse_creds(text: str) -> tuple[str, str]:
    """``(user JWT, seed)`` from a creds file's text."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 2:
        raise ValueError("not a NATS credentials file (expected a JWT and a seed block)")
    return blocks[0], blocks[1]


def creds_user(path: str | os.PathLike[str]) -> str:
    """The user public key a creds file authenticates as."""
    with open(path, encoding="utf-8") as f:
        user_jwt, _seed = parse_creds(f.read())
    return str(decode_claims(user_jwt)["sub"])


def creds_tags(path: str | os.PathLike[str]) -> list[str]:
    """The tags of a creds file's user JWT."""
    with open(path, encoding="utf-8") as f:
        user_jwt, _seed = parse_creds(f.read())
    tags = decode_claims(user_jwt).get("nats", {}).get("tags") or []
    return [str(t) for t in tags]


def creds_capabilities(path: str | os.PathLike[str]) -> set[str] | None:
    """The capabilities an agent creds file issued by Interlock allows (its ``capability:``
    tags); ``None`` for any other credential."""
    with open(path, encoding="utf-8") as f:
        user_jwt, _seed = parse_creds(f.read())
    tags = decode_claims(user_jwt).get("nats", {}).get("tags") or []
    if "role:agent" not in tags:
        return None
    return {t.removeprefix("capability:") for t in tags if t.startswith("capability:")}
