"""The ``http-fetch`` agent: capability ``http.fetch`` sends one HTTP(S) request.

Only ``http`` and ``https`` URLs are fetched. ``INTERLOCK_FETCH_ALLOW_HOSTS`` (comma-
separated host names; empty or unset allows any) restricts the hosts, redirects included.
An HTTP error status is an answer (the workflow decides what it means); a refused URL is
an ``agent_error``, an unreachable host a retryable one.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import msgspec

from interlock.sdk import AgentError, RetryableError, TaskContext, Worker
from interlock_agents import capability_schemas

ALLOW_HOSTS_ENV = "INTERLOCK_FETCH_ALLOW_HOSTS"
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


def allowed_hosts() -> frozenset[str]:
    """Hosts from ``$INTERLOCK_FETCH_ALLOW_HOSTS``; empty means any host."""
    raw = os.environ.get(ALLOW_HOSTS_ENV, "")
    return frozenset(h.strip().lower() for h in raw.split(",") if h.strip())


def check_url(url: str, allow: frozenset[str]) -> None:
    """Raise AgentError unless ``url`` is http(s) with a host on the allow-list."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise AgentError(f"only http and https URLs are fetched, not {url!r}")
    host = (parts.hostname or "").lower()
    if not host:
        raise AgentError(f"URL {url!r} has no host")
    if allow and host not in allow:
        raise AgentError(
            f"host {host!r} is not allowed (${ALLOW_HOSTS_ENV}: {', '.join(sorted(allow))})"
        )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to URLs the request itself could have named."""

    def __init__(self, allow: frozenset[str]) -> None:
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


def fetch(inp: FetchInput, timeout: float, allow: frozenset[str]) -> FetchOutput:
    """The blocking request (run in a thread)."""
    check_url(inp.url, allow)
    data = inp.body.encode("utf-8") if inp.body is not None else None
    # The scheme was checked just above: only http and https get here.
    request = urllib.request.Request(  # noqa: S310
        inp.url, data=data, headers=dict(inp.headers), method=inp.method.upper()
    )
    opener = urllib.request.build_opener(_CheckedRedirects(allow))
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
    return await asyncio.to_thread(fetch, inp, timeout, allowed_hosts())
