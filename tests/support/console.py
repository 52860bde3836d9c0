"""A real stack with the gateway (and so the console) on a socket, runs in every status,
and headless Chromium driven by Playwright.

The browser is Debian's ``chromium`` (``apt-get install chromium``; ``.ci/run`` installs it),
or the one ``INTERLOCK_CHROMIUM`` names; Playwright downloads no browser of its own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("INTERLOCK_ARTIFACTS", REPO / ".artifacts")) / "console"
"""Where the tests save their screenshots (``INTERLOCK_ARTIFACTS`` moves them)."""
DOCS_SHOTS = REPO / "docs" / "console"
"""``INTERLOCK_DOCS_SCREENSHOTS=1`` also writes the pages' screenshots here for the docs."""


def chromium() -> str:
    """The Chromium executable, or a skip saying how to install one."""
    named = os.environ.get("INTERLOCK_CHROMIUM")
    for candidate in (named, "chromium", "chromium-browser", "google-chrome"):
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    pytest.skip(
        "no Chromium for the console's browser tests: install Debian's package "
        "(sudo apt-get install chromium) or set INTERLOCK_CHROMIUM to a Chrome/Chromium binary"
    )


def playwright_or_skip() -> None:
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
