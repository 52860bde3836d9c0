"""Text an agent wrote, printed by the CLI on an operator's terminal, is shown and not
obeyed: a dead letter whose reason and detail carry escape sequences (retitle the window,
clear the screen) lists with each control character as ``\\xNN``.
The same listing piped as JSON keeps the agent's text as it was, escaped by JSON. An
export (JSON lines) on a terminal has DEL and C1 as JSON escapes, the same values."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess

from interlock.cli.terminal import shown, shown_json
from interlock.transport.subjects import Subjects
from support.hostile import ECHO_FLOW, DeadLetters, cli_env, run_cli, running_stack

REASON = "bad\x1b]0;pwned\x07input"
DETAIL = "all fine\x1b[2J\x1b[Hnothing to see"


def _on_a_terminal(*args: str, env: dict[str, str]) -> tuple[int, str]:
    """``interlock ARGS`` with its standard output and error on a pseudo-terminal."""
    from support.runtime import INTERLOCK

    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [INTERLOCK, *args], env=env, stdout=follower, stderr=follower, timeout=30
        )
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
        return done.returncode, b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


async def test_an_agents_escape_sequences_are_shown_not_obeyed(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW]) as stack:
        async with DeadLetters(stack.js, subjects) as letters:
            await stack.js.publish(
                subjects.agent_dead_letter("echo", "bad_input"),
                b"{}",
                headers={
                    "Interlock-Dead-Letter-Reason": REASON,
                    "Interlock-Dead-Letter-Detail": DETAIL,
                    "Interlock-Dead-Letter-Subject": subjects.capability("echo"),
                },
            )
            await letters.next()
        env = cli_env(nats_url, subjects.prefix)
        code, out = await asyncio.to_thread(_on_a_terminal, "dead-letters", "list", env=env)
        assert code == 0, out
        assert "bad\\x1b]0;pwned\\x07input" in out
        assert "all fine\\x1b[2J\\x1b[Hnothing to see" in out
        assert not any(c in out for c in "\x1b\x07\u009b"), repr(out)

        piped = await asyncio.to_thread(run_cli, "dead-letters", "list", "--json", env=env)
        assert piped.returncode == 0, piped.stderr
        [row] = [json.loads(line) for line in piped.stdout.splitlines()]
        assert (row["reason"], row["detail"]) == (REASON, DETAIL)


def test_control_characters_are_shown_but_tabs_and_newlines() -> None:
    assert shown("a\tb\nc") == "a\tb\nc"
    assert shown("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert shown("\r\x00\x7f\u009b\u0085") == "\\x0d\\x00\\x7f\\x9b\\x85"
    assert shown("é ✓ 日本") == "é ✓ 日本"


def test_json_on_a_terminal_escapes_what_the_encoder_leaves_raw() -> None:
    text = json.dumps({"a": "x\u009b2J\u0085\u007f é"}, ensure_ascii=False)
    assert "\u009b" in text  # the encoder left it raw
    escaped = shown_json(text)
    assert not any(c in escaped for c in "\u009b\u0085\u007f")
    assert json.loads(escaped) == json.loads(text)
    assert "é" in escaped


async def test_an_export_on_a_terminal_is_the_same_json_with_nothing_obeyed(
    nats_url: str, subjects: Subjects
) -> None:
    # A run's log carries what its callers sent: here a cancel reason with a C1 CSI
    # (clear the screen) and a C1 OSC (retitle the window). No agent runs: it waits.
    reason = "stop\u009b2J\u009d0;pwned\u0007now"
    async with running_stack(nats_url, subjects, [ECHO_FLOW], worker=False) as stack:
        run_id = await stack.client.start("bystander", {})
        assert await stack.client.cancel(run_id, reason=reason)
        env = cli_env(nats_url, subjects.prefix)
        code, out = await asyncio.to_thread(_on_a_terminal, "export", run_id, env=env)
        piped = await asyncio.to_thread(run_cli, "export", run_id, env=env)
    assert code == 0, out
    assert not any(c in out for c in "\u009b\u009d\u0007\x1b"), repr(out)
    shown_lines = [json.loads(line) for line in out.replace("\r\n", "\n").splitlines()]
    assert piped.returncode == 0, piped.stderr
    assert "\u009b" in piped.stdout  # a pipe gets the log's own bytes
    assert shown_lines == [json.loads(line) for line in piped.stdout.splitlines()]
    assert reason in {r["data"].get("reason") for r in shown_lines}
