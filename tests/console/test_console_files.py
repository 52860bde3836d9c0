"""The console's files as the gateway serves them (no browser): the page, its modules and
vendored libraries, its settings, and the headers that keep other origins out."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from interlock.console import STATIC, _Files
from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack


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


@pytest.mark.asyncio
async def test_the_page_asks_for_files_the_browser_may_keep(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects) as gs, httpx.AsyncClient(base_url=gs.url) as http:
        page = await http.get("/ui/")
        assert page.headers["cache-control"] == "no-cache"
        asked = re.findall(r'(?:href|src)="(v/[0-9a-f]{16}/[^"]+)"', page.text)
        assert "console.css" in " ".join(asked)
        version = asked[0].split("/")[1]
        assert all(a.startswith(f"v/{version}/") for a in asked)
        # Every module the page or another module imports (relative addresses) is under
        # the same version, kept for good, with the security headers.
        for path in sorted(STATIC.rglob("*.js")):
            rel = path.relative_to(STATIC).as_posix()
            r = await http.get(f"/ui/v/{version}/{rel}")
            assert r.status_code == 200, rel
            assert r.content == path.read_bytes(), rel
            assert "immutable" in r.headers["cache-control"], rel
            assert "script-src 'self'" in r.headers["content-security-policy"], rel
        # Revalidating the page costs no body while the files have not changed.
        again = await http.get("/ui/", headers={"if-none-match": page.headers["etag"]})
        assert again.status_code == 304
        # Another version's address (a page from before the files changed) gets today's
        # files, not to be kept.
        old = await http.get("/ui/v/0000000000000000/js/main.js")
        assert old.status_code == 200
        assert old.headers["cache-control"] == "no-cache"
        assert (await http.get(f"/ui/v/{version}/nope.js")).status_code == 404
        # Nothing outside the console's files (its package's own module sits above them).
        assert (await http.get(f"/ui/v/{version}/%2e%2e/__init__.py")).status_code == 404


def test_a_changed_file_gets_a_new_version(tmp_path: Path) -> None:
    (tmp_path / "js").mkdir()
    (tmp_path / "index.html").write_text('<script type="module" src="js/main.js"></script>')
    (tmp_path / "js" / "main.js").write_text("export const a = 1;")
    files = _Files(tmp_path)
    version, page = files.current()
    assert page == f'<script type="module" src="v/{version}/js/main.js"></script>'.encode()
    assert files.current()[0] == version
    (tmp_path / "js" / "main.js").write_text("export const a = 22;")
    assert files.current()[0] != version


def test_vendored_libraries_carry_their_licences() -> None:
    for lib in sorted((STATIC / "vendor").iterdir()):
        assert (lib / "LICENSE").is_file(), lib
        assert (lib / "README.md").is_file(), lib
