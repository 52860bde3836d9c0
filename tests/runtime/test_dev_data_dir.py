"""A second `interlock dev` on a data directory another one runs on is refused, saying
which one holds it: two nats-servers storing into one JetStream directory would each take
the other's files for their own (the second's heartbeats timed out, both stores at risk)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

INTERLOCK = str(Path(sys.executable).with_name("interlock"))

pytestmark = pytest.mark.timeout(120)


def _dev(data: Path, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["XDG_CONFIG_HOME"] = str(cwd / "config")  # its context, not the user's
    return subprocess.Popen(
        [INTERLOCK, "dev", "--data-dir", str(data), "--port", "0", "--no-http", "--no-agents",
         "--metrics-port", "0"],
        cwd=cwd, env=env, text=True, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


def test_a_second_dev_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = _dev(data, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert first.stdout is not None
        url = None
        for line in first.stdout:  # each line as it is written: up once it says so
            if line.startswith("export INTERLOCK_URL="):
                url = line.strip().split("=", 1)[1]
            if line.startswith("orchestrator running"):
                break
        assert url is not None
        second = _dev(data, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()  # it started: the very thing refused
            second.communicate()
            raise
        assert second.returncode == 2, (out, err)
        assert err.strip() == (
            f"interlock dev: another interlock dev (pid {first.pid}, NATS at {url}) runs "
            f"with its data in {data}: stop it first (Ctrl-C), or give this one --data-dir DIR"
        )
        assert out == ""  # nothing started
        assert first.poll() is None  # the first runs on
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 0


def test_a_nats_port_in_use_is_said_first_and_how_to_pick_another(tmp_path: Path) -> None:
    """The port another process listens on: the server's fatal error on the first line (its
    log, some thirty lines, follows), and what to do on the last."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [INTERLOCK, "dev", "--port", str(port), "--no-http", "--no-agents", "--no-metrics"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
        env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
        )
    lines = done.stderr.splitlines()
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert lines[0].startswith("interlock dev: nats-server exited with code 1 while starting")
    assert f"{port}: bind: address already in use" in lines[0], lines[0]
    assert lines[-1] == (
        f"interlock dev: port {port} is taken by another process: stop it, or give --port N "
        "(0 picks a free one)"
    )
