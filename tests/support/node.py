"""Node.js for the wire-contract tests: found on PATH, packages installed from a lockfile."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NPM_TIMEOUT_S = 240


def node_or_skip() -> tuple[str, str]:
    """Paths of ``node`` and ``npm``; the test is skipped (saying why) without them."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            "node and npm are not installed: the Node.js wire-contract tests need them "
            "(.ci/run installs them; on Debian: apt-get install nodejs npm)"
        )
    return node, npm


def npm_install(npm: str, folder: Path) -> None:
    """Install ``folder``'s dependencies exactly as its package-lock.json says (no install
    scripts run); quick when they already are."""
    marker = folder / "node_modules" / ".package-lock.json"
    lock = folder / "package-lock.json"
    if marker.is_file() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"npm ci in {folder} failed:\n{done.stdout}\n{done.stderr}")
