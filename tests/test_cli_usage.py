"""A wrong flag prints the usage of the command it was given to, not the top-level one."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

INTERLOCK = str(Path(sys.executable).with_name("interlock"))


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["runs", "--frobnicate"], "usage: interlock runs "),
        (["result", "r1", "--frobnicate"], "usage: interlock result "),
        (["dead-letters", "list", "--frobnicate"], "usage: interlock dead-letters list "),
        (
            ["creds", "issue", "publisher", "-o", "x", "--frobnicate"],
            "usage: interlock creds issue ",
        ),
        (["validate", "x.yaml", "--frobnicate"], "usage: interlock validate "),
    ],
)
def test_a_wrong_flag_prints_the_commands_usage(argv: list[str], usage: str) -> None:
    done = subprocess.run([INTERLOCK, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    assert done.stderr.rstrip().endswith("error: unrecognized arguments: --frobnicate")
    assert done.stdout == ""


@pytest.mark.parametrize("waiting", ["aproval", "agent:", "slots:default/x"])
def test_runs_waiting_for_no_kind_is_a_usage_error(waiting: str) -> None:
    """A kind misspelled listed no runs, as if none waited: it is refused before anything
    connects (no server runs here), naming the kinds."""
    done = subprocess.run(
        [INTERLOCK, "runs", "--waiting", waiting, "--server", "nats://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: interlock runs "), done.stderr
    assert done.stderr.rstrip().endswith(
        f"error: argument --waiting: {waiting!r}: give KIND or KIND:NAME, KIND one of "
        "approval, event, agent, workflow, timer, slot"
    )


@pytest.mark.parametrize("kind", [["workflow", "w"], ["run", "r1"], ["capability", "c"]])
def test_a_pause_reason_past_its_bound_is_a_usage_error(kind: list[str]) -> None:
    """A reason is kept with the pause and recorded in each run it holds: past 1,024
    characters (as over HTTP) it is refused before anything connects."""
    done = subprocess.run(
        [INTERLOCK, "pause", *kind, "--reason", "r" * 1025, "--server", "nats://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: interlock pause {kind[0]} "), done.stderr
    assert done.stderr.rstrip().endswith(
        "error: argument --reason: a reason is at most 1,024 characters; this one is 1,025"
    )


def test_a_server_that_does_not_answer_names_the_one_dev_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`interlock dev` took another port than the one asked for: the failure says where it is."""
    from interlock.auth.dev import record_context
    from interlock.cli.connecting import _credential_hint

    monkeypatch.setenv("INTERLOCK_CONTEXT", str(tmp_path / "dev.json"))
    creds = tmp_path / ".interlock" / "creds" / "operator.creds"
    creds.parent.mkdir(parents=True)
    creds.write_text("x")
    record_context("nats://127.0.0.1:40407", creds, tmp_path / ".interlock")
    failed = "cannot connect to NATS at nats://127.0.0.1:4222 (gave up after 5 s): refused"
    hint = _credential_hint(failed)
    assert "the last `interlock dev` serves nats://127.0.0.1:40407" in hint
    assert "export INTERLOCK_URL=nats://127.0.0.1:40407" in hint
    there = "cannot connect to NATS at nats://127.0.0.1:40407 (gave up after 5 s): refused"
    assert _credential_hint(there) == ""  # dev's own server did not answer: nothing to add


@pytest.mark.parametrize("where", ["before", "after"])
def test_connection_flags_are_taken_before_the_command_too(
    nats_url: str, tmp_path: Path, where: str
) -> None:
    """`interlock --server URL runs`, as the nats CLI and kubectl take theirs, is the same
    command as `interlock runs --server URL` (it said `invalid choice: 'nats://...'`)."""
    flags = ["--server", nats_url, f"--prefix={uuid.uuid4().hex[:8]}"]
    argv = [*flags, "runs", "--json"] if where == "before" else ["runs", "--json", *flags]
    done = subprocess.run(
        [INTERLOCK, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize("command", [["serve"], ["dev"], ["gateway"], ["agent", "run", "echo"]])
def test_a_log_level_no_process_knows_is_a_usage_error(command: list[str]) -> None:
    """`--log-level verbose` logged at info, as if it were right: it is refused, naming
    the levels docs/cli.md lists, before anything starts."""
    done = subprocess.run(
        [INTERLOCK, *command, "--log-level", "verbose"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith(
        "argument --log-level: invalid choice: 'verbose' "
        "(choose from 'debug', 'info', 'warning', 'error')"
    ), done.stderr


@pytest.mark.parametrize(("flag", "env"), [(["--partitions", "0"], {}), ([], {"P": "0"})])
def test_serve_refuses_zero_partitions_before_it_connects(
    flag: list[str], env: dict[str, str]
) -> None:
    """0 partitions was taken for 'not given' and the orchestrator started on whatever the
    installation had; it is out of range (no server runs here: refused before connecting)."""
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    environ.update(INTERLOCK_URL="nats://127.0.0.1:1")
    if env:
        environ["INTERLOCK_PARTITIONS"] = env["P"]
    done = subprocess.run(
        [INTERLOCK, "serve", "--no-metrics", *flag],
        capture_output=True, text=True, timeout=60, env=environ, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == "interlock: --partitions must be from 1 to 256, got 0\n"
