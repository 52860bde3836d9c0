"""The web console: pages over the gateway's REST API, served at ``/ui/``.

The pages are static files (HTML, CSS and JavaScript modules, no build step) that read
everything through the REST API and its live log stream, with the caller's bearer token,
so the console can show nothing that a program could not get and does nothing that the
caller's role may not do. The server side only serves the files and the console's own
settings (``/ui/config.json``: where trace links point). See docs/console.md.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec
from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["STATIC", "ConsoleConfig", "routes"]

STATIC = Path(__file__).with_name("static")

# Scripts, styles and data only from the gateway itself: no inline script can run, and
# no page may frame the console (clickjacking of its cancel and redrive buttons).
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
        "form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


@dataclass(frozen=True)
class ConsoleConfig:
    """The console's settings.

    Args:
        trace_url: a URL template for a run's trace, with ``{trace_id}`` and ``{run_id}``
            (for example a Grafana Explore link to Tempo); None: no trace link.
    """

    trace_url: str | None = None

    @classmethod
    def from_environment(cls) -> ConsoleConfig:
        """``INTERLOCK_TRACE_URL`` names the trace URL template."""
        return cls(trace_url=os.environ.get("INTERLOCK_TRACE_URL") or None)


class _Secured:
    """The static files with the console's security headers on every answer, and
    ``cache_control``."""

    def __init__(self, app: ASGIApp, cache_control: bytes = b"no-cache") -> None:
        self.app = app
        self.cache_control = cache_control

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                headers.append((b"cache-control", self.cache_control))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


_REFERENCE = re.compile(rb'(href|src)="((?:js|vendor)/[^"]*|console\.css)"')
"""The page's references to its own files (scripts, module preloads, the style sheet)."""


class _Files:
    """The version of the console's files: a digest of their contents, read again when a
    file changed (its size or time), so an edited file gets a new version at once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self.version = ""
        self.page = b""

    def current(self) -> tuple[str, bytes]:
        """The version and the page (``index.html``) that asks for the files of it."""
        files = sorted(p for p in self.root.rglob("*") if p.is_file())
        stamp = tuple(
            (p.relative_to(self.root).as_posix(), (st := p.stat()).st_size, st.st_mtime_ns)
            for p in files
        )
        if stamp != self._stamp:
            digest = hashlib.sha256()
            for p in files:
                digest.update(p.relative_to(self.root).as_posix().encode() + b"\0")
                digest.update(p.read_bytes())
            self.version = digest.hexdigest()[:16]
            prefix = f"v/{self.version}/".encode()
            page = (self.root / "index.html").read_bytes()
            self.page = _REFERENCE.sub(lambda m: m[1] + b'="' + prefix + m[2] + b'"', page)
            self._stamp = stamp
        return self.version, self.page


def routes(config: ConsoleConfig) -> list[BaseRoute]:
    """``/ui`` (a redirect), ``/ui/config.json`` and the files under ``/ui/``.

    The page (``/ui/``) asks for its scripts and style sheet under ``/ui/v/<version>/``,
    the version a digest of the files: those answers may be kept by the browser for good
    (a new version has new addresses), so a page opened again loads no module over the
    network; the page itself is revalidated each time. The files are also served at their
    plain addresses (revalidated each time).
    """
    settings = msgspec.json.encode({"trace_url": config.trace_url})
    files = _Files(STATIC)
    plain = _Secured(StaticFiles(directory=STATIC, html=True))
    kept = _Secured(StaticFiles(directory=STATIC), b"public, max-age=31536000, immutable")

    async def to_console(request: Request) -> Response:
        return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), 308)

    async def config_json(request: Request) -> Response:
        return Response(settings, media_type="application/json", headers=SECURITY_HEADERS)

    async def page(request: Request) -> Response:
        version, body = files.current()
        etag = f'"{version}"'
        headers = {**SECURITY_HEADERS, "cache-control": "no-cache", "etag": etag}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="text/html", headers=headers)

    async def versioned(scope: Scope, receive: Receive, send: Send) -> None:
        # /v/<version>/<file>: the files of this version kept for good; another version's
        # address (a page from before the files changed) gets today's files, revalidated.
        root = scope.get("root_path", "")
        version = get_route_path(scope).removeprefix("/").partition("/")[0]
        app = kept if version == files.version else plain
        await app({**scope, "root_path": f"{root}/{version}"}, receive, send)

    return [
        Route("/ui", to_console, methods=["GET", "HEAD"]),
        Route("/ui/", page, methods=["GET", "HEAD"]),
        Route("/ui/index.html", page, methods=["GET", "HEAD"]),
        Route("/ui/config.json", config_json, methods=["GET", "HEAD"]),
        Mount("/ui/v", app=versioned),
        Mount("/ui", app=plain, name="console"),
    ]
