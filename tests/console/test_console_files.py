"""The console's files as the gateway serves them (no browser): the page, its modules and
vendored libraries, its settings, and the headers that keep other origins out."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

from gw_support import gateway_stack

from interlock.console import STATIC
from interlock.transport.subjects import Subjects


@pytest.mark.asyncio
async def test_served_at_ui_with_its_security_headers(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects) as gs, httpx.AsyncClient(base_url=gs.url) as http:
        r = await http.get("/ui")
        assert r.status_code == 308
        assert r.headers["location"].endswith("/ui/")
        page = await http.get("/ui/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        # Every file the page or its modules import is served, with a JavaScript type.
        for path in sorted(STATIC.rglob("*.js")):
            rel = path.relative_to(STATIC).as_posix()
            r = await http.get(f"/ui/{rel}")
            assert r.status_code == 200, rel
            assert "javascript" in r.headers["content-type"], rel
        assert (await http.get("/ui/config.json")).json() == {"trace_url": None}
        # The files are public (they hold no data); the API behind them is not.
        assert (await http.get("/runs")).status_code == 401
        assert (await http.get("/ui/../runs")).status_code == 401
        assert (await http.get("/ui/nope.js")).status_code == 404


def test_vendored_libraries_carry_their_licences() -> None:
    for lib in sorted((STATIC / "vendor").iterdir()):
        assert (lib / "LICENSE").is_file(), lib
        assert (lib / "README.md").is_file(), lib
