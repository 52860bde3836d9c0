"""The commands people reach for to look around, as typed in a shell: workflows, get,
describe, delete, --output, logs --tail/--since, runs --limit, signal outcomes, start --wait
without an orchestrator, completion, and agent run from the folder of the module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml as pyyaml

from interlock.cli.timeline import describe
from interlock.core import events as ev
from support.runtime import GATED, HELLO, REPO, Installation, cli_env, cli_installation, run_cli


@pytest.fixture(scope="module")
def inst(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    files = tmp_path_factory.mktemp("reads")
    manifests = {"hello.yaml": HELLO, "gated.yaml": GATED}
    with cli_installation(nats_url, files, manifests, tag="rd") as installation:
        installation.ok("apply", "echo.yaml", "hello.yaml", "gated.yaml")
        yield installation


def test_workflows_get_and_describe(inst: Installation) -> None:
    table = inst.ok("workflows").splitlines()
    assert table[0].split() == ["WORKFLOW", "VERSION", "TRIGGERS", "DESCRIPTION"]
    assert any(line.split()[:3] == ["default/hello", "1", "com.example.greet"] for line in table)
    listed = {w["name"]: w for w in json.loads(inst.ok("workflows", "-o", "json"))}
    assert listed["hello"]["description"] == "echo a message back"
    assert json.loads(inst.ok("workflows", "--json")) == list(listed.values())

    detail = pyyaml.safe_load(inst.ok("get", "workflow", "hello"))  # YAML by default
    assert (detail["version"], detail["versions"]) == (1, [1])
    assert detail["manifest"]["metadata"]["name"] == "hello"
    assert "inputs       message: string" in inst.ok("get", "workflow", "hello", "-o", "table")

    run_id = inst.ok("start", "gated").strip()
    got = json.loads(inst.ok("get", "run", run_id, "-o", "json"))
    assert (got["run_id"], got["status"], got["state"]) == (run_id, "running", "review")

    text = inst.ok("describe", "run", run_id)
    assert "status       running" in text
    assert "waits for" in text
    assert "approval.granted  event  data.score > 7  approved" in text
    assert "state-timeout" in text
    described = pyyaml.safe_load(inst.ok("describe", "run", run_id, "-o", "yaml"))
    assert described["waiting_for"] == [
        {
            "event": "approval.granted",
            "kind": "event",
            "goto": "approved",
            "guard": "data.score > 7",
        },
        {"event": "approval.denied", "kind": "event", "goto": "denied", "guard": None},
    ]
    assert [t["purpose"] for t in described["timers"]] == ["state-timeout"]

    missing = inst.cli("describe", "run", "r-no-such-run")
    assert missing.returncode == 4  # no such run
    assert "no run 'r-no-such-run'" in missing.stderr
    bad = inst.cli("get", "run", "a.b")
    assert bad.returncode == 2
    assert "invalid run id" in bad.stderr
    assert inst.cli("get", "agent", "nobody").returncode == 1
    assert json.loads(inst.ok("get", "agent", "echo", "-o", "json"))["name"] == "echo"


def test_signal_says_what_the_run_did(inst: Installation) -> None:
    run_id = inst.ok("start", "gated").strip()
    low = inst.cli("signal", run_id, "approval.granted", "--data", '{"score": 3}')
    assert low.returncode == 1
    assert f"run {run_id} took approval.granted in state review, but no guard was true" in (
        low.stderr
    )
    other = inst.cli("signal", run_id, "merge.done")
    assert other.returncode == 1
    assert (
        "which does not wait for merge.done (it waits for: approval.denied, approval.granted)"
        in other.stderr
    )
    told = json.loads(
        inst.ok("signal", run_id, "approval.granted", "--data", '{"score": 9}', "-o", "json")
    )
    assert (told["outcome"], told["state"], told["to_state"]) == ("moved", "review", "approved")
    done = inst.cli("signal", run_id, "approval.granted")
    assert done.returncode == 1
    assert "already completed" in done.stderr


def test_logs_tail_since_runs_limit_and_the_result_of_a_cancelled_run(inst: Installation) -> None:
    first = json.loads(inst.ok("start", "hello", "-i", '{"message": "one"}', "--wait"))
    assert first["status"] == "completed"
    run_id = first["run_id"]
    every = inst.ok("logs", run_id).splitlines()
    assert inst.ok("logs", run_id, "--tail", "2").splitlines() == every[-2:]
    assert inst.ok("logs", run_id, "--tail", "0") == ""
    assert inst.ok("logs", run_id, "--since", "1h").splitlines() == every
    assert inst.ok("logs", run_id, "--since", "2999-01-01T00:00:00Z") == ""
    assert inst.cli("logs", run_id, "--since", "yesterday").returncode == 2
    as_yaml = pyyaml.safe_load(inst.ok("logs", run_id, "-o", "yaml"))
    assert [r["type"] for r in as_yaml][-1] == "io.interlock.run.completed"
    lines = inst.ok("logs", run_id, "--output", "json").splitlines()
    assert json.loads(lines[0])["type"] == "io.interlock.run.started"

    gated = inst.ok("start", "gated").strip()
    assert inst.ok("cancel", gated, "--reason", "not today").strip() == f"cancelled {gated}"
    result = inst.cli("result", gated, "--json")
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert (body["status"], body["reason"]) == ("cancelled", "not today")
    plain = inst.cli("result", gated)
    assert f"run {gated} cancelled: not today" in plain.stderr

    exported = inst.files / "cancelled.jsonl"
    inst.ok("export", gated, "-o", str(exported))
    replay = inst.cli("replay", "--file", str(exported))
    assert replay.returncode == 0, replay.stderr  # 1 is only for "not a run log"
    assert "run cancelled    not today" in replay.stdout

    inst.until_listed(gated, status="cancelled")  # written by the relay just after the log
    newest = json.loads(inst.ok("runs", "--limit", "1", "-o", "json"))
    assert [r["run_id"] for r in newest] == [gated]
    assert len(json.loads(inst.ok("runs", "-o", "json"))) >= 2

    # What a running run waits for, and only those waiting for something.
    waiting = inst.ok("start", "gated").strip()
    inst.until_listed(waiting, waiting="approval")
    found = json.loads(inst.ok("runs", "--waiting", "approval", "-o", "json"))
    assert waiting in [r["run_id"] for r in found]
    assert all(r["status"] == "running" for r in found)
    mine = next(r for r in found if r["run_id"] == waiting)
    assert mine["waiting"] == [
        {"kind": "approval", "name": "approval.granted"},
        {"kind": "approval", "name": "approval.denied"},
        {"kind": "timer", "name": "expired"},
    ]
    assert "approval approval.granted, approval.denied; timer to expired" in inst.ok("runs")
    assert waiting not in inst.ok("runs", "--waiting", "agent")
    inst.ok("cancel", waiting)


def test_delete_workflow_keeps_runs_in_flight(inst: Installation) -> None:
    (inst.files / "doomed.yaml").write_text(GATED.replace("name: gated", "name: doomed"))
    inst.ok("apply", "doomed.yaml")
    in_flight = inst.ok("start", "doomed").strip()
    out = inst.ok("delete", "workflow", "doomed")
    assert out.startswith("deleted workflow doomed (version 1)")
    refused = inst.cli("start", "doomed")
    assert refused.returncode == 1
    assert "is not applied" in refused.stderr
    assert "doomed" not in inst.ok("workflows")
    moved = inst.ok("signal", in_flight, "approval.granted", "--data", '{"score": 8}')
    assert "moved" in moved
    assert inst.cli("delete", "workflow", "doomed").returncode == 1
    inst.ok("apply", "doomed.yaml")
    assert inst.ok("start", "doomed").strip()


def test_start_wait_without_an_orchestrator_says_so(nats_url: str, tmp_path: Path) -> None:
    env = cli_env(nats_url, f"no{uuid.uuid4().hex[:10]}")
    (tmp_path / "gated.yaml").write_text(GATED)
    assert run_cli("apply", "gated.yaml", env=env, cwd=tmp_path).returncode == 0
    done = run_cli("start", "gated", "--wait", "--timeout", "3", env=env, cwd=tmp_path)
    assert done.returncode == 3
    lines = done.stderr.splitlines()
    assert lines[0].startswith("started r")
    assert any("no orchestrator is taking runs" in line for line in lines), done.stderr
    assert json.loads(done.stdout)["status"] == "running"


def test_read_commands_provision_nothing(nats_url: str, tmp_path: Path) -> None:
    env = cli_env(nats_url, f"ro{uuid.uuid4().hex[:10]}")
    assert run_cli("runs", env=env).stdout.strip() == "no runs"
    assert run_cli("workflows", "-o", "json", env=env).stdout.strip() == "[]"
    assert run_cli("agents", "-o", "json", env=env).stdout.strip() == "[]"
    assert run_cli("dead-letters", "list", env=env).stdout.strip() == "no dead letters"
    missing = run_cli("describe", "run", "r1", env=env)
    assert (missing.returncode, "no run 'r1'" in missing.stderr) == (4, True)
    streams = run_cli("apply", "--help", env=env)  # and nothing was created meanwhile:
    assert streams.returncode == 0
    import asyncio

    import nats

    async def stream_names() -> list[str]:
        nc = await nats.connect(nats_url)
        try:
            return [s.config.name or "" for s in await nc.jetstream().streams_info()]
        finally:
            await nc.close()

    prefix = env["INTERLOCK_PREFIX"].upper()
    assert [n for n in asyncio.run(stream_names()) if prefix in n] == []


def test_completion_scripts(tmp_path: Path) -> None:
    script = run_cli("completion", "bash", env=cli_env("nats://127.0.0.1:1", "x")).stdout
    (tmp_path / "interlock.bash").write_text(script)
    probe = textwrap.dedent(
        """\
        source ./interlock.bash
        COMP_WORDS=(interlock descr); COMP_CWORD=1; _shtab_interlock; echo "${COMPREPLY[@]}"
        COMP_WORDS=(interlock get ""); COMP_CWORD=2; _shtab_interlock; echo "${COMPREPLY[@]}"
        COMP_WORDS=(interlock runs --li); COMP_CWORD=2; _shtab_interlock; echo "${COMPREPLY[@]}"
        """
    )
    ran = subprocess.run(
        ["bash", "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    described, kinds, limit = ran.stdout.splitlines()
    assert described.split() == ["describe"]
    assert sorted(kinds.split()) == ["agent", "run", "workflow"]
    assert limit.split() == ["--limit"]
    zsh = run_cli("completion", "zsh", env=cli_env("nats://127.0.0.1:1", "x")).stdout
    assert zsh.startswith("#compdef interlock")
    assert "describe" in zsh


def test_agent_run_finds_the_module_in_the_current_folder(tmp_path: Path) -> None:
    (tmp_path / "my_agents.py").write_text(
        "from interlock.sdk import Worker\nworker = Worker('mine')\n"
    )
    env = cli_env("nats://127.0.0.1:1", "x", INTERLOCK_METRICS_PORT="0")
    env.pop("PYTHONPATH", None)
    done = run_cli("agent", "run", "my_agents:worker", env=env, cwd=tmp_path)
    # It got as far as connecting (nothing listens there), so the module was found.
    assert "cannot import" not in done.stderr, done.stderr
    assert "cannot connect to NATS at nats://127.0.0.1:1" in done.stderr
    assert done.returncode == 2


def test_agent_run_of_what_is_no_worker_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "my_agents.py").write_text(
        "import msgspec\n\nclass ReviewIn(msgspec.Struct):\n    diff: str\n\n"
        "def count() -> int:\n    return 3\n"
    )
    env = cli_env("nats://127.0.0.1:1", "x", INTERLOCK_METRICS_PORT="0")
    env.pop("PYTHONPATH", None)
    for target, said in (
        ("my_agents:ReviewIn", "is not an interlock.sdk.Worker, and called with no arguments"),
        ("my_agents:count", "is an int, not an interlock.sdk.Worker"),
        ("my_agents:msgspec", "is a module, not an interlock.sdk.Worker"),
    ):
        done = run_cli("agent", "run", target, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"interlock: '{target}' {said}"), done.stderr
        assert done.stderr.endswith(
            ": name the Worker (module:worker) or a function of no arguments returning one\n"
        )
        assert "Traceback" not in done.stderr


def test_the_timeline_names_map_items_and_map_records() -> None:
    common = {"specversion": "1.0", "source": "s", "subject": "r1", "time": "t"}
    started = ev.MapStarted(
        id="r1:5",
        datacontenttype="application/json",
        data=ev.MapStartedData(state="count", items=[1, 2, 3], parallelism=2),
        **common,
    )
    item = ev.ActionCompleted(
        id="r1:9",
        datacontenttype="application/json",
        data=ev.ActionCompletedData(action_id="r1:7", state="count", index=0, item=2, result=3),
        **common,
    )
    done = ev.MapCompleted(
        id="r1:12",
        datacontenttype="application/json",
        data=ev.MapCompletedData(state="count", result=[1, 2, 3]),
        **common,
    )
    assert "map started      count over 3 items (parallelism 2, completion all)" in (
        describe(started)
    )
    assert "action completed count#2 result=3" in describe(item)
    assert "map completed    count result=[1,2,3]" in describe(done)


def test_the_broken_example_of_the_cli_docs_says_what_the_docs_say() -> None:
    done = run_cli(
        "validate", "examples/invalid/broken.yaml", env=cli_env("nats://127.0.0.1:1", "x"), cwd=REPO
    )
    assert done.returncode == 1
    doc = (REPO / "docs" / "cli.md").read_text()
    shown = doc.split("$ interlock validate examples/invalid/broken.yaml\n", 1)[1]
    assert shown.split("```", 1)[0] == done.stderr


def test_the_command_table_matches_the_command_modules() -> None:
    """``interlock --help`` lists the commands from main.COMMANDS without importing their
    modules: the table must say what the modules declare."""
    import argparse
    import importlib

    main = importlib.import_module("interlock.cli.main")  # (interlock.cli.main is the function)
    for index, (module, adder) in enumerate(main.ADDERS):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        getattr(importlib.import_module(f"interlock.cli.{module}"), adder)(sub)
        declared = {a.dest: a.help for a in sub._choices_actions}
        tabled = {name: text for name, (i, text) in main.COMMANDS.items() if i == index}
        assert declared == tabled, f"main.COMMANDS is out of step with {module}.{adder}"
    full = main.build_parser()
    [commands] = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(commands.choices) == [*main.COMMANDS, "completion"]


def test_help_imports_no_command_module() -> None:
    probe = (
        "import sys\n"
        "from interlock.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('nats', 'nkeys', 'nacl', 'msgspec', 'celpy', 'yaml',"
        " 'interlock.cli.runtime_cmds', 'interlock.core.compiler', 'interlock.dialects')"
        " if m in sys.modules]\n"
        "print(heavy, file=sys.stderr)\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert ran.stderr.strip().splitlines()[-1] == "[]", ran.stderr
    assert "describe    everything about one run now" in ran.stdout


def test_the_dialect_names_of_the_cli_are_the_dialects() -> None:
    from interlock.cli.dialect_cmds import DIALECTS as NAMED
    from interlock.dialects import DIALECTS

    assert tuple(NAMED) == tuple(DIALECTS)


READ_PROBE = """\
import json, sys
from nats.js import JetStreamContext
from nats.js.manager import JetStreamManager

writes = []
def record(name, real):
    async def call(self, *args, **kwargs):
        writes.append(name)
        return await real(self, *args, **kwargs)
    return call
for cls, name in ((JetStreamManager, "add_stream"), (JetStreamManager, "update_stream"),
                  (JetStreamManager, "delete_stream"), (JetStreamContext, "create_key_value")):
    setattr(cls, name, record(name, getattr(cls, name)))

from interlock.cli.main import main
code = main(sys.argv[1:])
heavy = ("interlock.core.compiler", "interlock.core.engine", "interlock.core.expr",
         "interlock.core.definition", "interlock.core.analysis", "interlock.dialects",
         "interlock.runtime.flow", "interlock.runtime.replaying", "jsonschema", "celpy",
         "yaml", "interlock.auth.keys", "interlock.auth.jwt", "interlock.auth.roles", "nkeys",
         "nacl", "cloudevents", "opentelemetry", "prometheus_client", "interlock.client.emitting",
         "interlock.client.signalling", "interlock.client.debugging")
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules],
                  "writes": writes}), file=sys.stderr)
"""


def test_read_commands_load_no_compiler_and_provision_nothing(inst: Installation) -> None:
    """What keeps ``interlock runs`` and the other reads fast: they import neither the
    compiler, the expression language, the engine nor the dialects, nor (connecting
    without credentials) the key handling (nkeys, PyNaCl), and they create or change no
    stream or bucket (only ``apply`` and ``serve`` provision). ``describe run`` and ``get
    workflow`` read the outline stored beside the manifest instead of compiling it."""
    run_id = inst.ok("start", "gated").strip()
    for command in (
        ["runs"],
        ["runs", "-o", "json"],
        ["workflows"],
        ["get", "run", run_id],
        ["get", "agent", "echo", "-o", "json"],
        ["result", run_id],
        ["logs", run_id],
        ["agents"],
        ["dead-letters", "list"],
        ["describe", "run", run_id],
        ["describe", "run", run_id, "-o", "json"],
        ["get", "workflow", "gated", "-o", "json"],
        ["get", "workflow", "gated", "-o", "table"],
    ):
        ran = subprocess.run(
            [sys.executable, "-c", READ_PROBE, *command],
            env=inst.env,
            cwd=inst.files,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        probe = json.loads(ran.stderr.strip().splitlines()[-1])
        assert probe["code"] in (0, 3), (command, ran.stderr)  # 3: `result` of a running run
        assert probe["heavy"] == [], (command, probe)
        assert probe["writes"] == [], (command, probe)


def test_a_version_stored_without_an_outline_is_described_alike(inst: Installation) -> None:
    """Versions stored before outlines were (the manifest alone) are compiled to describe
    them: ``get workflow`` and ``describe run`` answer as for a version applied now."""
    import asyncio

    import nats

    from interlock.core.compiler import compile_sources

    legacy = GATED.replace("name: gated", "name: legacy")
    [definition] = compile_sources([("legacy.yaml", legacy)]).workflows

    async def store_as_before() -> None:
        nc = await nats.connect(inst.url)
        try:
            kv = await nc.jetstream().key_value(inst.subjects.workflows_bucket)
            body = {
                "version": 1,
                "spec_hash": definition.spec_hash,
                "manifest": dict(definition.manifest),
            }
            await kv.create("wf.default.legacy.1", json.dumps(body).encode())
            pointer = {"version": 1, "spec_hash": definition.spec_hash}
            await kv.create("latest.default.legacy", json.dumps(pointer).encode())
        finally:
            await nc.close()

    asyncio.run(store_as_before())
    old = json.loads(inst.ok("get", "workflow", "legacy", "-o", "json"))
    new = json.loads(inst.ok("get", "workflow", "gated", "-o", "json"))
    # A version stored before sources were kept has none.
    assert old["source"] is None
    assert new["source"].startswith("apiVersion: interlock.io/v1")
    for key in ("name", "spec_hash", "manifest", "source"):
        del old[key], new[key]
    assert old == new
    assert new["kinds"]["review"] == "human_in_the_loop"

    waits = []
    for name in ("legacy", "gated"):
        run_id = inst.ok("start", name).strip()
        described = json.loads(inst.ok("describe", "run", run_id, "-o", "json"))
        assert described["state"] == "review"
        waits.append(described["waiting_for"])
        # Ended: a running run of a version without an outline is one that the module's
        # other reads (`interlock runs`) would have to compile to say what it waits for.
        inst.ok("cancel", run_id)
    assert waits[0] == waits[1]
    assert [w["event"] for w in waits[0]] == ["approval.granted", "approval.denied"]


def test_read_commands_ask_the_jetstream_api_only_for_what_they_read(
    nats_url: str, tmp_path: Path
) -> None:
    """Every JetStream API request a read command makes, as the server sees it (a
    subscription on ``$JS.API.>`` beside the command): it reads the streams and buckets it
    shows and nothing else, checks no other stream or bucket, creates or changes none, and
    makes a handful of requests, not one per stream."""
    import asyncio

    import nats

    prefix = f"rq{uuid.uuid4().hex[:10]}"
    env = cli_env(nats_url, prefix)
    (tmp_path / "gated.yaml").write_text(GATED)
    assert run_cli("apply", "gated.yaml", env=env, cwd=tmp_path).returncode == 0
    run_id = run_cli("start", "gated", env=env, cwd=tmp_path).stdout.strip()

    async def requests_of(*args: str) -> list[str]:
        """``$JS.API.<kind> <stream>`` of each request ``interlock ARGS`` made (all of this
        prefix's come from it: no orchestrator runs here)."""
        nc = await nats.connect(nats_url)
        seen: list[str] = []

        async def keep(msg: Any) -> None:
            seen.append(msg.subject)

        try:
            await nc.subscribe("$JS.API.>", cb=keep)
            await nc.flush()
            done = await asyncio.to_thread(run_cli, *args, env=env, cwd=tmp_path)
            assert done.returncode in (0, 3), (args, done.stderr)  # 3: a running run's result
            await nc.flush()  # what the server routed to us before the command ended
        finally:
            await nc.close()
        ours = []
        for subject in seen:
            words = subject.removeprefix("$JS.API.").split(".")
            streams = [w for w in words if prefix in w.lower()]
            if streams:
                kind = ".".join(w for w in words[:2] if w not in streams)
                ours.append(f"{kind} {streams[0].lower().replace(prefix, 'P')}")
            elif len(words) <= 2:  # an account-wide request ($JS.API.INFO, STREAM.NAMES)
                ours.append(".".join(words))
        return sorted(ours)

    async def every() -> dict[str, list[str]]:
        return {
            "runs": await requests_of("runs"),
            "workflows": await requests_of("workflows"),
            "get run": await requests_of("get", "run", run_id),
            "logs": await requests_of("logs", run_id),
            "result": await requests_of("result", run_id),
            "describe run": await requests_of("describe", "run", run_id),
            "get workflow": await requests_of("get", "workflow", "gated", "-o", "json"),
        }

    made = asyncio.run(every())
    # The bucket handle's STREAM.INFO (nats-py's key_value), a bucket read whole by
    # batched direct gets up to its newest record, a run's log and a version by direct
    # gets; the run list a page of the run index by direct gets (the stream's last
    # sequence first: the empty index here needs no read). No consumer: one left per read
    # would fill the stream's 1,000.
    assert made == {
        # And how far behind the logs the index is: the relays' consumers, one a partition
        # of the partition map (read by a direct get).
        "runs": ["CONSUMER.INFO P_runs", "DIRECT.GET kv_P_partitions", "STREAM.INFO kv_P_runs"],
        # Whether each workflow is paused: the pauses bucket read whole from its stream's
        # info, which holds its newest revision (empty here: no get, and no bucket handle).
        # The workflows: the records after the last look (here, all) by batched direct
        # gets until there are no more, with no look at the newest revision first.
        "workflows": [
            "DIRECT.GET kv_P_workflows",
            "STREAM.INFO kv_P_paused",
            "STREAM.INFO kv_P_workflows",
        ],
        # A log read checks each record's MAC: the log key is one direct get of its key.
        # Which stream holds the log: the partition map, one direct get of its key.
        # A run's state is read from its snapshot where there is one (here none).
        "get run": [
            "DIRECT.GET P_runs",
            "DIRECT.GET kv_P_partitions",
            "DIRECT.GET kv_P_secrets",
            "DIRECT.GET kv_P_snapshots",
        ],
        "logs": ["DIRECT.GET P_runs", "DIRECT.GET kv_P_partitions", "DIRECT.GET kv_P_secrets"],
        "result": [
            "DIRECT.GET P_runs",
            "DIRECT.GET kv_P_partitions",
            "DIRECT.GET kv_P_secrets",
            "DIRECT.GET kv_P_snapshots",
        ],
        "describe run": [
            "DIRECT.GET P_runs",
            "DIRECT.GET kv_P_partitions",
            "DIRECT.GET kv_P_secrets",
            "DIRECT.GET kv_P_snapshots",
            "DIRECT.GET kv_P_workflows",
            "STREAM.INFO kv_P_workflows",
        ],
        # Whether it is paused: one direct get of its key in the pauses bucket.
        "get workflow": [
            "DIRECT.GET kv_P_paused",
            "DIRECT.GET kv_P_workflows",
            "DIRECT.GET kv_P_workflows",
            "DIRECT.GET kv_P_workflows",
            "STREAM.INFO kv_P_workflows",
        ],
    }
