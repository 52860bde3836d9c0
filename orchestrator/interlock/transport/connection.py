"""Connecting to NATS: options from flags and ``INTERLOCK_*`` environment, one ``connect``.

The first connection is bounded (``connect_wait`` seconds, and an authorization error
fails at once) and ends in a ``ConnectionFailed`` naming the URL. Once connected, the client
reconnects forever: a long-running service rides out server restarts and cluster moves
instead of exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client

from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.errors import ConnectionFailed
from interlock.transport.natsclient import NatsClient
from interlock.transport.subjects import DEFAULT_PREFIX, Subjects, inbox_prefix

__all__ = ["DEFAULT_URL", "ConnectOptions", "ConnectionFailed", "connect"]

DEFAULT_URL = "nats://127.0.0.1:4222"

log = logging.getLogger("interlock.nats")

# field name -> environment variable
_ENV: dict[str, str] = {
    "servers": "INTERLOCK_URL",
    "creds_file": "INTERLOCK_CREDS",
    "nkey_seed_file": "INTERLOCK_NKEY",
    "user": "INTERLOCK_USER",
    "password": "INTERLOCK_PASSWORD",
    "token": "INTERLOCK_TOKEN",
    "tls_ca": "INTERLOCK_TLS_CA",
    "tls_cert": "INTERLOCK_TLS_CERT",
    "tls_key": "INTERLOCK_TLS_KEY",
    "prefix": "INTERLOCK_PREFIX",
    "inbox_prefix": "INTERLOCK_INBOX_PREFIX",
}
_AUTH_ERRORS = ("authorization violation", "authentication", "user authentication expired")

ErrorCallback = Callable[[Exception], Awaitable[None]]
Callback = Callable[[], Awaitable[None]]


@dataclass
class ConnectOptions:
    """Where and how to connect. Build it with ``resolve`` to honour the environment."""

    servers: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    name: str | None = None
    prefix: str = DEFAULT_PREFIX
    inbox_prefix: str | None = None
    """Reply subjects' prefix; with a creds file, ``_INBOX.<its user's public key>`` (the
    only inbox Interlock's credentials may subscribe to)."""
    connect_wait: float = 5.0
    """Seconds to keep trying the first connection before giving up."""

    def named(self, name: str) -> ConnectOptions:
        """These options with ``name`` for the connection (what the server shows for it,
        in ``/connz``), unless one is set already."""
        return self if self.name else dataclasses.replace(self, name=name)

    @classmethod
    def resolve(
        cls,
        server: str | list[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **cli: Any,
    ) -> ConnectOptions:
        """Options from arguments (command-line flags), else ``INTERLOCK_*``, else defaults.

        ``server`` (or ``$INTERLOCK_URL``) may list several URLs separated by commas. Keyword
        arguments are field names; ``None`` means "not given". ``env`` defaults to
        ``os.environ``.
        """
        environ = os.environ if env is None else env
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(cli) - known - {"servers"}
        if unknown:
            raise TypeError(f"unknown connection options: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        urls = server if server is not None else cli.get("servers")
        if urls is None:
            urls = environ.get(_ENV["servers"]) or None
        if urls is not None:
            values["servers"] = _split_urls(urls)
        for name, var in _ENV.items():
            if name == "servers":
                continue
            value = cli.get(name)
            if value is None:
                value = environ.get(var) or None
            if value is not None:
                values[name] = value
        for name in known - set(_ENV):
            if cli.get(name) is not None:
                values[name] = cli[name]
        return cls(**values)

    @property
    def subjects(self) -> Subjects:
        """The wire names for this installation's prefix."""
        return Subjects(self.prefix)

    def display_servers(self) -> str:
        """The server URLs with any password in them masked, for messages and logs."""
        return ", ".join(_redact(url) for url in self.servers)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context when a CA, certificate or key is configured, else ``None``."""
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert or self.tls_key:
            if not (self.tls_cert and self.tls_key):
                raise ConnectionFailed(
                    "TLS client authentication needs both a certificate and a key "
                    "(INTERLOCK_TLS_CERT and INTERLOCK_TLS_KEY)"
                )
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context


async def connect(
    opts: ConnectOptions,
    *,
    error_cb: ErrorCallback | None = None,
    disconnected_cb: Callback | None = None,
    reconnected_cb: Callback | None = None,
    closed_cb: Callback | None = None,
) -> Client:
    """Connect to NATS with ``opts``; once connected, reconnect forever.

    Raises:
        ConnectionFailed: no server could be reached within ``opts.connect_wait`` seconds,
            or the server refused the credentials; the message names the URL.
    """
    where = opts.display_servers()
    _check_auth_files(opts, where)
    try:
        tls = opts.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConnectionFailed(f"cannot connect to NATS at {where}: bad TLS files: {exc}") from exc
    connecting = _Connecting(where, error_cb, disconnected_cb, reconnected_cb)
    kwargs = _client_options(opts, connecting, tls, closed_cb)
    nc = await connecting.attempts(kwargs, opts.connect_wait)
    if nc is not None:
        if isinstance(nc, NatsClient):
            nc.js_api = _creds_js_api(opts.creds_file) or nc.js_api
            nc.objects_bucket = _creds_tag(opts.creds_file, "objects:")
        return nc
    raise connecting.failure(opts.connect_wait)


class _Connecting:
    """The first connection's attempts, and the callbacks of the connection they make.

    Until the first attempt succeeds, errors are kept as the reason to give (a refusal of
    the credentials or of the certificate ends the attempts at once); afterwards they go
    to the caller's callbacks, or to the log.
    """

    def __init__(
        self,
        where: str,
        error_cb: ErrorCallback | None,
        disconnected_cb: Callback | None,
        reconnected_cb: Callback | None,
    ) -> None:
        self.where = where
        self.connecting = True
        self.last_error: Exception | None = None
        self.refused = asyncio.Event()
        self.nc: Client | None = None
        self._error_cb = error_cb
        self._disconnected_cb = disconnected_cb
        self._reconnected_cb = reconnected_cb

    async def on_error(self, exc: Exception) -> None:
        if self.connecting:
            # A refusal is the reason, even when "connection reset" (the server closing
            # the connection after it) is reported just after.
            if not self.refused.is_set():
                self.last_error = exc
            # Retrying cannot fix refused credentials or an untrusted certificate.
            if _is_auth_error(exc) or isinstance(exc, ssl.SSLCertVerificationError):
                self.refused.set()
            return
        if self._error_cb is not None:
            await self._error_cb(exc)
        else:
            log.warning("NATS error: %s", exc)

    async def on_disconnected(self) -> None:
        # nats-py reports a deliberate close() as a disconnect too: that is no news.
        if self.connecting or self.nc is None or self.nc.is_closed:
            return
        log.warning("disconnected from NATS at %s; reconnecting", self.where)
        if self._disconnected_cb is not None:
            await self._disconnected_cb()

    async def on_reconnected(self) -> None:
        log.info("reconnected to NATS at %s", self.where)
        if self._reconnected_cb is not None:
            await self._reconnected_cb()

    async def attempts(self, kwargs: dict[str, Any], wait: float) -> Client | None:
        """Try to connect until connected (the client), refused or ``wait`` s are up (None)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            nc = self.nc = NatsClient()
            attempt = asyncio.ensure_future(nc.connect(**kwargs))
            gave_up = asyncio.ensure_future(self.refused.wait())
            try:
                await asyncio.wait(
                    {attempt, gave_up},
                    timeout=max(deadline - loop.time(), 0.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            except BaseException:
                attempt.cancel()
                raise
            finally:
                gave_up.cancel()
            if attempt.done() and attempt.exception() is None:
                self.connecting = False
                return nc
            failure = attempt.exception() if attempt.done() else None
            if isinstance(failure, Exception) and not self.refused.is_set():
                self.last_error = failure
            await _abandon(attempt, nc)
            # An attempt that ended early for another reason than a refusal (the server
            # closed the connection before its "Authorization Violation" could be read,
            # say) is tried again while there is time: the next one tells what is wrong.
            if self.refused.is_set() or failure is None or loop.time() >= deadline:
                return None
            await asyncio.sleep(min(0.2, max(deadline - loop.time(), 0.0)))

    def failure(self, wait: float) -> ConnectionFailed:
        """Why the first connection failed, naming the URL."""
        error = self.last_error
        reason = f": {error}" if error is not None else ""
        if error is not None and _is_auth_error(error):
            return ConnectionFailed(f"NATS at {self.where} refused the credentials{reason}")
        return ConnectionFailed(
            f"cannot connect to NATS at {self.where} (gave up after {wait:g} s){reason}"
        )


def _client_options(
    opts: ConnectOptions,
    connecting: _Connecting,
    tls: ssl.SSLContext | None,
    closed_cb: Callback | None,
) -> dict[str, Any]:
    """nats-py's ``connect`` arguments: reconnect forever once connected."""
    kwargs: dict[str, Any] = {
        "servers": opts.servers,
        "name": opts.name,
        "error_cb": connecting.on_error,
        "disconnected_cb": connecting.on_disconnected,
        "reconnected_cb": connecting.on_reconnected,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 1,
        "connect_timeout": max(1, min(int(opts.connect_wait), 5)),
        # Notice a dead server in ~1 minute rather than the default 4.
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "user": opts.user,
        "password": opts.password,
        "token": opts.token,
        "user_credentials": opts.creds_file,
        "nkeys_seed": opts.nkey_seed_file,
    }
    inbox = opts.inbox_prefix or _creds_inbox(opts.creds_file)
    if inbox is not None:
        kwargs["inbox_prefix"] = inbox
    if tls is not None:
        kwargs["tls"] = tls
    if closed_cb is not None:
        kwargs["closed_cb"] = closed_cb
    return kwargs


async def _abandon(attempt: asyncio.Future[None], nc: Client) -> None:
    """Give up one connection attempt and whatever it opened."""
    # A failed attempt: its error was kept as the reason already.
    await cancel_and_wait(attempt)
    # Closing: a connection already gone leaves nothing to undo.
    with contextlib.suppress(Exception):
        await nc.close()


def _check_auth_files(opts: ConnectOptions, where: str) -> None:
    for label, path in (("credentials file", opts.creds_file), ("nkey seed", opts.nkey_seed_file)):
        if path is not None and not os.path.isfile(path):
            raise ConnectionFailed(f"cannot connect to NATS at {where}: no {label} at {path!r}")
    if (opts.creds_file or opts.nkey_seed_file) and importlib.util.find_spec("nkeys") is None:
        raise ConnectionFailed(
            f"cannot connect to NATS at {where}: credentials and nkey seeds need the "
            "'nkeys' package (pip install 'nats-py[nkeys]')"
        )


def _creds_inbox(creds_file: str | None) -> str | None:
    if creds_file is None:
        return None
    # The roles' permissions (interlock.auth.roles) are not needed to name the inbox.
    from interlock.auth.jwt import creds_user

    try:
        return inbox_prefix(creds_user(creds_file))
    except (OSError, ValueError, KeyError):
        return None  # not one of ours: the default inbox prefix


def _creds_js_api(creds_file: str | None) -> str | None:
    """The JetStream API prefix a creds file's user JWT names (its ``js-api:`` tag: an
    agent's own account imports its API subjects there), else ``None``."""
    return _creds_tag(creds_file, "js-api:")


def _creds_tag(creds_file: str | None, name: str) -> str | None:
    """The value of the tag ``name`` (``js-api:``, ``objects:``) of a creds file's user
    JWT, else ``None``."""
    if creds_file is None:
        return None
    from interlock.auth.jwt import creds_tags

    try:
        tags = creds_tags(creds_file)
    except (OSError, ValueError, KeyError):
        return None
    for tag in tags:
        if tag.startswith(name):
            return tag.removeprefix(name)
    return None


def _is_auth_error(exc: Exception) -> bool:
    return any(marker in str(exc).lower() for marker in _AUTH_ERRORS)


def _split_urls(urls: str | list[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else urls
    servers = [u.strip() for u in items if u.strip()]
    if not servers:
        raise ValueError("no NATS server URL given")
    return servers


def _redact(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
