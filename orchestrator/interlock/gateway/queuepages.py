"""``GET /queues`` a page at a time: at most ``limit`` lines (500 by default and at most),
in limit then key order, from where ``after`` says; the body is the page's lines (an
array, as before pages), and a ``Link: <...>; rel="next"`` header names the next page
(the same query, ``after`` the page token of its first line's place), absent on the last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from interlock.client.queues import MAX_TOKEN, TOKEN
from interlock.gateway.problems import Problem, int_param

if TYPE_CHECKING:
    from interlock.client import Client

MAX_LINES = 500
"""The most lines of one page (and how many without ``limit``)."""
LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LINES}
"""``limit``'s schema (OpenAPI)."""
AFTER = {"type": "string", "pattern": TOKEN.pattern, "maxLength": MAX_TOKEN}
"""``after``'s schema (OpenAPI)."""
LINK = {
    "headers": {
        "Link": {
            "description": '<...?after=TOKEN&limit=N>; rel="next": the next page (none: the last)',
            "schema": {"type": "string"},
        }
    }
}
"""What a page's answer says besides its lines (OpenAPI)."""


async def queue_listing(request: Request, api: Client) -> Response:
    """The page of ``GET /queues`` the request asks for (see the module)."""
    by = request.query_params
    limit = int_param(request, "limit", MAX_LINES, 1, MAX_LINES)
    after = by.get("after")
    try:
        page, more = await api.queue_page(
            by.get("workflow") or None,
            capability=by.get("capability") or None,
            limit=limit,
            after=after,
        )
    except ValueError as exc:
        raise Problem(400, "bad-parameter", f"after: {exc}") from exc
    response = Response(msgspec.json.encode(page), media_type="application/json")
    if more is not None:
        url = request.url.include_query_params(after=more, limit=limit)
        response.headers["Link"] = f'<{url.path}?{url.query}>; rel="next"'
    return response
