"""The web console: pages over the gateway's REST API, served at ``/ui/``.

The pages are static files (HTML, CSS and JavaScript modules, no build step) that read
everything through the REST API and its live log stream, with the caller's bearer token,
so the console can show nothing that a program could not get and does nothing that the
caller's role may not do. The server side only serves the files and the console's own
settings (``/ui/config.json``: where trace links point). See docs/console.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec
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
    """The static files with the console's security headers on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                # Revalidate each time: a new gateway version serves new files at once.
                headers.append((b"cache-control", b"no-cache"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def routes(config: ConsoleConfig) -> list[BaseRoute]:
    """``/ui`` (a redirect), ``/ui/config.json`` and the files under ``/ui/``."""
    settings = msgspec.json.encode({"trace_url": config.trace_url})

    async def to_console(request: Request) -> Response:
        return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), 308)

    async def config_json(request: Request) -> Response:
        return Response(settings, media_type="application/json", headers=SECURITY_HEADERS)

    return [
        Route("/ui", to_console, methods=["GET", "HEAD"]),
        Route("/ui/config.json", config_json, methods=["GET", "HEAD"]),
        Mount("/ui", app=_Secured(StaticFiles(directory=STATIC, html=True)), name="console"),
    ]
