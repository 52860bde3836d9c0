"""Each process's NATS connection is named by its role, as the server's /connz shows it."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interlock import Client
from interlock.runtime.embedded import EmbeddedNats
from support.runtime import cli_installation, run_cli


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path_factory.mktemp("names"), args=("-m", "-1"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def names(server: EmbeddedNats, state: str = "open") -> list[str]:
    url = f"{server.monitor_url}/connz?state={state}&limit=1024"
    with urllib.request.urlopen(url, timeout=10) as answer:
        found: list[dict[str, Any]] = json.load(answer)["connections"] or []
    return sorted(str(c.get("name", "")) for c in found)


async def test_every_process_names_its_connection_by_its_role(
    monitored: EmbeddedNats, tmp_path: Path
) -> None:
    with cli_installation(monitored.url, tmp_path, {}) as installation:
        assert names(monitored) == ["interlock-agent:echo,review", "interlock-orchestrator"]
        listed = run_cli("workflows", env=installation.env)
        assert listed.returncode == 0, listed.stderr
        assert "interlock-cli" in names(monitored, "closed")
        async with await Client.connect(monitored.url, prefix=installation.prefix):
            assert "interlock-client" in names(monitored)
