"""An installation's signing keys: operator, account and system account, with the
credentials issued from them and the revocations that undo them.

Layout of a keys directory (every secret mode 0600)::

    operator.nk  account.nk  system.nk      nkey seeds (the secrets)
    operator.jwt account.jwt system.jwt     the JWTs the server is configured with
    accounts/<A...>.nk  accounts/<A...>.jwt the account of each party's credential
    system.creds                            a system-account user: pushes account updates
    issued.json                             what was issued: name, role, public key, time

``account`` is the orchestrator's: streams, buckets, the orchestrator and operators; its
JWT carries JetStream, the exports parties import (interlock.auth.accounts) and the
revocations of its users. Each agent, publisher and HTTP gateway credential is a user of an
account of its own, made when it is issued, whose JWT carries its imports and its
revocations. Every change re-signs an account JWT, which is pushed to the running servers
(``$SYS.REQ.CLAIMS.UPDATE``), so issuing and revoking need no restart; revoked users are
disconnected by the server as soon as it has the new account JWT.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.auth import accounts, jwt
from interlock.auth.accounts import PARTY_ROLES, UPLOADING_ROLES
from interlock.auth.roles import Role, permissions_for, system
from interlock.core.ids import capability_token, token_taken
from interlock.core.vocabulary import InterlockError
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects

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
    account: str | None = None
    """The public key of the credential's own account (agents, publishers, gateways); ``None``
    for a user of the orchestrator's account (every credential issued before parties had
    accounts of their own)."""
    prefix: str | None = None
    """The subject prefix its account imports (agents, publishers, gateways)."""

    @property
    def old_layout(self) -> bool:
        """An agent, publisher or gateway credential of the orchestrator's account: it still
        works, with the exposure of one shared account (docs/operations.md, upgrading)."""
        return self.role in PARTY_ROLES and self.account is None

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
        if self.account is not None:
            out["account"] = self.account
        if self.prefix is not None:
            out["prefix"] = self.prefix
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
            account=raw.get("account"),
            prefix=raw.get("prefix"),
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

    def account_key(self) -> jwt.KeyPair:
        """The orchestrator account's key pair (it signs that account's users)."""
        return self._seed("account")

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
        """Credentials (a creds file's text) for ``role``.

        An agent, a publisher or a gateway gets an account of its own (made here, signed by the
        operator key, importing its role's subjects only) and is its user; every other
        role is a user of the orchestrator's account. Either account's JWT must reach the
        servers before the credential works: push :meth:`account_jwts` of the record.

        ``seed`` re-signs an existing user key (``interlock dev`` keeps its users' keys and
        signs them with the current permissions on every start), in the account it had;
        by default a new user key.
        """
        user = jwt.read_key(seed) if seed else jwt.new_key("user")
        self._check_tokens(role, user.public_key)
        label = name or _default_name(role)
        tags = [f"role:{role.name}", *(f"capability:{c}" for c in role.capabilities)]
        account, account_key, bucket = self._seed("account"), None, None
        if role.name in PARTY_ROLES:
            account = self._party_account(role, subjects, user.public_key)
            account_key = account.public_key
            tags.append(accounts.JS_API_TAG + subjects.party_js_api)
            if role.name in UPLOADING_ROLES:
                bucket = subjects.party_bucket(account_key)
                tags.append(accounts.OBJECTS_TAG + bucket)
        perms = permissions_for(role, subjects, user.public_key, bucket=bucket)
        nats: dict[str, Any] = {
            "type": "user",
            **perms.claims(),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "tags": tags,
        }
        token = jwt.encode(account, user.public_key, label, nats)
        record = Issued(
            name=label,
            role=role.name,
            public_key=user.public_key,
            issued_at=int(jwt.decode_claims(token)["iat"]),
            capabilities=role.capabilities,
            events=role.events,
            account=account_key,
            prefix=subjects.prefix if account_key else None,
        )
        before = [i for i in self.issued() if i.public_key == user.public_key]
        self._record(record)
        revocations = self.revocations()
        if account_key is not None and any(i.account is None for i in before):
            # A user of the orchestrator's account moved to one of its own (``interlock
            # dev`` after an upgrade): what it was issued there is void.
            revocations[user.public_key] = record.issued_at
        self._sign_account(revocations)  # its exports cover this credential's prefix
        return jwt.creds_text(token, user.seed), record

    def _party_account(self, role: Role, subjects: Subjects, user: str) -> jwt.KeyPair:
        """The account of a party credential: the one its user had (re-signed with the
        imports of ``role``), else a new one."""
        key = None
        for other in self.issued():
            if other.public_key == user and other.account is not None:
                path = self._account_path(other.account, "nk")
                if path.exists():
                    key = jwt.read_key(path.read_text())
        if key is None:
            key = jwt.new_key("account")
            (self.dir / "accounts").mkdir(mode=0o700, exist_ok=True)
            jwt.write_secret(self._account_path(key.public_key, "nk"), key.seed + "\n")
        revoked = self._party_revocations(key)
        bucket = subjects.party_bucket(key.public_key) if role.name in UPLOADING_ROLES else None
        claims = accounts.party_account_claims(
            role, subjects, self.account_public_key, _UNLIMITED, revoked, bucket
        )
        self._write_signed(self._account_path(key.public_key, "jwt"), key.public_key, claims)
        return key

    def _account_path(self, public_key: str, suffix: str) -> Path:
        if not public_key.startswith("A") or not public_key.isalnum():
            raise ValueError(f"{public_key!r} is not an account public key")
        return self.dir / "accounts" / f"{public_key}.{suffix}"

    def _party_revocations(self, key: jwt.KeyPair) -> dict[str, int]:
        path = self._account_path(key.public_key, "jwt")
        if not path.exists():
            return {}
        claims = jwt.decode_claims(path.read_text())
        return dict(claims.get("nats", {}).get("revocations", {}))

    def account_jwts(self, records: list[Issued] | None = None) -> list[str]:
        """The account JWTs the servers need, the orchestrator's first (its exports before
        the imports that name them): with ``records``, those of their accounts only."""
        out = [self.read_jwt("account")]
        chosen = self.issued() if records is None else records
        for record in chosen:
            if record.account is not None:
                path = self._account_path(record.account, "jwt")
                if path.exists():
                    out.append(path.read_text().strip())
        return list(dict.fromkeys(out))

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

    def revoke(self, public_keys: list[str]) -> list[str]:
        """Revoke users (every JWT issued to them until now): re-sign the JWT of each one's
        account with it in its revocations, and return the account JWTs to push."""
        now = int(time.time())
        for key in public_keys:
            if not key.startswith("U"):
                raise ValueError(f"{key!r} is not a user public key")
        records = {i.public_key: i for i in self.issued()}
        own: dict[str, list[str]] = {}  # party account: its users revoked now
        shared = self.revocations()
        for key in public_keys:
            record = records.get(key)
            if record is not None and record.account is not None:
                own.setdefault(record.account, []).append(key)
            else:
                shared[key] = now
        self._sign_account(shared)
        changed: list[Issued] = []
        for account, users in own.items():
            path = self._account_path(account, "jwt")
            claims = jwt.decode_claims(path.read_text())["nats"]
            claims["revocations"] = {**claims.get("revocations", {}), **dict.fromkeys(users, now)}
            claims.pop("version", None)
            self._write_signed(path, account, claims)
            changed.append(records[users[0]])
        marked = [
            Issued(**{**i.__dict__, "revoked_at": now}) if i.public_key in public_keys else i
            for i in self.issued()
        ]
        self._write_issued(marked)
        return self.account_jwts(changed)

    # --- JWT files -----------------------------------------------------------------------
    def _write_jwt(self, name: str, token: str) -> None:
        jwt.write_secret(self.dir / f"{name}.jwt", token + "\n")

    def _sign_account(self, revocations: dict[str, int] | None = None) -> None:
        """Re-sign the orchestrator's account JWT: JetStream, the exports for every subject
        prefix its parties import, its users' revocations (these, or those it has)."""
        self._write_account_jwt(
            self._seed("operator"),
            self.account_public_key,
            self.revocations() if revocations is None else revocations,
        )

    def _write_account_jwt(
        self, operator: jwt.KeyPair, account: str, revocations: dict[str, int]
    ) -> None:
        prefixes = {DEFAULT_PREFIX, *(i.prefix for i in self.issued() if i.prefix)}
        nats: dict[str, Any] = {
            "type": "account",
            "limits": {**_UNLIMITED, **_JETSTREAM},
            "exports": accounts.exports_for(prefixes),
            "default_permissions": {"pub": {}, "sub": {}},
        }
        if revocations:
            nats["revocations"] = revocations
        path = self.dir / "account.jwt"
        if path.exists():
            claims = jwt.decode_claims(path.read_text())
            if claims.get("nats") == {**nats, "version": 2}:
                return  # unchanged: no new JWT to push
        self._write_signed(path, account, nats, ACCOUNT_NAME, operator)

    def _write_signed(
        self,
        path: Path,
        account: str,
        nats: dict[str, Any],
        name: str | None = None,
        operator: jwt.KeyPair | None = None,
    ) -> None:
        """Write an account JWT signed by the operator key at ``path``, issued later than
        the one it replaces (a JWT issued in the same second as the one before would not
        replace it: the server keeps the newer by issue time)."""
        signer = operator or self._seed("operator")
        label = name or account
        token = jwt.encode(signer, account, label, nats)
        if path.exists():
            old = int(jwt.decode_claims(path.read_text()).get("iat", 0))
            while int(jwt.decode_claims(token)["iat"]) <= old:
                time.sleep(0.05)
                token = jwt.encode(signer, account, label, nats)
        jwt.write_secret(path, token + "\n")

    # --- server configuration ---------------------------------------------------------
    def server_config(self, resolver_dir: str | os.PathLike[str]) -> str:
        """A nats-server configuration fragment: trust the operator, keep account JWTs in
        a full resolver at ``resolver_dir`` (updates pushed at run time are kept there),
        preloaded with the system account, the orchestrator's and every party's."""
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
            + "".join(
                f"  {jwt.decode_claims(token)['sub']}: {token}\n" for token in self.account_jwts()
            )
            + "}\n"
        )


def _default_name(role: Role) -> str:
    if role.name == "agent":
        return "agent-" + "-".join(role.capabilities)
    if role.name == "publisher":
        return "publisher-" + "-".join(
            p.replace(">", "all").replace("*", "any") for p in role.events
        )
    return role.name
