"""End to end through the ``interlock`` console script, as a user types it.

One installation (a prefix of its own on the shared test server) for the module:
``interlock serve`` and ``interlock agent run echo`` run in the background, and every
command is a separate process configured by INTERLOCK_URL and INTERLOCK_PREFIX. The
``interlock dev`` tests start their own embedded server.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from interlock.client import Client
from interlock.core.engine import derive_run_id
from interlock.runtime.client import InterlockClient
from support.runtime import (
    HELLO,
    PARKED,
    STARTUP_TIMEOUT,
    TIMEOUT,
    Background,
    Installation,
    cli_env,
    cli_installation,
    connect,
    interlock_bg,
    run_cli,
    yaml,
)

# The echo capability's input_schema wants an object: this run fails with schema_error.
FAILING = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: failing
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: "not an object"
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)

INVALID = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: broken
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
          on:
            - event: task.completed
              guard: 'result.score >'
              goto: nowhere
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def closed_port_url() -> str:
    """A URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


@dataclass
class CliInstallation(Installation):
    unreachable_serve: Background
    applied: str
    """What the first ``interlock apply`` printed: the echo AgentDef and the workflows of
    ``manifests`` but the invalid one, applied once for every test of the module."""

    def run_id_of_trigger(self, workflow: str, source: str, event_id: str) -> str:
        async def lookup() -> str:
            nc = await connect(self.url)
            try:
                definition, _ = await InterlockClient(nc, self.subjects).registry.latest(workflow)
            finally:
                await nc.close()
            return derive_run_id(definition, source, event_id)

        return asyncio.run(lookup())

    def stored(self) -> tuple[list[str], int]:
        """Workflows applied and records in run logs, read straight from the server."""

        async def read() -> tuple[list[str], int]:
            nc = await connect(self.url)
            try:
                client = InterlockClient(nc, self.subjects)
                names = [w["name"] for w in await client.registry.workflows()]
                info = await client.js.stream_info(self.subjects.runs_stream)
            finally:
                await nc.close()
            return sorted(names), info.state.messages

        return asyncio.run(read())


@pytest.fixture(scope="module")
def inst(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliInstallation]:
    files = tmp_path_factory.mktemp("cli")
    manifests = {
        "hello.yaml": HELLO,
        "parked.yaml": PARKED,
        "failing.yaml": FAILING,
        "invalid.yaml": INVALID,
    }
    # Started first: it takes the connect timeout (5 s) to give up, meanwhile the rest runs.
    unreachable = interlock_bg(
        "serve", "--server", closed_port_url(), "--metrics-port", "0", env=cli_env(nats_url, "u")
    )
    try:
        with cli_installation(nats_url, files, manifests) as base:
            applied = base.ok("apply", "echo.yaml", "hello.yaml", "parked.yaml", "failing.yaml")
            yield CliInstallation(base.url, base.prefix, base.env, base.files, unreachable, applied)
    finally:
        unreachable.stop()


# --- apply -------------------------------------------------------------------------------


def test_apply_valid_then_unchanged_then_invalid(inst: CliInstallation) -> None:
    out = inst.applied
    assert "applied  workflow default/hello (version 1)" in out
    assert "applied  workflow default/parked (version 1)" in out
    assert re.search(r"applied\s+agentdef default/echo", out)

    again = inst.ok("apply", "hello.yaml")
    assert again.strip() == "unchanged  workflow default/hello (version 1)"

    before = inst.stored()
    bad = inst.cli("apply", "invalid.yaml", "hello.yaml")
    assert bad.returncode == 1
    errors = bad.stderr.splitlines()
    assert "invalid.yaml:13:32: cel-compile: CEL does not compile: 'result.score >'" in errors
    assert any(
        e.startswith("invalid.yaml:14:17: unknown-goto: goto 'nowhere' is not a state")
        for e in errors
    )
    assert errors[-1] == "2 errors; nothing was applied"
    assert bad.stdout == ""
    # Nothing was applied, and no run started (other tests of the module may have
    # applied workflows of their own before this one).
    assert inst.stored() == before
    assert {"failing", "hello", "parked"} <= set(before[0])
    assert "broken" not in before[0]


# --- start, result, logs -----------------------------------------------------------------


def test_start_wait_prints_the_result(inst: CliInstallation) -> None:
    done = inst.cli("start", "hello", "--input", '{"message": "hi"}', "--wait", "--timeout", "20")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed"
    assert result["outputs"] == {"echoed": "hi"}
    assert result["run_id"].startswith("r")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ('{"message": 5}', "input 'message' must be string, got integer"),
        ("{}", "input 'message' is required"),
        ('{"message": ', "--input is not valid JSON"),
        ("[1, 2]", "--input must be a JSON object"),
    ],
    ids=["mistyped", "missing", "not-json", "not-an-object"],
)
def test_start_with_bad_input_exits_1_and_creates_no_run(
    inst: CliInstallation, given: str, message: str
) -> None:
    _, before = inst.stored()
    done = inst.cli("start", "hello", "--input", given)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert inst.stored()[1] == before


def test_emit_starts_a_run_followed_by_result_logs_and_runs(inst: CliInstallation) -> None:
    data = '{"lang": "en", "message": "from an event"}'
    out = inst.ok("emit", "com.example.greet", "--source", "/cli", "--id", "g1", "--data", data)
    run_id = inst.run_id_of_trigger("hello", "/cli", "g1")
    assert out.splitlines() == [
        "emitted com.example.greet id=g1",
        f"started  {run_id}  default/hello v1",
    ]

    assert json.loads(inst.ok("result", run_id, "--wait", "--timeout", "20")) == {
        "echoed": "from an event"
    }
    full = json.loads(inst.ok("result", run_id, "--json"))
    assert full == {
        "run_id": run_id,
        "status": "completed",
        "state": "done",
        "outputs": {"echoed": "from an event"},
        "error": None,
        "reason": None,
        "finished_at": full["finished_at"],
        "chain": [],
    }
    assert full["finished_at"].endswith("Z")

    timeline = inst.ok("logs", run_id).splitlines()
    assert "run started      default/hello v1" in timeline[0]
    assert any("action requested echo (#0, attempt 1)" in line for line in timeline)
    assert "run completed    in done" in timeline[-1]
    assert inst.ok("logs", run_id, "--follow").splitlines() == timeline

    records = [json.loads(line) for line in inst.ok("logs", run_id, "--json").splitlines()]
    assert [r["id"] for r in records] == [f"{run_id}:{n}" for n in range(1, len(timeline) + 1)]
    for record in records:
        assert record["specversion"] == "1.0"
        assert record["type"].startswith("io.interlock.")
        assert record["subject"] == run_id
    assert records[0]["data"]["trigger"]["id"] == "g1"
    assert records[-1]["type"] == "io.interlock.run.completed"

    # The run index is written by the orchestrator's relay, just after the log.
    inst.until_listed(run_id, status="completed")
    runs = {r["run_id"]: r for r in json.loads(inst.ok("runs", "--json"))}
    assert runs[run_id]["status"] == "completed"
    assert runs[run_id]["workflow"] == "hello"
    table = inst.ok("runs", "--workflow", "hello", "--status", "completed")
    assert run_id in table
    assert table.splitlines()[0].split()[:4] == ["RUN", "WORKFLOW", "STATUS", "STATE"]


def test_agents_lists_the_running_echo_worker(inst: CliInstallation) -> None:
    found = {a["name"]: a for a in json.loads(inst.ok("agents", "--json"))}
    assert "echo" in found
    workers = [w for w in found["echo"]["workers"] if w["name"] == "echo"]
    assert len(workers) == 1
    assert sorted(workers[0]["capabilities"]) == ["echo", "review"]
    table = inst.ok("agents")
    assert re.search(r"^echo\s+echo\s+1\b", table, re.MULTILINE)

    # The same shape from `get agent`; a heartbeat may land between the two reads.
    def steady(agent: dict[str, Any]) -> dict[str, Any]:
        workers = [{k: v for k, v in w.items() if k != "heartbeat_at"} for w in agent["workers"]]
        return {**agent, "workers": workers}

    assert steady(json.loads(inst.ok("get", "agent", "echo", "-o", "json"))) == steady(
        found["echo"]
    )


def test_agents_lists_a_worker_that_heartbeats_only_the_required_fields(
    inst: CliInstallation,
) -> None:
    """A worker of another language may leave out host and pid (docs/agents-any-language.md
    lists them as optional): agents shows "-" for them, where it printed None."""
    now = "2026-01-01T00:00:00.000Z"
    record = {
        "name": "raw-py",
        "instance": "raw-1",
        "capabilities": ["echo"],
        "concurrency": 1,
        "in_flight": 0,
        "started_at": now,
        "heartbeat_at": now,
    }

    async def heartbeat() -> None:
        nc = await connect(inst.url)
        try:
            subject = f"$KV.{inst.subjects.workers_bucket}.echo.raw-1"
            await nc.jetstream().publish(subject, json.dumps(record).encode())
        finally:
            await nc.close()

    asyncio.run(heartbeat())
    assert "worker raw-py/raw-1 pid=- capabilities=echo in_flight=0" in inst.ok("agents")
    shown = inst.ok("get", "agent", "echo", "-o", "table")
    assert "worker raw-py/raw-1 host=- pid=- in_flight=0 capabilities=echo" in shown, shown


def test_result_exit_codes_and_cancel(inst: CliInstallation) -> None:
    failing = inst.ok("start", "failing").strip()
    done = inst.cli("result", failing, "--wait", "--timeout", "20")
    assert done.returncode == 1
    assert f"run {failing} failed: schema_error:" in done.stderr

    parked = inst.ok("start", "parked").strip()
    done = inst.cli("result", parked)
    assert done.returncode == 3
    assert f"run {parked} is running (in state waiting)" in done.stderr
    done = inst.cli("result", parked, "--wait", "--timeout", "0.5")
    assert done.returncode == 3

    assert inst.ok("cancel", parked, "--reason", "changed my mind").strip() == (
        f"cancelled {parked}"
    )
    done = inst.cli("result", parked)
    assert done.returncode == 1
    assert "cancelled" in done.stderr
    again = inst.cli("cancel", parked)
    assert again.returncode == 1
    assert f"run {parked} is already cancelled" in again.stderr

    # A run that does not exist is an error at once, not a wait that never ends (a wait
    # for a result waits for the run to start too, within its --timeout: then the same).
    # Its own exit code (4), where a failed run is 1: for every command taking a run
    # (the commands run side by side: each is a process that mostly waits).
    commands = (
        ("result", "@"), ("result", "--wait", "--timeout", "1", "@"), ("logs", "@"),
        ("logs", "--follow", "@"),
        ("describe", "run", "@"), ("get", "run", "@"), ("export", "@"), ("cancel", "@"),
        ("signal", "@", "approval.granted"), ("explain", "@"), ("replay", "@"),
        ("fork", "@", "--at", "2"),
    )  # fmt: skip

    def missing(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        argv = [a.replace("@", "r-no-such-run") for a in args]
        return run_cli(*argv, env=inst.env)

    with ThreadPoolExecutor(4) as pool:
        for args, done in zip(commands, pool.map(missing, commands), strict=True):
            assert done.returncode == 4, args
            assert done.stderr == "interlock: no run 'r-no-such-run'\n", args


def test_an_emitted_event_reaches_a_parked_run(inst: CliInstallation) -> None:
    parked = inst.ok("start", "parked").strip()
    inst.ok(
        "emit", "approval.granted", "--source", "/people", "--id", f"ok-{parked}",
        "--ext", f"runid={parked}",
    )  # fmt: skip
    done = inst.cli("result", parked, "--wait", "--timeout", "20", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert "event received   approval.granted from /people" in inst.ok("logs", parked)


def test_starting_a_workflow_that_is_not_applied(inst: CliInstallation) -> None:
    done = inst.cli("start", "never-applied")
    assert done.returncode == 1
    assert "workflow default/never-applied is not applied" in done.stderr
    # A name alone is looked for in the default namespace: the message says how a
    # workflow of another namespace (a ctxmesh file's my-team) is named.
    assert "another namespace's: NAMESPACE/never-applied" in done.stderr
    named = inst.cli("start", "my-team/never-applied")
    assert named.returncode == 1
    assert named.stderr.strip().endswith(
        "workflow my-team/never-applied is not applied (interlock apply FILE)"
    )


def test_export_then_replay_the_file_without_a_server(
    inst: CliInstallation, tmp_path: Path
) -> None:
    run_id = json.loads(
        inst.ok("start", "hello", "--input", '{"message": "saved"}', "--wait", "--timeout", "20")
    )["run_id"]
    exported = inst.ok("export", run_id)
    (tmp_path / "run.jsonl").write_text(exported)
    done = inst.cli("export", run_id, "-o", str(tmp_path / "copy.jsonl"))
    assert done.returncode == 0
    assert (tmp_path / "copy.jsonl").read_text() == exported
    assert exported == inst.ok("logs", run_id, "--json")

    offline = cli_env(closed_port_url(), inst.prefix)
    replay = run_cli("replay", "--file", str(tmp_path / "run.jsonl"), env=offline)
    assert replay.returncode == 0, replay.stderr
    lines = replay.stdout.splitlines()
    assert len(lines) == 2 * len(exported.splitlines())  # each record, the state after it
    assert "run completed" in lines[-2]
    assert '"status":"completed"' in lines[-1]
    as_json = run_cli("replay", "--file", str(tmp_path / "run.jsonl"), "--json", env=offline)
    steps = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert steps[-1]["state"]["outputs"] == {"echoed": "saved"}

    (tmp_path / "junk.jsonl").write_text("this is not a run log\n")
    junk = run_cli("replay", "--file", str(tmp_path / "junk.jsonl"), env=offline)
    assert junk.returncode == 1
    assert "not a run log" in junk.stderr


def test_serve_against_an_unreachable_server_exits_2(inst: CliInstallation) -> None:
    process = inst.unreachable_serve
    process.proc.wait(TIMEOUT)
    url = process.argv[process.argv.index("--server") + 1]
    assert process.proc.returncode == 2, process.output
    assert f"cannot connect to NATS at {url}" in process.output
    assert "Traceback" not in process.output


# --- interlock dev -----------------------------------------------------------------------


def listening(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_dev(data_dir: Path, **env: str) -> tuple[Background, str]:
    dev = interlock_bg(
        "dev",
        "--port",
        "0",
        "--http-port",
        "0",
        "--metrics-port",
        str(free_port()),
        "--data-dir",
        str(data_dir),
        env=cli_env("", "il", **env),
        cwd=data_dir,
    )
    url = dev.wait_for(r"export INTERLOCK_URL=(\S+)", STARTUP_TIMEOUT).group(1)
    dev.wait_for("orchestrator running", STARTUP_TIMEOUT)
    return dev, url


def test_dev_runs_a_workflow_and_keeps_its_data(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (tmp_path / "hello.yaml").write_text(HELLO)
    context = str(tmp_path / "config" / "dev.json")
    dev, url = start_dev(data_dir, INTERLOCK_CONTEXT=context)
    operator = str(data_dir / "creds" / "operator.creds")
    try:
        # Authentication is on: without a credential (and nothing recorded where this
        # CLI looks) the CLI is refused, and told what to set.
        nowhere = str(tmp_path / "elsewhere" / "dev.json")
        refused = run_cli("runs", env=cli_env(url, "il", INTERLOCK_CONTEXT=nowhere), cwd=tmp_path)
        assert refused.returncode == 2
        assert "refused the credentials" in refused.stderr
        assert "export INTERLOCK_CREDS=FILE" in refused.stderr
        assert "Traceback" not in refused.stderr
        # What dev recorded: the CLI from another folder, with or without its URL.
        assert f"recorded in {context}" in dev.output
        for given in (url, ""):
            anywhere = run_cli(
                "runs", env=cli_env(given, "il", INTERLOCK_CONTEXT=context), cwd=tmp_path
            )
            assert anywhere.returncode == 0, anywhere.stderr
        # The README's Python client, run from that other folder too: Client.connect()
        # takes what dev recorded, as the CLI does (it was refused for want of creds).
        program = (
            "import asyncio\nfrom interlock import Client\n\n"
            "async def main():\n"
            "    async with await Client.connect() as client:\n"
            "        print(len(await client.runs()), 'runs')\n\n"
            "asyncio.run(main())\n"
        )
        ran = subprocess.run(
            [sys.executable, "-c", program],
            env=cli_env("", "il", INTERLOCK_CONTEXT=context),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "0 runs\n"
        # In dev's own folder (its data in ./.interlock), with no URL given: the port dev
        # took (0: any free one), not 4222, with the operator's creds it wrote there.
        here = tmp_path / "here"
        here.mkdir()
        (here / ".interlock").symlink_to(data_dir)
        inside = run_cli("runs", env=cli_env("", "il", INTERLOCK_CONTEXT=context), cwd=here)
        assert inside.returncode == 0, inside.stderr
        # creds issue there pushes the new account to that server too.
        issued = run_cli(
            *("creds", "issue", "publisher", "--events", "acme.>", "-o", "acme.creds"),
            env=cli_env("", "il", INTERLOCK_CONTEXT=context),
            cwd=here,
        )
        assert issued.returncode == 0, issued.stderr
        assert f"pushed to {url}" in issued.stdout
        env = cli_env(url, "il", INTERLOCK_CREDS=operator)
        applied = run_cli("apply", str(tmp_path / "hello.yaml"), env=env)
        assert applied.returncode == 0, applied.stderr
        done = run_cli(
            "start", "hello", "--input", '{"message": "dev"}', "--wait", "--timeout", "20", env=env
        )
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        # The orchestrator's and the reference agents' metrics, on this machine only.
        found = re.search(
            r"metrics of the orchestrator and the agents at (\S+) \(listening on (\S+)\)",
            dev.output,
        )
        assert found is not None, dev.output
        assert found.group(2) == "127.0.0.1"
        # Counted as the relay reads the run's log and as the agent settles its task, both
        # just after the run's end is written: scraped until they are.
        wanted = (
            'interlock_runs_completed_total{workflow="hello"} 1.0',
            'interlock_agent_tasks_total{capability="echo",error_class="",outcome=',
        )
        deadline = time.monotonic() + TIMEOUT
        while True:
            with urllib.request.urlopen(found.group(1), timeout=10) as page:
                text = page.read().decode()
            if all(line in text for line in wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for line in wanted:
            assert line in text, line
    finally:
        dev.signal(signal.SIGINT)
        code = dev.wait()
    assert code == 0, dev.output
    assert "stopped" in dev.output
    assert not listening(url), "the embedded nats-server outlived interlock dev"

    dev, url = start_dev(data_dir)
    try:
        # The keys and credentials were kept: the same operator credential still works.
        env = cli_env(url, "il", INTERLOCK_CREDS=operator)
        result = run_cli("result", run_id, env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"echoed": "dev"}
        assert "run completed" in run_cli("logs", run_id, env=env).stdout
    finally:
        dev.signal(signal.SIGINT)
        code = dev.wait()
    assert code == 0, dev.output
    assert not listening(url)


# --- dead letters --------------------------------------------------------------------------

STRICT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: strict
spec:
  inputs:
    ticket: {type: string, required: true}
    priority: {type: string, %s}
  triggers:
    - event: com.example.ticket
  initial_state: done
  states:
    done:
      type: terminal
      outputs: {ticket: "{{ inputs.ticket }}", priority: "{{ inputs.priority }}"}
"""


def test_a_dead_letter_is_listed_shown_and_redriven_once_the_cause_is_fixed(
    inst: CliInstallation,
) -> None:
    (inst.files / "strict.yaml").write_text(STRICT % "required: true")
    inst.ok("apply", "strict.yaml")
    # The event lacks a required input: no run starts, and the event is dead-lettered.
    inst.ok(
        "emit",
        "com.example.ticket",
        "--source",
        "/desk",
        "--id",
        "t1",
        "--data",
        '{"ticket": "T-1"}',
    )

    def letters() -> list[dict[str, Any]]:
        out = inst.ok("dead-letters", "list", "--reason", "invalid-inputs", "--json")
        return [json.loads(line) for line in out.splitlines()]

    async def lettered(client: Client) -> bool:
        found = await client.dead_letters("invalid-inputs")
        return any(d.headers.get("ce-id") == "t1" for d in found)

    inst.until(lettered, "the event t1 dead-lettered")
    [letter] = [d for d in letters() if d["headers"].get("ce-id") == "t1"]
    assert letter["reason"] == "invalid-inputs"
    assert letter["subject"] == inst.subjects.event("com.example.ticket")
    assert "priority" in letter["detail"]
    assert letter["data"] == {"ticket": "T-1"}
    table = inst.ok("dead-letters", "list")
    assert table.splitlines()[0].split() == ["SEQ", "TIME", "REASON", "FROM", "DETAIL"]
    assert str(letter["seq"]) in table
    shown = json.loads(inst.ok("dead-letters", "show", str(letter["seq"])))
    assert shown == letter

    # Naming neither sequences nor --all is a usage error.
    assert inst.cli("dead-letters", "redrive").returncode == 2

    # Fixed: the input gets a default. Redriven, the event starts its run this time.
    (inst.files / "strict.yaml").write_text(STRICT % "default: normal")
    inst.ok("apply", "strict.yaml")
    out = inst.ok("dead-letters", "redrive", str(letter["seq"]))
    assert out.strip() == (
        f"redrove {letter['seq']} (invalid-inputs) to {inst.subjects.event('com.example.ticket')}"
    )
    run_id = inst.run_id_of_trigger("strict", "/desk", "t1")
    assert json.loads(inst.ok("result", run_id, "--wait", "--timeout", "20")) == {
        "ticket": "T-1",
        "priority": "normal",
    }
    # The letter is gone.
    gone = inst.cli("dead-letters", "show", str(letter["seq"]))
    assert gone.returncode == 1
    assert f"no dead letter at sequence {letter['seq']}" in gone.stderr
    assert inst.cli("dead-letters", "redrive", str(letter["seq"])).returncode == 1


def test_dead_letters_are_discarded_by_sequence_reason_and_age(inst: CliInstallation) -> None:
    (inst.files / "strict.yaml").write_text(STRICT % "required: true")
    inst.ok("apply", "strict.yaml")
    for n in range(3):
        inst.ok(
            "emit", "com.example.ticket", "--source", "/discard", "--id", f"d{n}", "--data", "{}"
        )

    def mine() -> list[dict[str, Any]]:
        out = inst.ok("dead-letters", "list", "--reason", "invalid-inputs", "--json")
        found = [json.loads(line) for line in out.splitlines()]
        return [d for d in found if d["headers"].get("ce-source") == "/discard"]

    async def lettered(client: Client) -> bool:
        found = await client.dead_letters("invalid-inputs")
        return len([d for d in found if d.headers.get("ce-source") == "/discard"]) == 3

    inst.until(lettered, "the three events from /discard dead-lettered")
    found = mine()
    assert len(found) == 3
    first = found[0]["seq"]
    out = inst.ok("dead-letters", "discard", str(first))
    assert out.strip() == (
        f"discarded {first} (invalid-inputs) from {inst.subjects.event('com.example.ticket')}"
    )
    gone = inst.cli("dead-letters", "discard", str(first))
    assert gone.returncode == 1
    assert f"no dead letter at sequence {first}" in gone.stderr
    # Sequences or filters, and at least one of them.
    assert inst.cli("dead-letters", "discard").returncode == 2
    assert inst.cli("dead-letters", "discard", "1", "--reason", "x").returncode == 2
    assert inst.cli("dead-letters", "discard", "--older-than", "soon").returncode == 2
    # Not an hour old: kept.
    kept = inst.ok("dead-letters", "discard", "--reason", "invalid-inputs", "--older-than", "1h")
    assert kept.strip() == "no dead letters to discard"
    out = inst.ok("dead-letters", "discard", "--reason", "invalid-inputs", "--json")
    dropped = {json.loads(line)["seq"] for line in out.splitlines()}
    assert {d["seq"] for d in found[1:]} <= dropped
    assert mine() == []


GATE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: gate
spec:
  inputs:
    score: {type: integer, required: true}
  initial_state: check
  states:
    check:
      actions:
        - capability: echo
          input: {score: "{{ inputs.score }}"}
      on:
        - {event: task.completed, guard: "result.score >= 5", goto: passed}
        - {event: task.completed, goto: refused, set: {score: "{{ result.score }}"}}
    passed: {type: terminal, outputs: {passed: true}}
    refused:
      type: terminal
      fail: {message: "score {{ context.score }} is below 5"}
      outputs: {passed: false}
"""


def test_a_terminal_state_that_fails_ends_the_run_failed(inst: CliInstallation) -> None:
    (inst.files / "gate.yaml").write_text(GATE)
    inst.ok("apply", "gate.yaml")
    done = inst.cli("start", "gate", "--input", '{"score": 3}', "--wait", "--timeout", "20")
    assert done.returncode == 1, (done.stdout, done.stderr)
    started = json.loads(done.stdout)
    run_id = started["run_id"]
    expected = {
        "run_id": run_id,
        "status": "failed",
        "state": "refused",
        "outputs": {"passed": False},
        "error": {"class": "workflow_failed", "message": "score 3 is below 5"},
        "reason": None,
        "finished_at": started["finished_at"],
        "chain": [],
    }
    assert started == expected
    assert f"started {run_id}" in done.stderr
    assert json.loads(inst.cli("result", run_id, "--json").stdout) == expected
    # The run index is written by the relay just after the log.
    inst.until_listed(run_id, status="failed")
    assert run_id in inst.ok("runs", "--workflow", "gate", "--status", "failed")
    plain = inst.cli("result", run_id)
    assert (plain.returncode, json.loads(plain.stdout)) == (1, {"passed": False})
    assert "failed: workflow_failed: score 3 is below 5" in plain.stderr
    passed = json.loads(inst.ok("start", "gate", "--input", '{"score": 7}', "--wait"))
    assert (passed["status"], passed["outputs"]) == ("completed", {"passed": True})


def test_metrics_host_of_serve_and_agent_run(nats_url: str) -> None:
    env = cli_env(nats_url, "mh" + uuid.uuid4().hex[:8])
    for args in (("serve",), ("agent", "run", "echo")):
        port = free_port()
        process = interlock_bg(
            *args, "--metrics-host", "127.0.0.1", "--metrics-port", str(port), env=env
        )
        try:
            process.wait_for(rf"metrics and health on 127\.0\.0\.1:{port} ", STARTUP_TIMEOUT)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                assert page.status == 200
        finally:
            process.signal(signal.SIGINT)
            assert process.wait() == 0, process.output
