"""Node.js for the wire-contract tests: found on PATH, packages installed from a lockfile;
the JavaScript example (examples/agents-js) run against a real stack with authentication
on, and the CLI each party's credential is issued with."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from interlock.auth.dev import DevAuth
from interlock.cli.dev import secure, start_stack, stop_stack
from interlock.core.compiler import Compiled
from interlock.core.incoming import derive_run_id
from interlock.gateway.app import build_app
from interlock.gateway.service import Gateway
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.httpserver import HttpServer
from interlock.transport.subjects import Subjects

ROOT = Path(__file__).resolve().parents[2]
NPM_TIMEOUT_S = 240
EXAMPLE = ROOT / "examples" / "agents-js"
SUBJECTS = Subjects("il")
WAIT = 20.0
"""How long a test waits for what the worker or a run does."""


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


def copy_example(npm: str, into: Path) -> Path:
    """examples/agents-js copied to ``into``, its packages installed from the lockfile."""
    app = into / "agents-js"
    app.mkdir()
    for name in ("package.json", "package-lock.json", "worker.mjs", "publisher.mjs"):
        shutil.copy(EXAMPLE / name, app / name)
    npm_install(npm, app)
    return app


class NodeWorker:
    """``node worker.mjs`` with its output collected line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._new = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())
            self._new.set()

    async def wait_for(self, *words: str) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            for line in self.lines:
                if all(w in line for w in words):
                    return line
            if self.process.returncode is not None or loop.time() > deadline:
                raise AssertionError(f"the worker never said {words}:\n" + "\n".join(self.lines))
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), 0.5)

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)
        return code


async def cli(*args: str) -> tuple[int, str]:
    """``interlock ARGS`` as a user runs it: its exit code and output (stdout and stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "interlock",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


@dataclass
class JsStack:
    """A server with authentication on, the orchestrator, and the example's manifests
    applied (examples/agents-js/greet.yaml)."""

    server: EmbeddedNats
    client: InterlockClient
    auth: DevAuth
    data: Path
    compiled: Compiled

    async def issue(self, *args: str, out: Path) -> Path:
        """A credential issued as an operator does: ``interlock creds issue ARGS``."""
        code, said = await cli(
            "creds", "issue", *args, "--keys", str(self.data / "keys"), "-o", str(out),
            "--server", self.server.url,
        )  # fmt: skip
        assert code == 0, said
        return out

    def run_id(self, workflow: str, source: str, event_id: str) -> str:
        """The run an event of ``source`` and ``event_id`` starts by a trigger of ``workflow``."""
        [definition] = [d for d in self.compiled.workflows if d.name == workflow]
        return derive_run_id(definition, source, event_id)


@contextlib.asynccontextmanager
async def secured_stack(data: Path) -> AsyncIterator[JsStack]:
    auth = secure(data)
    server = EmbeddedNats(data, args=auth.server_args)
    server.start()
    try:
        stack = await start_stack(server.url, auth=auth, agents=False)
        nc = await connect(ConnectOptions.resolve(server.url, creds_file=str(auth.operator)))
        client = InterlockClient(nc, SUBJECTS)
        try:
            applied = await client.apply([("<greet>", (EXAMPLE / "greet.yaml").read_text())])
            applied.compiled.raise_for_errors()
            yield JsStack(server, client, auth, data, applied.compiled)
        finally:
            await nc.close()
            await stop_stack(*stack)
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def http_gateway(url: str, creds: Path) -> AsyncIterator[str]:
    """The HTTP gateway on its own credential, as ``interlock dev`` runs it: its URL."""
    nc = await connect(ConnectOptions.resolve(url, creds_file=str(creds), name="gateway"))
    gateway = Gateway(nc, SUBJECTS)
    await gateway.start()
    server = HttpServer(build_app(gateway), 0)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
        await gateway.stop()
        await nc.close()


async def start_worker(node: str, app: Path, env: Mapping[str, str]) -> NodeWorker:
    """``node worker.mjs`` in ``app`` with ``env`` added to this process's environment."""
    process = await asyncio.create_subprocess_exec(
        node,
        "worker.mjs",
        cwd=app,
        env=os.environ | dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    return NodeWorker(process)


async def run_node(node: str, app: Path, *args: str, env: Mapping[str, str]) -> tuple[int, str]:
    """``node ARGS`` in ``app`` to its end: its exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        node,
        *args,
        cwd=app,
        env=os.environ | dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    return proc.returncode or 0, out.decode()


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Until ``check()`` holds, polled; an AssertionError naming ``what`` after WAIT s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)
