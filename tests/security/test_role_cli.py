"""Every CLI command as each role runs it with its own credential (issued by
`interlock creds issue`): it does what the role may, or exits 5 at once with one line
naming the permission it lacks; never a traceback, never a request left to time out.
A publisher's `emit` publishes and reports "sent"."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from interlock.core import events as ev
from support.auth import Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
EXIT_DENIED = 5

ROLES = {
    "publisher": ["--events", "acme.>"],
    "agent": ["--capability", "held"],
    "gateway": [],
}


async def cli(secured: Secured, creds: Path | None, *args: str) -> tuple[int, str, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_URL"] = secured.url
    if creds is not None:
        env["INTERLOCK_CREDS"] = str(creds)
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK,
        *args,
        cwd=secured.data,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, errs = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), errs.decode(), time.monotonic() - began


async def issued(secured: Secured, role: str) -> Path:
    path = secured.data / f"cli-{role}.creds"
    if not path.exists():
        code, _, errs, _ = await cli(
            secured,
            None,
            "creds", "issue", role, *ROLES[role], "--name", f"cli-{role}",
            "-o", str(path), "--keys", str(secured.data / "keys"),
        )  # fmt: skip
        assert code == 0, errs
    return path


async def waiting_run(secured: Secured) -> str:
    run_id = await secured.operator.start("guarded", {})
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.ActionRequested):
            return run_id
    raise AssertionError("the run never requested its action")


def commands(run_id: str, manifest: Path) -> list[list[str]]:
    return [
        ["emit", "acme.order.placed", "--source", "https://acme.example", "--data", "{}"],
        ["emit", "acme.order.placed", "--source", "https://acme.example", "--wait", "0"],
        ["runs"],
        ["workflows"],
        ["agents"],
        ["get", "workflow", "guarded"],
        ["get", "run", run_id],
        ["describe", "run", run_id],
        ["result", run_id],
        ["logs", run_id],
        ["export", run_id],
        ["dead-letters", "list"],
        ["dead-letters", "discard", "--reason", "bad-json", "--older-than", "1d"],
        ["start", "awaiting"],
        ["signal", run_id, "acme.order.nudged"],
        ["apply", str(manifest)],
        ["cancel", run_id],
    ]


@pytest.mark.parametrize("role", sorted(ROLES))
async def test_each_command_does_its_part_or_names_the_permission(
    secured: Secured, role: str
) -> None:
    creds = await issued(secured, role)
    run_id = await waiting_run(secured)
    manifest = secured.data / "agentdef.yaml"
    manifest.write_text(
        "apiVersion: interlock.io/v1\nkind: AgentDef\nmetadata: {name: extra}\n"
        "spec:\n  capabilities:\n    - {name: extra, input_schema: {type: object}}\n"
    )
    todo = commands(run_id, manifest)
    few = asyncio.Semaphore(3)  # two cores

    async def run(args: list[str]) -> tuple[int, str, str, float]:
        async with few:
            return await cli(secured, creds, *args)

    done = await asyncio.gather(*(run(args) for args in todo))
    denied = 0
    for args, (code, out, errs, took) in zip(todo, done, strict=True):
        what = f"{role}: interlock {' '.join(args)} -> {code}\n{out}{errs}"
        assert "Traceback" not in errs, what
        # A refusal ends the command at once, where a refused request waited its 5 s
        # timeout and a traceback followed: bounded here, loosely, for a busy machine.
        assert took < 30, what
        if code == EXIT_DENIED:
            denied += 1
            lines = errs.strip().splitlines()
            assert len(lines) == 1, what
            assert lines[0].startswith("interlock: permission denied: this credential may not "), (
                what
            )
            if " to " in lines[0]:  # a subject refused, as the server sent it (case and all)
                subject = lines[0].split(" to ", 1)[1].split(" ", 1)[0]
                assert subject.startswith(("$JS.API.", "$KV.", "il.")), what
            # Whose credential it is, when its role is what refuses it.
            if role in ("publisher", "agent"):
                article = "an" if role == "agent" else "a"
                assert f"({creds} is {article} {role}'s credential: it " in lines[0], what
        else:
            assert code in (0, 1, 3), what  # 3: `result` of a run still going
            assert "permission" not in errs.lower(), what
    if role == "publisher":
        for (code, out, errs, _), args in zip(done[:2], todo[:2], strict=True):
            assert code == 0, (args, errs)
            assert out.startswith("sent acme.order.placed id="), out
            # Said once, plainly: nothing a publisher can change, no subject or bucket named.
            assert out.splitlines()[1:] == [
                "what it starts is not shown: a publisher reads no workflows and no runs, so "
                "it is told only that its event is stored (expected; an operator or a reader "
                "sees the runs)"
            ], out
            assert errs == "", errs
        assert denied == len(todo) - 2
    if role == "agent":
        assert denied >= len(todo) - 3
    # The run the commands were run against is as it was, but where the role may cancel.
    status = (await secured.operator.read(run_id))[-1]
    if role != "gateway":
        assert not isinstance(status, ev.RunCancelled)


async def test_a_publisher_emits_what_it_may_not_and_is_told(secured: Secured) -> None:
    creds = await issued(secured, "publisher")
    code, out, errs, took = await cli(
        secured, creds, "emit", "other.thing", "--source", "https://acme.example"
    )
    assert code == EXIT_DENIED, (out, errs)
    assert errs.strip() == (
        "interlock: permission denied: this credential may not publish to il.events.other.thing"
        f" ({creds} is a publisher's credential: it publishes its event types and reads nothing)"
    )
    assert took < 30
