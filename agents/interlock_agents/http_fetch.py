"""The ``http-fetch`` agent: capability ``http.fetch`` sends one HTTP(S) request.

Only ``http`` and ``https`` URLs are fetched. ``INTERLOCK_FETCH_ALLOW_HOSTS`` (comma-
separated host names; empty or unset allows any) restricts the hosts, redirects included.

No address that is not global is reached (loopback, private, link-local, the cloud metadata
address 169.254.169.254, unique-local, shared, reserved, multicast; an IPv6 address that
embeds one of them too) unless ``INTERLOCK_FETCH_ALLOW_PRIVATE`` names the host as the URL
writes it (``localhost``, ``10.0.0.7``) or a network holding the address (``10.0.0.0/8``).
A URL's data comes from whoever published the event a workflow read it from, so without
this any publisher could make the agent read the services of its own machine and network.
Every address a name resolves to is checked, and the connection goes to a checked address
(a name that resolves again to another cannot slip past), for every redirect too.

An HTTP error status is an answer (the workflow decides what it means); a refused URL is
an ``agent_error``, an unreachable host a retryable one.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import msgspec

from interlock.sdk import AgentError, RetryableError, TaskContext, Worker
from interlock_agents import capability_schemas

ALLOW_HOSTS_ENV = "INTERLOCK_FETCH_ALLOW_HOSTS"
ALLOW_PRIVATE_ENV = "INTERLOCK_FETCH_ALLOW_PRIVATE"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MIB = 1024 * 1024

worker = Worker("http-fetch", concurrency=16)


class FetchInput(msgspec.Struct, kw_only=True, frozen=True):
    url: str
    method: str = "GET"
    headers: dict[str, str] = {}
    body: str | None = None
    timeout_s: float = 10.0
    max_bytes: int = MIB


class FetchOutput(msgspec.Struct, kw_only=True, frozen=True):
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool


def _names(raw: str) -> frozenset[str]:
    return frozenset(h.strip().lower() for h in raw.split(",") if h.strip())


@dataclass(frozen=True)
class Policy:
    """What may be fetched: ``hosts`` (empty: any), and which hosts (by name) or networks
    may be reached at an address that is not global."""

    hosts: frozenset[str] = frozenset()
    private_hosts: frozenset[str] = frozenset()
    private_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_env(cls) -> Policy:
        """From ``$INTERLOCK_FETCH_ALLOW_HOSTS`` and ``$INTERLOCK_FETCH_ALLOW_PRIVATE``."""
        private = _names(os.environ.get(ALLOW_PRIVATE_ENV, ""))
        networks = []
        for entry in private:
            if "/" in entry:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError as exc:
                    raise AgentError(f"${ALLOW_PRIVATE_ENV}: {entry!r} is no network") from exc
        return cls(
            hosts=_names(os.environ.get(ALLOW_HOSTS_ENV, "")),
            private_hosts=frozenset(e for e in private if "/" not in e),
            private_networks=tuple(networks),
        )

    def check_address(self, host: str, address: str) -> None:
        """Raise AgentError if ``host`` may not be reached at ``address``."""
        if host in self.private_hosts:
            return
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if _is_public(ip) or any(ip in net for net in self.private_networks):
            return
        raise AgentError(
            f"host {host!r} is at {ip}, which is not a public address; to fetch it, name the "
            f"host or its network in ${ALLOW_PRIVATE_ENV}"
        )

    def resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """Every address of ``host`` (each checked), as ``getaddrinfo`` gives them."""
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise RetryableError(f"cannot resolve {host!r}: {exc.strerror or exc}") from exc
        for *_, sockaddr in found:
            self.check_address(host, str(sockaddr[0]))
        return found


def _is_public(ip: IPAddress) -> bool:
    """A global unicast address, and so is any IPv4 address an IPv6 one carries."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not _is_public(embedded):
            return False
    return ip.is_global and not ip.is_multicast


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def check_url(url: str, policy: Policy) -> None:
    """Raise AgentError unless ``url`` is http(s) with a host ``policy`` allows (its
    addresses are checked when it is connected to)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise AgentError(f"only http and https URLs are fetched, not {url!r}")
    host = (parts.hostname or "").lower()
    if not host:
        raise AgentError(f"URL {url!r} has no host")
    allow = policy.hosts
    if allow and host not in allow:
        raise AgentError(
            f"host {host!r} is not allowed (${ALLOW_HOSTS_ENV}: {', '.join(sorted(allow))})"
        )


def _connector(policy: Policy) -> Any:
    """``socket.create_connection`` that connects only to checked addresses of the host."""

    def connect(
        address: tuple[str, int], timeout: Any = None, source_address: Any = None
    ) -> socket.socket:
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in policy.resolve(host.lower(), port):
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            return sock
        raise error or OSError(f"{host} has no address")

    return connect


class _CheckedHTTP(urllib.request.HTTPHandler):
    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self._policy = policy

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPConnection, self._policy), req)


class _CheckedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self._policy = policy

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPSConnection, self._policy), req)


def _connection(base: type[http.client.HTTPConnection], policy: Policy) -> Any:
    """``base`` whose sockets come from the checking connector (TLS wraps it as usual)."""

    def build(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        conn = base(*args, **kwargs)
        # HTTPConnection opens its socket through this attribute (TLS then wraps it).
        conn._create_connection = _connector(policy)  # type: ignore[attr-defined]
        return conn

    return build


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to URLs the request itself could have named."""

    def __init__(self, allow: Policy) -> None:
        self._allow = allow

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        check_url(newurl, self._allow)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(inp: FetchInput, timeout: float, allow: Policy) -> FetchOutput:
    """The blocking request (run in a thread)."""
    check_url(inp.url, allow)
    data = inp.body.encode("utf-8") if inp.body is not None else None
    # The scheme was checked just above: only http and https get here.
    request = urllib.request.Request(  # noqa: S310
        inp.url, data=data, headers=dict(inp.headers), method=inp.method.upper()
    )
    # No proxies from the environment: a proxy would resolve and connect where the
    # addresses cannot be checked.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        _CheckedHTTP(allow),
        _CheckedHTTPS(allow),
        _CheckedRedirects(allow),
    )
    try:
        response = opener.open(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        response = err  # an error status is still a response
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, AgentError):
            raise reason from None
        raise RetryableError(f"fetching {inp.url} failed: {reason}") from exc
    with response:
        raw = response.read(inp.max_bytes + 1)
        charset = response.headers.get_content_charset() or "utf-8"
        headers: dict[str, str] = {}
        for name, value in response.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = response.status
    truncated = len(raw) > inp.max_bytes
    try:
        body = raw[: inp.max_bytes].decode(charset, errors="replace")
    except LookupError:  # an unknown charset name
        body = raw[: inp.max_bytes].decode("utf-8", errors="replace")
    return FetchOutput(status=status or 0, headers=headers, body=body, truncated=truncated)


@worker.capability("http.fetch", **capability_schemas("http-fetch", "http.fetch"))
async def http_fetch(inp: FetchInput, ctx: TaskContext) -> FetchOutput:
    """Send the request; answer with status, headers and (truncated) text body."""
    timeout = inp.timeout_s
    remaining = ctx.remaining()
    if remaining is not None:
        timeout = max(min(timeout, remaining), 0.1)
    return await asyncio.to_thread(fetch, inp, timeout, Policy.from_env())
