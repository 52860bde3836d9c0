"""Chaos: ``interlock serve``, two echo agents and nats-server itself are killed with
SIGKILL at random moments and restarted, while runs are started both by ``interlock
start`` and by trigger events. Afterwards every run has completed exactly once, and no
attempt of any action was applied twice.

The installation is the shipped one, authentication on: each party on its own credential
(the orchestrator's, the reference agents', the operator's for the CLI, a publisher's for
the trigger events), so the answers go through the task-token check the whole time.

The figures (runs, kills of each kind, retried attempts, time to drain) are printed; run
``pytest -s tests/security/test_hostile_chaos.py`` to see them. ``CHAOS_SCALE=4`` (say)
multiplies the runs and the time processes are killed for (``nice`` it: it is long).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import nats
import pytest

from interlock.auth.jwt import creds_user
from interlock.auth.roles import Role, inbox_prefix
from interlock.cli.dev import secure
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.subjects import Subjects
from support.hostile import ECHO_MANIFEST, Background, cli_env, run_cli, yaml

SCALE = float(os.environ.get("CHAOS_SCALE", "1"))
CLI_RUNS = round(8 * SCALE)
"""Runs started with ``interlock start`` (one process each)."""
TRIGGERED_RUNS = round(32 * SCALE)
"""Runs started by trigger events published as an external system would."""
CHAOS_S = 20.0 * SCALE
"""How long processes are being killed: each of the four (``interlock serve``, both agents,
nats-server) is killed once a turn, in a random order, at random moments."""

VICTIMS = ["serve", "agent-1", "agent-2", "nats-server"]
TURNS = 2
"""Each victim is killed at least this often, however long it takes."""

pytestmark = pytest.mark.timeout(400 * max(SCALE, 1.0))
DRAIN_S = 120.0
"""How long every run has, after the last kill, to finish."""

CHAIN = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: chaos
    spec:
      inputs:
        n: {type: integer, required: true}
      triggers:
        - event: com.example.chaos
      initial_state: one
      states:
        one:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 1}
              timeout: 15s
              retry: {max_attempts: 20, backoff: {initial: 500ms, multiplier: 1}}
          on:
            - {event: task.completed, goto: two}
        two:
          actions:
            - capability: echo
              input: {n: "{{ inputs.n }}", step: 2}
              timeout: 15s
              retry: {max_attempts: 20, backoff: {initial: 500ms, multiplier: 1}}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            n: "$.states.two.output.n"
    """
)


async def _quiet(exc: Exception) -> None:
    return None


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Installation:
    """nats-server, ``interlock serve`` and two echo agents, each killable and restartable."""

    def __init__(self, root: Path) -> None:
        self.prefix = "chaos"
        self.auth = secure(root / "nats", self.prefix)
        self.publisher = root / "publisher.creds"
        text, _ = self.auth.keys.issue(
            Role("publisher", events=("com.example.>",)), Subjects(self.prefix), name="chaos"
        )
        self.publisher.write_text(text)
        # Its account in the server's configuration (issued before the server starts).
        resolver = (root / "nats" / "jwt").resolve()
        self.auth.config.write_text(self.auth.keys.server_config(resolver))
        self.server = EmbeddedNats(root / "nats", port=_free_port(), args=self.auth.server_args)
        self.server.start()
        self.env = cli_env(self.server.url, self.prefix, INTERLOCK_CREDS=str(self.auth.operator))
        self.procs: dict[str, Background | None] = {
            "serve": None,
            "agent-1": None,
            "agent-2": None,
        }
        self.kills: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        self.exit_tails: list[str] = []

    def argv(self, name: str) -> list[str]:
        base = [sys.executable, "-m", "interlock"]
        if name == "serve":
            return [*base, "serve", "--ack-wait", "2", "--metrics-port", "0"]
        return [*base, "agent", "run", "echo", "--metrics-port", "0"]

    def start(self, name: str) -> None:
        creds = self.auth.orchestrator if name == "serve" else self.auth.agents
        self.procs[name] = Background(self.argv(name), {**self.env, "INTERLOCK_CREDS": str(creds)})

    async def connect(self, creds: Path) -> nats.NATS:
        return await nats.connect(
            self.server.url,
            user_credentials=str(creds),
            inbox_prefix=inbox_prefix(creds_user(creds)),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            error_cb=_quiet,  # the server is down now and then: that is the point
        )

    def kill(self, name: str) -> None:
        self.kills[name] += 1
        if name == "nats-server":
            pid = self.server.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.server._proc.wait(10)  # type: ignore[union-attr]
            self.server._proc = None
            return
        proc = self.procs[name]
        assert proc is not None
        proc.kill()

    def restart(self, name: str) -> None:
        if name == "nats-server":
            self.server.start()
        else:
            self.start(name)

    def revive(self) -> None:
        """What a supervisor (Kubernetes, compose ``restart: always``) does: start again
        any process that exited by itself; each such exit is counted."""
        for name, proc in self.procs.items():
            if proc is not None and proc.proc.poll() is not None:
                self.exits[name] += 1
                self.exit_tails.append(f"{name}: {proc.output.splitlines()[-3:]}")
                self.start(name)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc is not None:
                proc.kill()
        self.server.stop()


async def _publish_trigger(nc: nats.NATS, subjects: Subjects, n: int) -> None:
    event = CloudEvent(
        id=f"chaos-{n}",
        source="/chaos",
        type="com.example.chaos",
        datacontenttype="application/json",
        data={"n": n},
    )
    headers, payload = encode_binary(event)
    headers["Nats-Msg-Id"] = f"{event.source}:{event.id}"
    while True:  # the server may be down: the same message again (deduplicated) until stored
        try:
            await nc.jetstream().publish(
                subjects.event(event.type), payload, headers=headers, timeout=2
            )
        except Exception:  # noqa: BLE001 - whatever an outage raises: try again
            await asyncio.sleep(0.3)
        else:
            return


def _cli_start(env: dict[str, str], n: int) -> None:
    while True:  # an outage makes the command fail: the same run id again until it is there
        done = run_cli(
            "start",
            "chaos",
            "--input",
            json.dumps({"n": n}),
            "--run-id",
            f"cli-{n}",
            env=env,
        )
        if done.returncode == 0 or "exists already" in done.stderr:
            return
        time.sleep(0.3)


async def _read(client: InterlockClient, run_id: str) -> list[ev.AnyRecord]:
    try:
        return await client.read(run_id)
    except Exception:  # noqa: BLE001 - not there yet, or the server is down: not finished
        return []


async def test_runs_complete_exactly_once_through_kill_9_of_everything(
    tmp_path: Path,
) -> None:
    rng = random.Random(os.environ.get("CHAOS_SEED", "interlock"))
    inst = Installation(tmp_path)
    subjects = Subjects(inst.prefix)
    manifest = _write(tmp_path / "chaos.yaml", CHAIN)
    try:
        applied = run_cli("apply", str(ECHO_MANIFEST), str(manifest), env=inst.env)
        assert applied.returncode == 0, applied.stderr
        for name in inst.procs:
            inst.start(name)
        publisher = await inst.connect(inst.publisher)
        nc = await inst.connect(inst.auth.operator)
        started = time.monotonic()

        async def chaos() -> None:
            victims: list[str] = []
            turns = 0
            while time.monotonic() - started < CHAOS_S or turns < TURNS or victims:
                if not victims:  # each process once per turn, in a random order
                    victims = rng.sample(VICTIMS, len(VICTIMS))
                    turns += 1
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                victim = victims.pop()
                inst.kill(victim)
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                await asyncio.to_thread(inst.restart, victim)
                inst.revive()

        async def triggers() -> None:
            for n in range(TRIGGERED_RUNS):
                await _publish_trigger(publisher, subjects, n)
                await asyncio.sleep(CHAOS_S * 0.8 / TRIGGERED_RUNS)

        async def cli_starts() -> None:
            for n in range(CLI_RUNS):
                await asyncio.to_thread(_cli_start, inst.env, 1000 + n)
                await asyncio.sleep(CHAOS_S * 0.6 / CLI_RUNS)

        await asyncio.gather(chaos(), triggers(), cli_starts())
        assert min(inst.kills[v] for v in VICTIMS) >= TURNS, inst.kills
        last_kill = time.monotonic()

        client = InterlockClient(nc, subjects)
        definition, _ = await client.registry.latest("chaos")
        run_ids = [f"cli-{1000 + n}" for n in range(CLI_RUNS)]
        run_ids += [
            derive_run_id(definition, "/chaos", f"chaos-{n}") for n in range(TRIGGERED_RUNS)
        ]

        async def unfinished() -> list[str]:
            logs = await asyncio.gather(*(_read(client, r) for r in run_ids))
            return [
                r
                for r, log in zip(run_ids, logs, strict=True)
                if not any(isinstance(x, ev.RunCompleted | ev.RunFailed) for x in log)
            ]

        left = await unfinished()
        while left and time.monotonic() - last_kill < DRAIN_S:
            await asyncio.sleep(0.5)
            inst.revive()
            left = await unfinished()
        drained = time.monotonic() - last_kill
        if left:
            report = []
            for run_id in left[:5]:
                log = await _read(client, run_id)
                report.append(f"{run_id}: {[ev.record_type(r).rsplit('.', 2)[-2:] for r in log]}")
            tails = {
                name: proc.output.splitlines()[-15:] if proc is not None else None
                for name, proc in inst.procs.items()
            }
            pytest.fail(
                f"{len(left)} runs did not finish; kills {dict(inst.kills)}, "
                f"exits {dict(inst.exits)}: {inst.exit_tails}\n"
                + "\n".join(report)
                + f"\n{json.dumps(tails, indent=1)}"
            )

        retried = 0
        per_run: Counter[str] = Counter()
        for run_id in run_ids:
            log = await client.read(run_id)
            kinds = Counter(ev.record_type(r) for r in log)
            assert kinds[ev.PREFIX + "run.started"] == 1, run_id
            assert kinds[ev.PREFIX + "run.completed"] == 1, (run_id, kinds)
            assert kinds[ev.PREFIX + "run.failed"] == 0, (run_id, kinds)
            completed = Counter(r.data.action_id for r in log if isinstance(r, ev.ActionCompleted))
            assert set(completed.values()) == {1}, (run_id, completed)
            assert len(completed) == 2, run_id
            attempts = Counter(
                (r.data.action_id, r.data.attempt) for r in log if isinstance(r, ev.ActionRequested)
            )
            assert set(attempts.values()) == {1}, (run_id, attempts)  # no attempt twice
            retried += sum(1 for (_, attempt) in attempts if attempt > 1)
            per_run[run_id] = len(log)
        outputs = []
        for run_id in run_ids:
            state = await client.state(run_id)
            outputs.append((state.outputs or {}).get("n"))
        assert sorted(outputs) == sorted([*range(TRIGGERED_RUNS), *range(1000, 1000 + CLI_RUNS)])
        info = await client.js.stream_info(subjects.runs_stream, subjects_filter=">")
        assert len(info.state.subjects or {}) == len(run_ids)  # no run started twice
        print(
            f"\nchaos: {len(run_ids)} runs ({CLI_RUNS} by interlock start, {TRIGGERED_RUNS} by "
            f"trigger events) over {CHAOS_S:.0f} s; SIGKILLs: {dict(inst.kills)} "
            f"({sum(inst.kills.values())} in all); processes that exited by themselves and "
            f"were restarted: {dict(inst.exits)}; retried attempts: {retried}; drained "
            f"{drained:.1f} s after the last kill; every run completed exactly once"
        )
        await nc.close()
        await publisher.close()
    finally:
        inst.close()
