"""What the CLI says to each party on its first tries, run as a subprocess with the credential
`interlock creds issue` gives it: a run id nobody started, an agent started on a credential
that serves nothing, a credential revoked since, a `shadow --since` that is no time. Each is
one line that says what is wrong and what to do, with the exit code the CLI reference gives,
never a wait, a retry loop or a silent empty answer."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from support.auth import MANIFESTS, Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
EXIT_USAGE, EXIT_NO_RUN = 2, 4


async def cli(secured: Secured, creds: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env.update(
        INTERLOCK_URL=secured.url,
        INTERLOCK_CREDS=str(creds),
        INTERLOCK_KEYS=str(secured.data / "keys"),
        XDG_CONFIG_HOME=str(secured.data / "config"),  # no `interlock dev` recorded
    )
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK,
        *args,
        cwd=secured.data,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, errs = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()  # a command that waits for good (as agent run on a publisher's did)
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), errs.decode()


async def issue(secured: Secured, role: str, name: str, *flags: str) -> Path:
    path = secured.data / f"{name}.creds"
    code, _, errs = await cli(
        secured, secured.auth.operator, "creds", "issue", role, *flags, "--name", name,
        "-o", str(path),
    )  # fmt: skip
    assert code == 0, errs
    return path


async def test_a_run_id_nobody_started_is_no_run_to_pause_or_resume(secured: Secured) -> None:
    for verb in ("pause", "resume"):
        code, out, errs = await cli(secured, secured.auth.operator, verb, "run", "nope")
        assert (code, out, errs) == (EXIT_NO_RUN, "", "interlock: no run 'nope'\n"), verb


async def test_an_event_sent_to_a_run_by_its_id_says_when_nothing_takes_it(
    secured: Secured,
) -> None:
    op = secured.auth.operator
    await secured.operator.start("awaiting", {}, run_id="first-use-ended")
    code, _, errs = await cli(secured, op, "cancel", "first-use-ended")
    assert code == 0, errs
    await secured.operator.start("awaiting", {}, run_id="first-use-waiting")
    emit = ("emit", "acme.order.nudged", "--source", "https://acme.example", "--ext")
    for run, said in (
        ("nope", "sent to run nope: no run has this id, so nothing takes it"),
        ("first-use-ended", "sent to run first-use-ended, which has ended (cancelled): "),
        ("first-use-waiting", "sent to run first-use-waiting"),
    ):
        code, out, errs = await cli(secured, op, *emit, f"runid={run}")
        assert (code, errs) == (0, ""), errs
        lines = out.splitlines()
        assert lines[0].startswith("emitted acme.order.nudged id="), out
        assert lines[1] == said + ("nothing takes it" if said.endswith(": ") else ""), out


async def test_an_agent_on_a_credential_that_serves_nothing_is_refused_at_once(
    secured: Secured,
) -> None:
    publisher = await issue(secured, "publisher", "first-publisher", "--events", "acme.>")
    for creds, role in ((publisher, "a publisher"), (secured.auth.operator, "an operator")):
        began = time.monotonic()
        code, _, errs = await cli(secured, creds, "agent", "run", "echo", "--no-metrics")
        took = time.monotonic() - began
        assert code == EXIT_USAGE, errs
        assert errs == (
            f"interlock: {creds} is {role}'s credential, which serves no capability: run an "
            "agent on an agent's credential (interlock creds issue agent --capability echo "
            "--capability review -o FILE)\n"
        )
        assert took < 30, took  # where it retried its refused requests until stopped


async def test_a_revoked_credential_is_named_with_why_a_server_refuses_one(
    secured: Secured,
) -> None:
    creds = await issue(secured, "publisher", "first-revoked", "--events", "acme.>")
    emit = ("emit", "acme.order.placed", "--source", "https://acme.example", "--data", "{}")
    code, out, errs = await cli(secured, creds, *emit)
    assert (code, out.split(" id=")[0]) == (0, "sent acme.order.placed"), errs
    op = secured.auth.operator
    code, _, errs = await cli(secured, op, "creds", "revoke", "first-revoked")
    assert code == 0, errs
    code, out, errs = await cli(secured, creds, *emit)
    assert (code, out) == (EXIT_USAGE, ""), errs
    lines = errs.splitlines()
    assert lines[0] == f"interlock: NATS at {secured.url} refused the credentials: " + (
        "nats: 'Authorization Violation'"
    )
    assert lines[1:] == [
        f"  {creds} was refused: it is revoked (interlock creds list says REVOKED), its "
        "account has not reached this server (interlock creds push), or it was issued from "
        "keys this server does not trust"
    ]
    assert "this server wants a credential" not in errs
    # A worker on a revoked agent's credential is told the same.
    agent = await issue(
        secured, "agent", "first-revoked-agent", "--capability", "echo", "--capability", "review"
    )
    code, _, errs = await cli(secured, op, "creds", "revoke", "first-revoked-agent")
    assert code == 0, errs
    code, _, errs = await cli(secured, agent, "agent", "run", "echo", "--no-metrics")
    assert code == EXIT_USAGE, errs
    assert errs.splitlines()[1] == lines[1].replace(str(creds), str(agent)), errs


async def test_shadow_takes_its_since_as_logs_does_and_refuses_what_is_no_workflow_or_time(
    secured: Secured,
) -> None:
    candidate = secured.data / "candidate.yaml"
    candidate.write_text(next(d for d in MANIFESTS.split("---\n") if "name: awaiting" in d))
    await secured.operator.start("awaiting", {}, run_id="first-use-shadow")
    shadow = ("shadow", "awaiting", "--candidate", str(candidate))
    op = secured.auth.operator
    for flags, said in (
        (("--since", "yesterday"), "--since 'yesterday': give an RFC 3339 time"),
        (("--runs", "0"), "--runs must be 1 or more, got 0"),
    ):
        code, out, errs = await cli(secured, op, *shadow, *flags)
        assert (code, out) == (EXIT_USAGE, ""), (flags, errs)
        assert errs.startswith(f"interlock: {said}"), (flags, errs)
    # An age, as `logs --since` takes, and a time with an offset, compared as an instant:
    # the run started now is replayed (once the run index lists it), and agrees.
    deadline = time.monotonic() + 30
    while True:
        code, out, errs = await cli(secured, op, *shadow, "--since", "1h")
        found = re.match(r"(\d+) runs replayed", out)
        assert found is not None, (code, out, errs)
        if int(found.group(1)) >= 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert (code, int(found.group(1)) >= 1) == (0, True), (out, errs)
    # A misspelt workflow: no run, and so no run that diverges; said, and not passed.
    code, out, errs = await cli(secured, op, "shadow", "awaitng", "--candidate", str(candidate))
    assert (code, out) == (1, ""), errs
    assert errs == (
        "interlock: workflow default/awaitng is not applied and has no runs (interlock workflows)\n"
    )
    code, out, errs = await cli(secured, op, "runs", "--workflow", "awaitng")
    assert (code, out) == (0, "no runs\n"), errs
    assert errs.startswith("note: workflow default/awaitng is not applied (interlock workflows)")
    code, out, errs = await cli(secured, op, *shadow, "--since", "2999-01-01T00:30:00+01:00")
    assert (code, out.splitlines()[0]) == (
        0,
        f"0 runs replayed against {candidate}: 0 agree, 0 diverge, 0 would end the same",
    ), errs
