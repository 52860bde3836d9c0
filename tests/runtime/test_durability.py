"""Whether the server fsyncs every write, as the orchestrator finds it at start (and so
whether it group-commits its run-log appends), on real servers: one that syncs every
write, one with the default interval, an unreachable monitoring address, another
server's, and the explicit setting over all of them."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from interlock.cli.common import EXIT_USAGE, CliError
from interlock.cli.process_cmds import group_commit_setting
from interlock.runtime.durability import DEFAULT_GROUP_COMMIT, detect, group_commit_for
from interlock.runtime.embedded import EmbeddedNats
from support.runtime import cli_env, interlock_bg, run_cli


def varz(server: EmbeddedNats) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=10) as reply:
        return dict(json.load(reply))


@pytest.fixture(scope="module")
def syncing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A server that fsyncs every write, with its monitoring endpoints on."""
    server = EmbeddedNats(tmp_path_factory.mktemp("syncing"), args=("-m", "-1"), sync_always=True)
    with server:
        yield server


@pytest.fixture(scope="module")
def lazy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A server with the default sync_interval, with its monitoring endpoints on."""
    with EmbeddedNats(tmp_path_factory.mktemp("lazy"), args=("-m", "-1")) as server:
        yield server


@contextlib.asynccontextmanager
async def connected(server: EmbeddedNats) -> AsyncIterator[Client]:
    nc = await nats.connect(server.url, max_reconnect_attempts=0)
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
async def to_syncing(syncing: EmbeddedNats) -> AsyncIterator[Client]:
    async with connected(syncing) as nc:
        yield nc


@pytest.fixture
async def to_lazy(lazy: EmbeddedNats) -> AsyncIterator[Client]:
    async with connected(lazy) as nc:
        yield nc


def serve_says(server: EmbeddedNats, pattern: str, *flags: str, **env: str) -> None:
    """``interlock serve FLAGS`` on ``server`` (its monitoring address given, the
    variables ``env`` set, no other INTERLOCK_GROUP_COMMIT) logs ``pattern``."""
    environment = cli_env(server.url, "tserve", INTERLOCK_NATS_MONITOR=str(server.monitor_url))
    environment.pop("INTERLOCK_GROUP_COMMIT", None)
    environment.update(env)
    serve = interlock_bg("serve", "--metrics-port", "0", *flags, env=environment)
    try:
        serve.wait_for(pattern)
    finally:
        serve.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_server_that_fsyncs_every_write_turns_group_commit_on(
    syncing: EmbeddedNats, to_syncing: Client
) -> None:
    assert varz(syncing)["jetstream"]["config"]["sync_always"] is True
    found = await detect(to_syncing, syncing.monitor_url)
    assert found.fsync is True
    assert await group_commit_for(to_syncing, None, syncing.monitor_url) == DEFAULT_GROUP_COMMIT


async def test_a_server_with_the_default_interval_leaves_it_off(
    lazy: EmbeddedNats, to_lazy: Client
) -> None:
    assert varz(lazy)["jetstream"]["config"].get("sync_always") is not True
    found = await detect(to_lazy, lazy.monitor_url)
    assert found.fsync is False
    assert await group_commit_for(to_lazy, None, lazy.monitor_url) == 0


async def test_nothing_answering_at_the_address_leaves_it_off(to_syncing: Client) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    found = await detect(to_syncing, url)
    assert found.fsync is None
    assert url in found.source
    assert await group_commit_for(to_syncing, None, url) == 0


async def test_another_servers_monitoring_endpoint_is_not_believed(
    lazy: EmbeddedNats, syncing: EmbeddedNats, to_lazy: Client
) -> None:
    # Connected to the lazy server, pointed at the syncing one's endpoint.
    found = await detect(to_lazy, syncing.monitor_url)
    assert found.fsync is None
    assert "another server" in found.source
    assert await group_commit_for(to_lazy, None, syncing.monitor_url) == 0


async def test_off_does_not_look(syncing: EmbeddedNats, to_syncing: Client) -> None:
    assert (await detect(to_syncing, "off")).fsync is None
    assert await group_commit_for(to_syncing, None, "off") == 0


async def test_an_explicit_setting_wins_over_what_the_server_says(
    syncing: EmbeddedNats, lazy: EmbeddedNats, to_syncing: Client, to_lazy: Client
) -> None:
    assert await group_commit_for(to_syncing, 0, syncing.monitor_url) == 0
    assert await group_commit_for(to_lazy, 8, lazy.monitor_url) == 8


def test_sync_always_keeps_the_configuration_file_it_wraps(tmp_path: Path) -> None:
    given = tmp_path / "given.conf"
    given.write_text("max_payload: 65536\n")
    with EmbeddedNats(
        tmp_path / "store", args=("-c", str(given), "-m", "-1"), sync_always=True
    ) as server:
        seen = varz(server)
    assert seen["jetstream"]["config"]["sync_always"] is True
    assert seen["max_payload"] == 65536


def test_serve_group_commits_on_a_server_that_fsyncs_every_write(syncing: EmbeddedNats) -> None:
    serve_says(syncing, f"group-committed, batches of {DEFAULT_GROUP_COMMIT}")


def test_serve_group_commit_zero_turns_it_off_on_that_server(syncing: EmbeddedNats) -> None:
    serve_says(syncing, "group commit off [(]set explicitly[)]", "--group-commit", "0")


@pytest.mark.parametrize(
    ("flag", "env", "setting"),
    [
        (None, None, None),  # neither: as the server's syncing says
        (None, "  ", None),  # blank is not given
        (None, "8", 8),  # the variable
        (None, " 0 ", 0),
        (0, "8", 0),  # the flag over the variable
        (8, "0", 8),
        (4, "many", 4),  # a variable the flag overrides is not read
    ],
)
def test_group_commit_is_the_flag_else_the_variable_else_found(
    monkeypatch: pytest.MonkeyPatch, flag: int | None, env: str | None, setting: int | None
) -> None:
    monkeypatch.delenv("INTERLOCK_GROUP_COMMIT", raising=False)
    if env is not None:
        monkeypatch.setenv("INTERLOCK_GROUP_COMMIT", env)
    assert group_commit_setting(flag) == setting


@pytest.mark.parametrize(
    ("flag", "env", "error"),
    [
        (None, "many", "INTERLOCK_GROUP_COMMIT must be a whole number, got 'many'"),
        (None, "1", "takes 0 (off) or a batch of at least 2, got 1"),
        (-2, None, "takes 0 (off) or a batch of at least 2, got -2"),
        (1, "16", "takes 0 (off) or a batch of at least 2, got 1"),
    ],
)
def test_a_bad_group_commit_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, flag: int | None, env: str | None, error: str
) -> None:
    monkeypatch.delenv("INTERLOCK_GROUP_COMMIT", raising=False)
    if env is not None:
        monkeypatch.setenv("INTERLOCK_GROUP_COMMIT", env)
    with pytest.raises(CliError) as raised:
        group_commit_setting(flag)
    assert error in str(raised.value)
    assert raised.value.code == EXIT_USAGE


def test_serve_takes_group_commit_from_the_environment(syncing: EmbeddedNats) -> None:
    serve_says(syncing, "group commit 4 [(]set explicitly[)]", INTERLOCK_GROUP_COMMIT="4")


def test_serve_refuses_a_group_commit_variable_that_is_no_number(syncing: EmbeddedNats) -> None:
    env = cli_env(syncing.url, "tserve", INTERLOCK_GROUP_COMMIT="lots")
    done = run_cli("serve", "--metrics-port", "0", env=env)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "INTERLOCK_GROUP_COMMIT must be a whole number, got 'lots'" in done.stderr


def test_dev_fsync_starts_a_server_that_syncs_every_write(tmp_path: Path) -> None:
    dev = interlock_bg(
        "dev",
        "--port",
        "0",
        "--no-http",
        "--no-agents",
        "--fsync",
        "--data-dir",
        str(tmp_path),
        env=cli_env("", "il"),
        cwd=tmp_path,
    )
    try:
        dev.wait_for("every write fsynced")
        dev.wait_for("orchestrator running")
        config = (tmp_path / "interlock-sync.conf").read_text()
    finally:
        assert dev.stop() == 0, dev.output
    assert "sync_interval: always" in config
    assert "include" in config  # around the server configuration with authentication


@pytest.fixture(scope="module")
def unmonitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A server without a monitoring port, as most are run."""
    with EmbeddedNats(tmp_path_factory.mktemp("unmonitored")) as server:
        yield server


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ((), None),  # nothing said of it: off is right for most servers
        (("--log-level", "debug"), "DEBUG interlock.durability: group commit off: could not tell"),
        (("--nats-monitor", "CLOSED"), "WARNING interlock.durability: group commit off: could not"),
    ],
)
def test_serve_without_a_monitoring_port_says_so_only_when_asked(
    unmonitored: EmbeddedNats, flags: tuple[str, ...], said: str | None
) -> None:
    """Every start on a server without a monitoring port logged an INFO line about it; now
    the start line says group commit is off, the reason is a debug note, and only a
    monitoring address the operator gave and that cannot be read is a warning."""
    env = cli_env(unmonitored.url, "tquiet")
    for name in ("INTERLOCK_NATS_MONITOR", "INTERLOCK_GROUP_COMMIT"):
        env.pop(name, None)
    given = [f"http://127.0.0.1:{closed_port()}" if f == "CLOSED" else f for f in flags]
    serve = interlock_bg("serve", "--metrics-port", "0", *given, env=env)
    try:
        serve.wait_for(r"orchestrator started \(.*, group commit off\)")
        serve.wait_for("metrics and health on")
    finally:
        serve.stop()
    about = [line for line in serve.lines if "interlock.durability" in line]
    if said is None:
        assert about == [], about
        return
    [line] = about
    assert said in line
    assert "give its monitoring address (INTERLOCK_NATS_MONITOR) or --group-commit 16" in line
