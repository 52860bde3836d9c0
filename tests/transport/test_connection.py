"""Connection options and ``connect`` against real servers (open, password, TLS)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import (
    DEFAULT_URL,
    ConnectionFailed,
    ConnectOptions,
    connect,
)

# --- resolve --------------------------------------------------------------------------


def test_defaults_without_flags_or_environment() -> None:
    opts = ConnectOptions.resolve(env={})
    assert opts.servers == [DEFAULT_URL]
    assert opts.prefix == "il"
    assert opts.user is None
    assert opts.ssl_context() is None


def test_environment_fills_what_flags_leave_out() -> None:
    env = {
        "INTERLOCK_URL": "nats://a:4222, nats://b:4222",
        "INTERLOCK_USER": "env-user",
        "INTERLOCK_PASSWORD": "env-pass",
        "INTERLOCK_PREFIX": "acme",
        "INTERLOCK_TOKEN": "",
    }
    opts = ConnectOptions.resolve(env=env, user="flag-user", name="svc")
    assert opts.servers == ["nats://a:4222", "nats://b:4222"]
    assert opts.user == "flag-user"
    assert opts.password == "env-pass"
    assert opts.token is None  # empty means unset
    assert opts.name == "svc"
    assert opts.subjects.runs_stream == "ACME_RUNS"


def test_server_argument_wins_over_environment() -> None:
    opts = ConnectOptions.resolve("nats://flag:1", env={"INTERLOCK_URL": "nats://env:2"})
    assert opts.servers == ["nats://flag:1"]


def test_unknown_option_is_an_error() -> None:
    with pytest.raises(TypeError, match="colour"):
        ConnectOptions.resolve(env={}, colour="blue")


def test_passwords_in_urls_are_masked() -> None:
    opts = ConnectOptions(servers=["nats://bob:secret@host:4222", "nats://other:4222"])
    assert opts.display_servers() == "nats://bob:***@host:4222, nats://other:4222"


# --- connect --------------------------------------------------------------------------


async def test_connects_to_the_test_server(nats_url: str) -> None:
    nc = await connect(ConnectOptions(servers=[nats_url], name="t"))
    try:
        assert nc.is_connected
        assert nc.options["max_reconnect_attempts"] == -1
    finally:
        await nc.close()


async def test_unreachable_server_fails_naming_the_url() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match=f"cannot connect to NATS at {url}"):
        await connect(ConnectOptions(servers=[url], connect_wait=0.5))
    assert time.monotonic() - started < 3


async def test_missing_credentials_file_is_named(tmp_path: Path) -> None:
    opts = ConnectOptions(creds_file=str(tmp_path / "x.creds"))
    with pytest.raises(ConnectionFailed, match=r"no credentials file at .*x\.creds"):
        await connect(opts)


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(
        tmp_path_factory.mktemp("auth"), args=["--user", "ann", "--pass", "s3cr3t"]
    ) as s:
        yield s


async def test_user_and_password_are_passed_through(password_server: EmbeddedNats) -> None:
    opts = ConnectOptions.resolve(
        password_server.url, env={"INTERLOCK_USER": "ann", "INTERLOCK_PASSWORD": "s3cr3t"}
    )
    nc = await connect(opts)
    try:
        assert nc.is_connected
        sub = await nc.subscribe("hello")
        await nc.publish("hello", b"x")
        msg = await sub.next_msg(timeout=5)
        assert msg.data == b"x"  # the server took this user's traffic both ways
    finally:
        await nc.close()


async def test_wrong_password_fails_fast(password_server: EmbeddedNats) -> None:
    opts = ConnectOptions(servers=[password_server.url], user="ann", password="nope")
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="refused the credentials") as caught:
        await connect(opts)
    assert password_server.url in str(caught.value)
    assert "nope" not in str(caught.value)
    assert time.monotonic() - started < opts.connect_wait


async def test_no_credentials_against_a_password_server(password_server: EmbeddedNats) -> None:
    with pytest.raises(ConnectionFailed, match=password_server.url):
        await connect(ConnectOptions(servers=[password_server.url], connect_wait=2))


# --- TLS ------------------------------------------------------------------------------


def _make_tls_files(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    files = {n: directory / f"{n}.pem" for n in ("ca", "ca-key", "server", "server-key")}
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run = ["openssl"]
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    subprocess.run(
        [*run, "req", "-x509", *key, "-nodes", "-days", "1", "-subj",
         "/CN=interlock-test-ca", "-keyout", files["ca-key"], "-out", files["ca"]],
        check=True, capture_output=True,
    )  # fmt: skip
    csr = directory / "server.csr"
    subprocess.run(
        [*run, "req", *key, "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", files["server-key"], "-out", csr],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [*run, "x509", "-req", "-in", csr, "-CA", files["ca"], "-CAkey", files["ca-key"],
         "-CAcreateserial", "-days", "1", "-extfile", ext, "-out", files["server"]],
        check=True, capture_output=True,
    )  # fmt: skip
    return files


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_with_a_private_ca(tmp_path: Path) -> None:
    files = _make_tls_files(tmp_path)
    tls_args = ["--tls", "--tlscert", str(files["server"]), "--tlskey", str(files["server-key"])]
    with EmbeddedNats(tmp_path / "store", args=tls_args) as server:
        url = f"tls://127.0.0.1:{server.port}"
        nc = await connect(ConnectOptions.resolve(url, env={"INTERLOCK_TLS_CA": str(files["ca"])}))
        try:
            assert nc.connected_url is not None
            await nc.flush()
        finally:
            await nc.close()
        # Without the private CA the server's certificate is not trusted.
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="certificate verify failed"):
            await connect(ConnectOptions(servers=[url]))
        assert time.monotonic() - started < 2  # not retried: it cannot get better
