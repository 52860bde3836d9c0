"""Authentication for one machine (``interlock dev``, ``make demo``): keys made once and
kept in the data directory, a server configuration trusting them, and one creds file per
role the stack runs with.

    <data>/keys/           operator, account and system keys (see ``keys``)
    <data>/jwt/            the server's account resolver (updates pushed at run time)
    <data>/auth.conf       the server configuration fragment
    <data>/creds/operator.creds      the CLI's (found from the data directory's parent)
    <data>/creds/orchestrator.creds  `interlock serve`
    <data>/creds/gateway.creds       the HTTP gateway (role ``gateway``)
    <data>/creds/agents.creds        the reference agents (their capabilities only)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interlock.auth.keys import KeyStore
    from interlock.transport.subjects import Subjects

# Keys, JWTs and roles (nkeys, PyNaCl) are imported by what makes credentials: a read
# command that only looks for the operator's creds file (default_operator_creds) loads
# none of them.

__all__ = [
    "DEFAULT_DATA_DIR",
    "DevAuth",
    "DevContext",
    "context_file",
    "default_operator_creds",
    "folder_defaults",
    "operator_defaults",
    "prepare",
    "record_context",
    "recorded_context",
    "recorded_server",
]

DEFAULT_DATA_DIR = ".interlock"


@dataclass(frozen=True)
class DevAuth:
    keys: KeyStore
    config: Path
    creds_dir: Path

    @property
    def server_args(self) -> list[str]:
        """nats-server flags that load the auth configuration."""
        return ["-c", str(self.config)]

    @property
    def operator(self) -> Path:
        return self.creds_dir / "operator.creds"

    @property
    def orchestrator(self) -> Path:
        return self.creds_dir / "orchestrator.creds"

    @property
    def gateway(self) -> Path:
        return self.creds_dir / "gateway.creds"

    @property
    def agents(self) -> Path:
        return self.creds_dir / "agents.creds"


def prepare(
    data_dir: str | os.PathLike[str], subjects: Subjects, capabilities: Iterable[str]
) -> DevAuth:
    """Keys (made on first use, kept after), the server configuration, and the creds of
    the orchestrator, the operator, the HTTP gateway and agents serving ``capabilities``.

    The creds are signed again on every call with the permissions of this version, for the
    same user keys: a creds file copied elsewhere keeps working, and permissions follow
    upgrades.
    """
    from interlock.auth import jwt
    from interlock.auth.keys import KeyStore
    from interlock.auth.roles import Role

    data = Path(data_dir)
    keys = KeyStore(data / "keys").ensure()
    creds_dir = data / "creds"
    creds_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(creds_dir, 0o700)
    roles = {
        "orchestrator": Role("orchestrator"),
        "operator": Role("operator"),
        "gateway": Role("gateway"),
        "agents": Role("agent", capabilities=tuple(capabilities)),
    }
    for file_name, role in roles.items():
        path = creds_dir / f"{file_name}.creds"
        seed = None
        if path.exists():
            try:
                seed = jwt.parse_creds(path.read_text())[1]
            except ValueError:
                seed = None
        name = f"dev-{file_name}"
        if seed is not None and _revoked(keys, seed):
            seed = None  # a revoked dev user gets a new key
        text, _record = keys.issue(role, subjects, name=name, seed=seed)
        jwt.write_secret(path, text)
    resolver = data / "jwt"
    resolver.mkdir(parents=True, exist_ok=True)
    config = data / "auth.conf"
    jwt.write_secret(config, keys.server_config(resolver.resolve()))
    return DevAuth(keys=keys, config=config, creds_dir=creds_dir)


def _revoked(keys: KeyStore, seed: str) -> bool:
    from interlock.auth import jwt

    try:
        public = jwt.read_key(seed).public_key
    # An unreadable seed is as good as revoked.
    except Exception:  # noqa: BLE001
        return True
    records = [i for i in keys.issued() if i.public_key == public]
    if any(i.revoked_at is not None for i in records):
        return True
    # A user of the orchestrator's account revoked there (by key, not by its record).
    old = not records or any(i.account is None for i in records)
    return old and public in keys.revocations()


def default_operator_creds(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """``.interlock/creds/operator.creds`` under ``cwd`` when it is there (the CLI run from
    the directory ``interlock dev`` runs in uses it), else ``None``."""
    path = Path(cwd or Path.cwd()) / DEFAULT_DATA_DIR / "creds" / "operator.creds"
    return str(path) if path.is_file() else None


CONTEXT_ENV = "INTERLOCK_CONTEXT"


@dataclass(frozen=True)
class DevContext:
    """Where the last ``interlock dev`` of this user serves, and its operator's creds."""

    url: str
    creds: str | None
    data_dir: str


def context_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``interlock dev`` records its context for the CLI: ``$INTERLOCK_CONTEXT``, else
    ``$XDG_CONFIG_HOME/interlock/dev.json`` (``~/.config/interlock/dev.json``)."""
    env = os.environ if environ is None else environ
    if env.get(CONTEXT_ENV):
        return Path(env[CONTEXT_ENV])
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "interlock" / "dev.json"


def record_context(url: str, creds: Path | None, data_dir: Path) -> Path | None:
    """Record where ``interlock dev`` serves and its operator's creds (readable by this
    user only), for the CLI run from any folder; None when it cannot be written."""
    path = context_file()
    body = {
        "url": url,
        "creds": str(creds.resolve()) if creds is not None else None,
        "data_dir": str(data_dir.resolve()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        path.with_suffix(".tmp").replace(path)
    except OSError:
        return None
    return path


def recorded_context() -> DevContext | None:
    """What the last ``interlock dev`` recorded (None: nothing, or nothing readable)."""
    try:
        body = json.loads(context_file().read_text(encoding="utf-8"))
        url, creds, data_dir = body["url"], body.get("creds"), body["data_dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(url, str) or not isinstance(data_dir, str):
        return None
    if creds is not None and not (isinstance(creds, str) and Path(creds).is_file()):
        return None
    return DevContext(url=url, creds=creds, data_dir=data_dir)


def recorded_server(path: str | os.PathLike[str]) -> str | None:
    """The server the last ``interlock dev`` serves when ``path`` (its operator's
    credential, its keys folder) is in its data folder: the CLI run there uses it, whatever
    port it took (None: elsewhere, or nothing recorded)."""
    context = recorded_context()
    if context is None:
        return None
    inside = Path(path).resolve().is_relative_to(Path(context.data_dir).resolve())
    return context.url if inside else None


def folder_defaults(server: object = None) -> tuple[str | None, str | None]:
    """The operator's credential ``interlock dev`` wrote in this folder (or None), and,
    when neither ``server`` nor ``INTERLOCK_URL`` names one, that ``interlock dev``'s own
    server (it may have taken another port than 4222; None: the default)."""
    creds = default_operator_creds()
    if creds is None or server or os.environ.get("INTERLOCK_URL"):
        return creds, None
    return creds, recorded_server(creds)


def operator_defaults(
    server: str | list[str] | None,
) -> tuple[str | None, str | list[str] | None]:
    """The credential and server of an operator that names no credential (the CLI, the
    Python client): those ``interlock dev`` wrote in this folder, else, from any folder,
    those the last ``interlock dev`` recorded, when no other server is named (``server``,
    else ``INTERLOCK_URL``). Returns (creds or None, the server to use or ``server``)."""
    given = server or os.environ.get("INTERLOCK_URL")
    creds, found = folder_defaults(server)
    server = server or found
    if creds is not None:
        return creds, server
    context = recorded_context()
    if context is None:
        return None, server
    if not given or (isinstance(given, str) and given.strip() == context.url):
        return context.creds, server or given or context.url
    return None, server
