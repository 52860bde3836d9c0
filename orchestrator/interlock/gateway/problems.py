"""Errors as RFC 9457 problem details (``application/problem+json``)."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from interlock.core.vocabulary import InterlockError

PROBLEM_TYPE = "application/problem+json"
_BASE = "https://interlock.io/problems/"


class Problem(InterlockError):
    """An HTTP error answered with a problem body.

    Args:
        status: the HTTP status.
        slug: a short machine-readable name; the problem ``type`` is a URI built from it.
        detail: what is wrong, for a person, naming the offending part.
        headers: extra response headers (``WWW-Authenticate`` for a 401).
        extra: more members of the problem object (``errors``, ``index``...).
    """

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.title = title or slug.replace("-", " ").capitalize()
        self.headers = headers or {}
        self.extra = extra

    def body(self, instance: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": _BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            out["instance"] = instance
        out.update(self.extra)
        return out

    def response(self, instance: str | None = None) -> Response:
        return Response(
            msgspec.json.encode(self.body(instance)),
            status_code=self.status,
            media_type=PROBLEM_TYPE,
            headers=self.headers,
        )


async def problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return exc.response(request.url.path)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as problem bodies."""
    status = int(getattr(exc, "status_code", 500))
    slug = {404: "not-found", 405: "method-not-allowed"}.get(status, "http-error")
    detail = str(getattr(exc, "detail", "") or slug)
    headers = dict(getattr(exc, "headers", None) or {})
    if status == 404:
        detail = f"no such resource: {request.url.path} (see /openapi.json)"
    elif status == 405:
        # Starlette joins a route's methods from a set: in its hash order, which differs
        # from one process to the next. Said (and sent) in one order.
        methods = sorted({m.strip() for m in headers.get("Allow", "").split(",")} - {""})
        if methods:
            headers["Allow"] = ", ".join(methods)
        detail = _not_allowed(request.method, request.url.path, ", ".join(methods))
    return Problem(status, slug, detail, headers=headers).response(request.url.path)


def _not_allowed(method: str, path: str, allow: str) -> str:
    """What a 405 says: the methods the path takes, and for a workflow's verb sent without
    its namespace (which the CLI fills in), the path it wants."""
    detail = f"{method} is not allowed on {path}: it takes {allow or 'other methods'}"
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "workflows" and parts[2] in ("pause", "resume", "migrate"):
        detail += (
            f" (a workflow's {parts[2]} names its namespace: "
            f"POST /workflows/default/{parts[1]}/{parts[2]})"
        )
    return detail + "; see /openapi.json"


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The whole-number query parameter ``name`` (``default`` when absent), from ``low``
    to ``high``; a 400 problem otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Problem(400, "bad-parameter", f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise Problem(400, "bad-parameter", f"{name} must be from {low} to {high}, got {value}")
    return value


def as_problem(exc: BaseException) -> Problem | None:
    """The problem :mod:`interlock.client.error_table` answers ``exc`` with (None: none)."""
    from interlock.client.error_table import meaning

    found = meaning(exc)
    if found is None or found.status is None or found.problem is None:
        return None
    return Problem(found.status, found.problem, found.detail(exc))


async def error_table_handler(request: Request, exc: Exception) -> Response:
    """An error of the table raised outside the REST routes' guard (the log key damaged or
    unreadable: run logs can be neither read nor written, 503 saying why and how to restore
    it; the orchestrator stops at start on the same)."""
    problem = as_problem(exc)
    if problem is None:
        raise exc
    return problem.response(request.url.path)
