"""Shared helpers of the runtime integration and end-to-end tests.

An in-process stack (orchestrator, client and a test agent worker on their own
connections), awaitable conditions on consumers and dead letters, and a small harness for
the ``interlock`` console script run as a user runs it (foreground and background).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from interlock.client import Client as PublicClient
from interlock.core import events as ev
from interlock.runtime.client import InterlockClient
from interlock.runtime.service import Orchestrator
from interlock.sdk import RetryableError, TaskContext, Worker
from interlock.transport.subjects import Subjects

TIMEOUT = 30.0
"""Upper bound of any single wait in these tests; a healthy run takes milliseconds. Only a
hang waits it out, so it is generous: on a 2-core machine at a load average of 20 to 30
(CI, other test processes) a wait that takes half a second on a quiet one can take ten."""

REPO = Path(__file__).resolve().parents[2]
ECHO_MANIFEST = REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml"

TEST_AGENT = textwrap.dedent(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: testagent
    spec:
      capabilities:
        - name: echo
          input_schema: {type: object}
          output_schema: {type: object}
        - name: strict
          input_schema:
            type: object
            required: [n]
            properties:
              n: {type: integer}
        - name: liar
          output_schema:
            type: object
            required: [score]
            properties:
              score: {type: number}
        - name: slow
    """
)
"""Capabilities served by :func:`make_worker`: ``echo`` answers its input, ``strict`` has
an input schema, ``liar`` answers output that breaks its declared output schema, ``slow``
waits until released (or cancelled)."""


def yaml(text: str) -> str:
    return textwrap.dedent(text)


HELLO = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: hello
      description: echo a message back
    spec:
      inputs:
        message: {type: string, required: true}
      triggers:
        - event: com.example.greet
          filter: {lang: en}
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {message: "{{ inputs.message }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            echoed: "$.states.work.output.message"
    """
)
"""The workflow most tests run: one ``echo`` action; started by hand or by a
``com.example.greet`` event whose data has ``lang: en``."""

GATED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: gated
    spec:
      initial_state: review
      states:
        review:
          type: human_in_the_loop
          timeout: {after: 1h, goto: expired}
          on:
            - event: approval.granted
              guard: 'data.score > 7'
              goto: approved
            - {event: approval.denied, goto: denied}
        approved:
          type: terminal
          outputs: {ok: true}
        denied:
          type: terminal
        expired:
          type: terminal
    """
)
"""A run that waits for a person: ``approval.granted`` with a score over 7 approves it,
``approval.denied`` ends it, and after an hour it expires."""

PARKED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: parked
    spec:
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: done}
        done:
          type: terminal
          outputs: {approved: true}
    """
)
"""A run that waits, with no timeout, until ``approval.granted`` completes it."""

WAITER = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: waiter}
spec:
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal, outputs: {ok: true}}
"""
"""A run that waits until a ``go`` signal completes it (outputs ``{ok: true}``)."""

TWO_ECHOES = """
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: two-steps}
spec:
  initial_state: a
  states:
    a:
      actions: [{capability: echo, input: {step: 1}}]
      on: [{event: task.completed, goto: b}]
    b:
      actions: [{capability: echo, input: {step: 2}}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal, outputs: {step: "$.states.b.output.step"}}
"""
"""Two answers of ``echo`` in turn (``{step: 1}``, ``{step: 2}``): outputs ``{step: 2}``."""


# --- the test agent ----------------------------------------------------------------------


@dataclass
class Recorder:
    """What the test agent was asked to do, one entry per task message handled."""

    handled: list[tuple[str, str, int]] = field(default_factory=list)
    """(capability, action id, delivery count)"""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    slow_started: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    cancelled: list[str] = field(default_factory=list)

    def per_action(self) -> Counter[str]:
        return Counter(action_id for _, action_id, _ in self.handled)

    def actions_of(self, run_id: str) -> list[str]:
        return [a for _, a, _ in self.handled if a.startswith(run_id + ":")]


def make_worker(recorder: Recorder, *, name: str = "testagent", ack_wait: float = 30.0) -> Worker:
    """A fresh worker serving the ``testagent`` capabilities, recording every task."""
    worker = Worker(name, concurrency=64, ack_wait=ack_wait, grace_period=1.0)

    def note(capability: str, ctx: TaskContext) -> None:
        recorder.handled.append((capability, ctx.action_id, ctx.delivery))

    @worker.capability("echo", input_schema={"type": "object"}, output_schema={"type": "object"})
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        note("echo", ctx)
        if "retry_after" in inp and ctx.attempt == 1:  # an API's 429, passed on
            raise RetryableError("429", code="rate_limited", retry_after=inp["retry_after"])
        return inp

    @worker.capability("strict")
    async def strict(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        note("strict", ctx)
        return inp

    # An explicit (permissive) schema: the worker does not check the AgentDef's output
    # schema, so what the orchestrator does with a bad answer is what is tested.
    @worker.capability("liar", output_schema={"type": "object"})
    async def liar(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        note("liar", ctx)
        return {"score": "not a number"}

    @worker.capability("slow")
    async def slow(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        note("slow", ctx)
        recorder.slow_started.put_nowait(ctx.action_id)
        try:
            await recorder.release.wait()
        except asyncio.CancelledError:
            recorder.cancelled.append(ctx.action_id)
            raise
        return {"slow": True}

    return worker


# --- an in-process stack ---------------------------------------------------------------


@dataclass
class Stack:
    client: InterlockClient
    orchestrator: Orchestrator
    recorder: Recorder
    worker: Worker | None
    subjects: Subjects

    @property
    def js(self) -> JetStreamContext:
        return self.client.js

    async def apply(self, *manifests: str) -> list[Any]:
        """Apply manifests (YAML text); fails the test on any diagnostic."""
        result = await self.client.apply(
            [(f"<manifest {i}>", text) for i, text in enumerate(manifests)]
        )
        assert result.compiled.ok, [str(d) for d in result.compiled.diagnostics]
        return result.applied

    async def wait(self, run_id: str, timeout: float = TIMEOUT) -> Any:  # noqa: ASYNC109
        return await self.client.wait(run_id, timeout)

    async def records(self, run_id: str) -> list[ev.AnyRecord]:
        records, _ = await self.client.log.read(run_id)
        return records


async def connect(url: str) -> Client:
    """A plain client of the server at ``url`` (on the tests' own credential where the
    server asks for one: support.accounts)."""
    from support.accounts import admin_creds

    return await nats.connect(
        url, connect_timeout=5, max_reconnect_attempts=0, user_credentials=admin_creds(url)
    )


@contextlib.asynccontextmanager
async def running_stack(
    url: str,
    subjects: Subjects,
    manifests: Iterable[str] = (),
    *,
    worker: bool = True,
    **options: Any,
) -> AsyncIterator[Stack]:
    """Client, orchestrator and (optionally) the test worker, each on its own connection.

    ``manifests`` (plus the test AgentDef) are applied before the orchestrator starts;
    ``options`` go to the :class:`Orchestrator`.
    """
    client_nc, orch_nc = await connect(url), await connect(url)
    worker_nc: Client | None = None
    client = InterlockClient(client_nc, subjects)
    await client.ensure_provisioned()
    recorder = Recorder()
    orchestrator = Orchestrator(orch_nc, subjects, **options)
    the_worker: Worker | None = None
    worker_task: asyncio.Task[None] | None = None
    stack = Stack(client, orchestrator, recorder, None, subjects)
    try:
        await stack.apply(TEST_AGENT, *manifests)
        await orchestrator.start()
        if worker:
            worker_nc = await connect(url)
            the_worker = make_worker(recorder)
            worker_task = asyncio.create_task(the_worker.run(worker_nc, prefix=subjects.prefix))
            await asyncio.wait_for(the_worker.wait_ready(), TIMEOUT)
            stack.worker = the_worker
        yield stack
    finally:
        recorder.release.set()
        if the_worker is not None:
            await asyncio.wait_for(the_worker.stop(force=True), TIMEOUT)
        if worker_task is not None:
            await worker_task
        await orchestrator.stop()
        for conn in (client_nc, orch_nc, worker_nc):
            if conn is not None:
                await conn.close()


@contextlib.asynccontextmanager
async def serving(url: str, subjects: Subjects, worker: Worker) -> AsyncIterator[Worker]:
    """``worker`` serving its capabilities on a connection of its own while in the block
    (ready when it is entered); stopped at the end, its tasks in flight cancelled."""
    nc = await connect(url)
    task = asyncio.create_task(worker.run(nc, prefix=subjects.prefix))
    try:
        await asyncio.wait_for(worker.wait_ready(), TIMEOUT)
        yield worker
    finally:
        await asyncio.wait_for(worker.stop(force=True), TIMEOUT)
        await task
        await nc.close()


# --- awaitable conditions --------------------------------------------------------------


async def eventually(
    probe: Any, *, within: float = TIMEOUT, interval: float = 0.02, what: str = ""
) -> Any:
    """Await ``probe()`` until it returns something truthy (bounded); returns it.

    For conditions the server exposes only as state (consumer info), not as a message.
    """
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached after {within}s: {what or probe}")
        await asyncio.sleep(interval)


async def consumer_settled(
    js: JetStreamContext, stream: str, durable: str, seq: int, *, within: float = TIMEOUT
) -> Any:
    """Wait until ``durable`` has acked every message of ``stream`` up to ``seq``."""

    async def probe() -> Any:
        info = await js.consumer_info(stream, durable)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        if floor >= seq and not info.num_ack_pending and not info.num_pending:
            return info
        return None

    return await eventually(probe, within=within, what=f"{durable} acks up to {seq}")


class DeadLetters:
    """Messages stored on the dead-letter stream, in order."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._sub: Any = None

    async def __aenter__(self) -> DeadLetters:
        self._sub = await self._js.subscribe(
            self._subjects.dead_letters_all,
            ordered_consumer=True,
            stream=self._subjects.dead_letter_stream,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    async def next(self, timeout: float = TIMEOUT) -> Msg:  # noqa: ASYNC109
        msg: Msg = await self._sub.next_msg(timeout=timeout)
        return msg


# --- the console script ----------------------------------------------------------------

INTERLOCK = str(Path(sys.executable).with_name("interlock"))


def cli_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NATS_URL", None)
    env.update(INTERLOCK_URL=url, INTERLOCK_PREFIX=prefix, PYTHONUNBUFFERED="1", **extra)
    from support.accounts import admin_creds

    creds = admin_creds(url) if url else None
    if creds is not None and "INTERLOCK_CREDS" not in extra:
        env["INTERLOCK_CREDS"] = creds
    return env


def run_cli(
    *args: str,
    env: Mapping[str, str],
    timeout: float = 30.0,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``interlock ARGS`` as typed in a shell; output captured as text."""
    return subprocess.run(
        [INTERLOCK, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        cwd=cwd,
        check=False,
    )


async def cli(nats_url: str, subjects: Subjects, *args: str, code: int = 0) -> str:
    """``interlock ARGS`` against the installation of ``subjects`` on ``nats_url``, run in a
    thread (an orchestrator on the test's event loop goes on meanwhile): its output, once
    it has exited with ``code``."""
    done = await asyncio.to_thread(run_cli, *args, env=cli_env(nats_url, subjects.prefix))
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


class Background:
    """A long-running process whose output lines can be awaited."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:
        """The first line (from now on) matching ``pattern``; fails on exit or timeout."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.argv[:3]}: no line matching {pattern!r}: {self.output}"
                )
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)
                raise AssertionError(
                    f"{self.argv[:3]} exited ({self.proc.poll()}) before {pattern!r}: {self.output}"
                )
            self.lines.append(line)
            found = regex.search(line)
            if found:
                return found

    async def await_line(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:  # noqa: ASYNC109
        return await asyncio.to_thread(self.wait_for, pattern, timeout)

    @property
    def output(self) -> str:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is None:
                self._queue.put(None)
                break
            self.lines.append(line)
        return "\n".join(self.lines[-40:])

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)

    def wait(self, timeout: float = TIMEOUT) -> int:
        """The exit code, once it exits by itself (killed and failed after ``timeout``)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.argv[:3]} did not exit: {self.output}") from None
        self._reader.join(TIMEOUT)
        return self.proc.returncode

    def stop(self, timeout: float = TIMEOUT) -> int:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        return self.proc.returncode


def interlock_bg(*args: str, env: Mapping[str, str], cwd: Path | None = None) -> Background:
    return Background([INTERLOCK, *args], env, cwd)


def slow_worker() -> Worker:
    """A worker whose ``slow`` handler announces each task, then never finishes.

    Run in a child process (``interlock agent run support.runtime:slow_worker``) that a test kills
    mid-task. The orchestrator of the test creates the capability's consumer with a short
    ack wait, so JetStream hands the task to another worker two seconds after the
    progress acks stop.
    """
    worker = Worker("slowagent", concurrency=4, ack_wait=2.0, grace_period=0.1)

    @worker.capability("slow")
    async def slow(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        print(f"STARTED {ctx.action_id} delivery={ctx.delivery}", flush=True)
        await asyncio.sleep(3600)
        return {}

    return worker


def serve(url: str, prefix: str) -> Background:
    """``python -m interlock serve``, as an operator runs it (a process a test may kill)."""
    argv = [sys.executable, "-m", "interlock", "serve", "--server", url, "--prefix", prefix]
    # A short ack wait: what the killed process had taken comes back within two seconds.
    argv += ["--ack-wait", "2", "--metrics-port", "0"]
    return Background(argv, cli_env(url, prefix))


async def started(process: Background) -> None:
    """Wait until the orchestrator ``process`` (:func:`serve`) says it has started."""
    await process.await_line("orchestrator started")


@contextlib.asynccontextmanager
async def client_for(url: str, subjects: Subjects) -> AsyncIterator[InterlockClient]:
    """A client on a connection of its own, the streams and buckets provisioned."""
    nc = await connect(url)
    try:
        client = InterlockClient(nc, subjects)
        await client.ensure_provisioned()
        yield client
    finally:
        await nc.close()


# --- an installation driven through the CLI ------------------------------------------------

STARTUP_TIMEOUT = 60.0
"""Upper bound for a background ``interlock`` process to start (imports on a busy machine)."""


@dataclass
class Installation:
    """An orchestrator and the echo agent as processes, and the CLI run against them from
    a folder of manifests, as a user runs it."""

    url: str
    prefix: str
    env: dict[str, str]
    files: Path

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    def cli(self, *args: str, env: Mapping[str, str] | None = None) -> Any:
        return run_cli(*args, env=env or self.env, cwd=self.files)

    def ok(self, *args: str) -> str:
        done = self.cli(*args)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return str(done.stdout)

    def until(self, probe: Callable[[PublicClient], Awaitable[Any]], what: str) -> Any:
        """Wait (bounded) until ``probe`` finds something truthy in what the server holds,
        read by the client library on one connection: for state written after the command
        that caused it returned (the run index, dead letters), before the CLI reads it once.
        Polling with the CLI itself would start a process a look, taking the CPU that the
        orchestrator needs to write what is waited for."""

        async def wait() -> Any:
            nc = await connect(self.url)
            try:
                client = PublicClient(nc, self.subjects)
                return await eventually(lambda: probe(client), what=what)
            finally:
                await nc.close()

        return asyncio.run(wait())

    def until_listed(
        self, run_id: str, *, status: str | None = None, waiting: str | None = None
    ) -> None:
        """Wait until the run index lists ``run_id`` (with ``status``, waiting for
        ``waiting``), as ``interlock runs`` filters it."""

        async def probe(client: PublicClient) -> bool:
            runs = await client.runs(status=status, waiting=waiting)
            return any(r.run_id == run_id for r in runs)

        self.until(probe, f"the run index lists {run_id} (status {status}, waiting {waiting})")


@contextlib.contextmanager
def cli_installation(
    url: str, files: Path, manifests: Mapping[str, str], *, tag: str = "cli"
) -> Iterator[Installation]:
    """``interlock serve`` and ``interlock agent run echo`` under a prefix of their own,
    with ``manifests`` (file name -> text) and ``echo.yaml`` written into ``files``; both
    must stop cleanly at the end."""
    prefix = f"{tag}{uuid.uuid4().hex[:10]}"
    env = cli_env(url, prefix)
    for name, text in manifests.items():
        (files / name).write_text(text)
    (files / "echo.yaml").write_text(ECHO_MANIFEST.read_text())
    serve = interlock_bg("serve", "--metrics-port", "0", env=env)
    agent = interlock_bg("agent", "run", "echo", "--metrics-port", "0", env=env)
    try:
        serve.wait_for("orchestrator started", STARTUP_TIMEOUT)
        agent.wait_for("serving echo", STARTUP_TIMEOUT)
        yield Installation(url, prefix, env, files)
    finally:
        codes = (serve.stop(), agent.stop())
    assert codes == (0, 0), (serve.output, agent.output)
