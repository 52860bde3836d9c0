"""An installation's signing keys: operator, account and system account, with the
credentials issued from them and the revocations that undo them.

Layout of a keys directory (every secret mode 0600)::

    operator.nk  account.nk  system.nk      nkey seeds (the secrets)
    operator.jwt account.jwt system.jwt     the JWTs the server is configured with
    system.creds                            a system-account user: pushes account updates
    issued.json                             what was issued: name, role, public key, time

The account JWT carries JetStream limits and the revocations; every change re-signs it and
is pushed to the running servers (``$SYS.REQ.CLAIMS.UPDATE``), so issuing and revoking need
no restart: new users are checked against the account key alone, revoked ones are
disconnected by the server as soon as it has the new account JWT.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.auth import jwt
from interlock.auth.roles import Role, permissions_for, system
from interlock.core.ids import capability_token, token_taken
from interlock.core.vocabulary import InterlockError
from interlock.transport.subjects import Subjects

__all__ = ["AUTH_ERRORS", "Issued", "KeyStore", "KeysMissing"]

ACCOUNT_NAME = "INTERLOCK"
SYSTEM_NAME = "SYS"
AUTH_ERRORS = ("authorization violation", "authentication", "revoked")
MAX_CONTROL_LINE = 64 * 1024
"""Bytes a client's protocol line may take, its CONNECT (with the user JWT) included: room
for an agent credential of about 150 capabilities (nats-server's default, 4 KB, holds 7)."""

_UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
# JetStream on for the account, without limits of its own (the server's apply).
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


class KeysMissing(InterlockError):
    """The keys directory has no (readable) keys."""


@dataclass(frozen=True)
class Issued:
    """One issued credential, as recorded in ``issued.json``."""

    name: str
    role: str
    public_key: str
    issued_at: int
    capabilities: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    revoked_at: int | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "public_key": self.public_key,
            "issued_at": self.issued_at,
        }
        if self.capabilities:
            out["capabilities"] = list(self.capabilities)
        if self.events:
            out["events"] = list(self.events)
        if self.revoked_at is not None:
            out["revoked_at"] = self.revoked_at
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Issued:
        return cls(
            name=str(raw["name"]),
            role=str(raw["role"]),
            public_key=str(raw["public_key"]),
            issued_at=int(raw["issued_at"]),
            capabilities=tuple(raw.get("capabilities", ())),
            events=tuple(raw.get("events", ())),
            revoked_at=raw.get("revoked_at"),
        )


class KeyStore:
    """The keys of one installation, in a directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    # --- creation ----------------------------------------------------------------------
    @property
    def exists(self) -> bool:
        return (self.dir / "account.nk").is_file()

    def ensure(self) -> KeyStore:
        """Create the operator, account and system keys and JWTs unless they exist."""
        if self.exists:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        operator = jwt.new_key("operator")
        account = jwt.new_key("account")
        sys_account = jwt.new_key("account")
        for name, key in (("operator", operator), ("system", sys_account)):
            jwt.write_secret(self.dir / f"{name}.nk", key.seed + "\n")
        self._write_jwt(
            "operator",
            jwt.encode(
                operator,
                operator.public_key,
                "interlock",
                {"type": "operator", "system_account": sys_account.public_key},
            ),
        )
        self._write_jwt(
            "system",
            jwt.encode(
                operator,
                sys_account.public_key,
                SYSTEM_NAME,
                {"type": "account", "limits": _UNLIMITED},
            ),
        )
        sys_user = jwt.new_key("user")
        sys_user_jwt = jwt.encode(
            sys_account,
            sys_user.public_key,
            "interlock-system",
            {
                "type": "user",
                **system(sys_user.public_key).claims(),
                "subs": -1,
                "data": -1,
                "payload": -1,
            },
        )
        jwt.write_creds(self.dir / "system.creds", sys_user_jwt, sys_user.seed)
        # The account key last: its presence is what "exists" means.
        self._write_account_jwt(operator, account.public_key, {})
        jwt.write_secret(self.dir / "account.nk", account.seed + "\n")
        return self

    # --- reading -----------------------------------------------------------------------
    def _seed(self, name: str) -> jwt.KeyPair:
        path = self.dir / f"{name}.nk"
        try:
            return jwt.read_key(path.read_text())
        except FileNotFoundError:
            raise KeysMissing(
                f"no {name} key at {path}: run `interlock dev` once, or "
                f"`interlock creds init --keys {self.dir}`"
            ) from None
        except OSError as exc:
            raise KeysMissing(f"cannot read {path}: {exc.strerror or exc}") from exc

    def read_jwt(self, name: str) -> str:
        path = self.dir / f"{name}.jwt"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise KeysMissing(f"no {name} JWT at {path}") from None

    @property
    def account_public_key(self) -> str:
        return str(jwt.decode_claims(self.read_jwt("account"))["sub"])

    @property
    def system_public_key(self) -> str:
        return str(jwt.decode_claims(self.read_jwt("system"))["sub"])

    @property
    def system_creds(self) -> Path:
        return self.dir / "system.creds"

    def issued(self) -> list[Issued]:
        path = self.dir / "issued.json"
        if not path.exists():
            return []
        return [Issued.from_json(raw) for raw in json.loads(path.read_text())]

    def revocations(self) -> dict[str, int]:
        claims = jwt.decode_claims(self.read_jwt("account"))
        return dict(claims.get("nats", {}).get("revocations", {}))

    # --- issuing -------------------------------------------------------------------------
    def issue(
        self,
        role: Role,
        subjects: Subjects,
        *,
        name: str | None = None,
        seed: str | None = None,
    ) -> tuple[str, Issued]:
        """Credentials (a creds file's text) for ``role``, signed by the account key.

        ``seed`` re-signs an existing user key (``interlock dev`` keeps its users' keys and
        signs them with the current permissions on every start); by default a new user key.
        """
        account = self._seed("account")
        user = jwt.read_key(seed) if seed else jwt.new_key("user")
        perms = permissions_for(role, subjects, user.public_key)
        self._check_tokens(role, user.public_key)
        label = name or _default_name(role)
        nats: dict[str, Any] = {
            "type": "user",
            **perms.claims(),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "tags": [f"role:{role.name}", *(f"capability:{c}" for c in role.capabilities)],
        }
        token = jwt.encode(account, user.public_key, label, nats)
        record = Issued(
            name=label,
            role=role.name,
            public_key=user.public_key,
            issued_at=int(jwt.decode_claims(token)["iat"]),
            capabilities=role.capabilities,
            events=role.events,
        )
        self._record(record)
        return jwt.creds_text(token, user.seed), record

    def _check_tokens(self, role: Role, public_key: str) -> None:
        """Refuse an agent credential for a capability whose NATS token another capability
        has (``a.b`` and ``a_b``: one task consumer, one set of heartbeat keys), in this
        credential or in one issued before and not revoked: its agent could take the
        other's tasks. (``apply`` refuses defining both; this keeps a credential from
        reaching a capability it was not issued for.)

        Raises:
            ValueError: naming both capabilities and the credential of the other.
        """
        owners: dict[str, str] = {}
        held_by: dict[str, str] = {}  # capability: the first credential that holds it
        for other in self.issued():
            if other.role != "agent" or other.revoked_at is not None:
                continue
            if other.public_key == public_key:  # re-signed (``interlock dev``)
                continue
            for cap in other.capabilities:
                token_taken(owners, cap)
                held_by.setdefault(cap, f"credential {other.name!r}")
        for cap in role.capabilities:
            taken = token_taken(owners, cap)
            if taken is not None:
                raise ValueError(
                    f"capability {cap!r} has the NATS token {capability_token(cap)!r} of "
                    f"capability {taken!r} ({held_by.get(taken, 'this credential')}): an "
                    "agent of one could take the other's tasks; name it otherwise"
                )

    def _record(self, record: Issued) -> None:
        kept = [i for i in self.issued() if i.public_key != record.public_key]
        self._write_issued([*kept, record])

    def _write_issued(self, records: list[Issued]) -> None:
        text = json.dumps([r.as_json() for r in records], indent=2) + "\n"
        jwt.write_secret(self.dir / "issued.json", text)

    # --- revoking ------------------------------------------------------------------------
    def find(self, who: str) -> list[Issued]:
        """Issued credentials matching ``who``: a user public key, a name, or a creds file."""
        key = who
        if os.path.isfile(who):
            user_jwt, _seed = jwt.parse_creds(Path(who).read_text())
            key = str(jwt.decode_claims(user_jwt)["sub"])
        return [i for i in self.issued() if key in (i.public_key, i.name)]

    def revoke(self, public_keys: list[str]) -> str:
        """Revoke users (every JWT issued to them until now): re-sign the account JWT with
        them in its revocations and return it, to be pushed to the servers."""
        now = int(time.time())
        revocations = self.revocations()
        for key in public_keys:
            if not key.startswith("U"):
                raise ValueError(f"{key!r} is not a user public key")
            revocations[key] = now
        self._write_account_jwt(self._seed("operator"), self.account_public_key, revocations)
        marked = [
            Issued(**{**i.__dict__, "revoked_at": now}) if i.public_key in public_keys else i
            for i in self.issued()
        ]
        self._write_issued(marked)
        return self.read_jwt("account")

    # --- JWT files -----------------------------------------------------------------------
    def _write_jwt(self, name: str, token: str) -> None:
        jwt.write_secret(self.dir / f"{name}.jwt", token + "\n")

    def _write_account_jwt(
        self, operator: jwt.KeyPair, account: str, revocations: dict[str, int]
    ) -> None:
        nats: dict[str, Any] = {
            "type": "account",
            "limits": {**_UNLIMITED, **_JETSTREAM},
            "default_permissions": {"pub": {}, "sub": {}},
        }
        if revocations:
            nats["revocations"] = revocations
        # A JWT issued in the same second as the one it replaces would not replace it:
        # the server keeps the newer by issue time.
        previous = self.dir / "account.jwt"
        token = jwt.encode(operator, account, ACCOUNT_NAME, nats)
        if previous.exists():
            old = int(jwt.decode_claims(previous.read_text()).get("iat", 0))
            while int(jwt.decode_claims(token)["iat"]) <= old:
                time.sleep(0.05)
                token = jwt.encode(operator, account, ACCOUNT_NAME, nats)
        self._write_jwt("account", token)

    # --- server configuration ---------------------------------------------------------
    def server_config(self, resolver_dir: str | os.PathLike[str]) -> str:
        """A nats-server configuration fragment: trust the operator, keep account JWTs in
        a full resolver at ``resolver_dir`` (updates pushed at run time are kept there),
        preloaded with the system and Interlock accounts."""
        return (
            "# Interlock decentralized auth (generated by `interlock creds server-config`)\n"
            "# A client sends its user JWT in its CONNECT line: an agent's grows by about\n"
            "# 400 bytes per capability, past the default 4 KB limit at 8 capabilities.\n"
            f"max_control_line: {MAX_CONTROL_LINE}\n"
            f"operator: {self.read_jwt('operator')}\n"
            f"system_account: {self.system_public_key}\n"
            "resolver: {\n"
            "  type: full\n"
            f"  dir: {json.dumps(str(resolver_dir))}\n"
            "  allow_delete: false\n"
            '  interval: "2m"\n'
            "}\n"
            "resolver_preload: {\n"
            f"  {self.system_public_key}: {self.read_jwt('system')}\n"
            f"  {self.account_public_key}: {self.read_jwt('account')}\n"
            "}\n"
        )


def _default_name(role: Role) -> str:
    if role.name == "agent":
        return "agent-" + "-".join(role.capabilities)
    if role.name == "publisher":
        return "publisher-" + "-".join(
            p.replace(">", "all").replace("*", "any") for p in role.events
        )
    return role.name
