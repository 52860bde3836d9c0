"""The embedded nats-server: start, readiness, persistence across restarts, clear failures."""

from __future__ import annotations

import os
from pathlib import Path

import nats
import pytest

from interlock.runtime.embedded import (
    MIN_SERVER_VERSION,
    EmbeddedNats,
    nats_server_binary,
    nats_server_version,
)
from interlock.transport.errors import NatsServerFailed, NatsServerNotFound


def test_the_packaged_binary_is_found_and_recent() -> None:
    binary = nats_server_binary()
    assert os.access(binary, os.X_OK)
    assert nats_server_version(binary) >= MIN_SERVER_VERSION


def test_override_that_is_not_executable_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("INTERLOCK_NATS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(NatsServerNotFound, match="INTERLOCK_NATS_SERVER"):
        nats_server_binary()


async def test_stream_data_survives_a_restart(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "store") as server:
        first_url = server.url
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        ack = await js.publish("keep.a", b"still here")
        await nc.close()

        server.restart()
        assert server.url == first_url  # same port, so clients can reconnect
        nc = await nats.connect(server.url)
        msg = await nc.jetstream().get_msg("KEEP", seq=ack.seq)
        await nc.close()
    assert msg.data == b"still here"
    assert not server.running


def test_temporary_store_is_removed_on_stop() -> None:
    server = EmbeddedNats().start()
    data_dir = server.data_dir
    assert (data_dir / "jetstream").is_dir()
    assert server.url.startswith("nats://127.0.0.1:")
    assert server.pid is not None
    assert os.getpgid(server.pid) != os.getpgid(0)  # a Ctrl-C for us does not reach it
    server.stop()
    assert not data_dir.exists()
    server.stop()  # idempotent


def test_a_taken_port_fails_with_the_server_log(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "a") as first:
        second = EmbeddedNats(tmp_path / "b", port=first.port)
        with pytest.raises(NatsServerFailed) as caught:
            second.start()
        assert not second.running
    message = str(caught.value)
    assert "exited" in message
    assert "address already in use" in message


def test_bad_flags_fail_with_the_server_log(tmp_path: Path) -> None:
    with pytest.raises(NatsServerFailed, match="not defined: -no-such-flag"):
        EmbeddedNats(tmp_path, args=["--no-such-flag"]).start()


def test_port_is_unknown_before_start() -> None:
    with pytest.raises(NatsServerFailed, match="not been started"):
        _ = EmbeddedNats().url
