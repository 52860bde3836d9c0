"""Flow control as the operator drives it, with the credential `interlock creds issue` gives
it: `interlock runs` after a paused workflow is resumed, the place of a run waiting under a
fair-share limit (describe), `pause workflow --runs` while runs are being started, and runs
migrated onto a version that adds a concurrency limit, and off it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_role_cli import cli

from interlock.client import Client
from interlock.core import events as ev
from support.auth import SUBJECTS, Secured, secured, secured_server
from support.concurrency import ONE_AT_A_TIME, SHARED_FAIRLY, timeline

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def operator_cli(secured: Secured, *args: str) -> str:
    code, out, errs, _ = await cli(secured, secured.auth.operator, *args)
    assert code == 0, (args, out, errs)
    return out


async def listed(secured: Secured, workflow: str, *more: str) -> dict[str, list[str]]:
    """Run id -> what ``interlock runs --json`` says it waits for (``kind:name``)."""
    out = await operator_cli(secured, "runs", "--workflow", workflow, "--json", *more)
    return {
        r["run_id"]: [f"{w['kind']}:{w['name']}" for w in r["waiting"]] for r in json.loads(out)
    }


async def until_recorded(secured: Secured, run_id: str, kind: type[Any]) -> None:
    for _ in range(600):
        if any(isinstance(r, kind) for r in await secured.operator.read(run_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run_id} never recorded {kind.__name__}")


async def test_the_run_list_says_a_workflow_was_resumed(secured: Secured) -> None:
    applied = await secured.operator.apply([("one.yaml", ONE_AT_A_TIME)])
    applied.compiled.raise_for_errors()
    said = await operator_cli(secured, "pause", "workflow", "one-at-a-time")
    assert "paused default/one-at-a-time" in said
    runs = [await secured.operator.start("one-at-a-time", {}) for _ in range(3)]
    for run_id in runs:
        await until_recorded(secured, run_id, ev.RunQueued)
    # A queued run is in no state: a signal is not sent, and the CLI says why.
    code, out, errs, _ = await cli(
        secured, secured.auth.operator, "signal", runs[0], "acme.order.approved"
    )
    assert code == 1, (out, errs)
    assert "is queued, in no state yet: it takes no event until it is admitted" in errs, errs
    assert "Traceback" not in errs, errs
    paused = "slot:default/one-at-a-time@paused"
    for _ in range(300):  # the run index is written behind the runs
        shown = await listed(secured, "one-at-a-time")
        if len(shown) == len(runs):
            break
        await asyncio.sleep(0.1)
    assert {r: paused in w for r, w in shown.items()} == dict.fromkeys(runs, True), shown

    await operator_cli(secured, "resume", "workflow", "one-at-a-time")
    await until_recorded(secured, runs[0], ev.RunAdmitted)
    # The first holds the one slot; the others wait in the limit's line, no longer for
    # the pause (nothing in their logs says so: they are still queued).
    shown = await listed(secured, "one-at-a-time")
    for run_id in runs[1:]:
        assert "slot:default/one-at-a-time@resumed" in shown[run_id], shown
        assert paused not in shown[run_id], shown
        assert "slot:default/one-at-a-time#1" in shown[run_id], shown
    assert await listed(secured, "one-at-a-time", "--waiting", paused) == {}
    table = await operator_cli(secured, "runs", "--workflow", "one-at-a-time")
    assert "@paused" not in table, table
    for run_id in runs:
        await secured.operator.cancel(run_id)  # (not what is tested)


async def test_describe_says_a_place_under_fair_share_is_among_the_fairness_keys_runs(
    secured: Secured,
) -> None:
    applied = await secured.operator.apply([("fair.yaml", SHARED_FAIRLY)])
    applied.compiled.raise_for_errors()
    holder = await secured.operator.start("shared-fairly", {"customer": "acme"})
    await until_recorded(secured, holder, ev.RunAdmitted)
    waiting = [
        await secured.operator.start("shared-fairly", {"customer": c})
        for c in ("beta", "acme", "acme")
    ]
    # Third in the limit's line, second among acme's runs: the one the line serves next
    # is beta's (acme holds the slot).
    line = "queued       {} for key all under default/shared-fairly#1 (1/1 running)"
    expected = {
        waiting[0]: line.format("1st among beta's runs"),
        waiting[2]: line.format("2nd among acme's runs"),
    }
    for run_id, said in expected.items():
        for _ in range(100):  # the orchestrator puts it in line as it reads its run.queued
            out = await operator_cli(secured, "describe", "run", run_id)
            if said in out:
                break
            await asyncio.sleep(0.1)
        assert said in out, out
    described = json.loads(await operator_cli(secured, "describe", "run", waiting[2], "--json"))
    (slot,) = described["slots"]
    assert (slot["fair"], slot["place"], slot.get("holding")) == ("acme", 2, None), slot
    for run_id in (holder, *waiting):
        await secured.operator.cancel(run_id)  # (not what is tested)


RACING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: racing}
spec:
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.order.approved, goto: shipping}
    shipping:
      on:
        - {event: acme.order.shipped, goto: done}
    done:
      type: terminal
"""


async def test_pause_with_runs_holds_every_run_started_before_it(secured: Secured) -> None:
    """Runs are started without a pause while ``pause workflow --runs`` runs: once it has
    returned, none of them takes a transition (each is paused, with the workflow, or waits
    in its line), those the run list did not show yet included."""
    (await secured.operator.apply([("racing.yaml", RACING)])).compiled.raise_for_errors()
    started: list[str] = []
    stop = asyncio.Event()

    async def keep_starting() -> None:
        while not stop.is_set():
            started.append(await secured.operator.start("racing", {}))

    starting = asyncio.create_task(keep_starting())
    client = Client(secured.operator.nc, SUBJECTS)
    # Runs in flight, some of them in the run index (written just after each log).
    for _ in range(600):
        if await client.runs(workflow="racing", status="running"):
            break
        await asyncio.sleep(0.05)
    said = json.loads(
        await operator_cli(secured, "pause", "workflow", "racing", "--runs", "--json")
    )
    stop.set()
    await starting
    assert said["paused"], said
    assert said["runs"], said
    outcomes: dict[str, list[str]] = {}
    for at in range(0, len(started), 50):
        some = started[at : at + 50]
        told = await asyncio.gather(
            *(client.signal(r, "acme.order.approved", wait=30) for r in some)
        )
        for run_id, result in zip(some, told, strict=True):
            outcomes.setdefault(result.outcome, []).append(run_id)
    assert set(outcomes) <= {"held", "not-waiting"}, {k: len(v) for k, v in outcomes.items()}
    for run_id in started:
        state = await secured.operator.state(run_id)
        assert state.state == "waiting" or (not state.state and state.queued), run_id
        held_in_line = state.queued and state.paused is None
        assert held_in_line or (state.paused is not None and state.paused.workflow), run_id
    missed = set(started) - set(said["runs"]) - set(outcomes.get("not-waiting", []))
    print(f"{len(started)} runs started, {len(said['runs'])} paused by the list, "
          f"{len(missed)} at their next step")  # fmt: skip
    # One run resumed on its own while the workflow stays paused goes on (it takes the
    # approval it held), and its next step is not paused again.
    alone = outcomes["held"][-1]
    await operator_cli(secured, "resume", "run", alone)
    assert (await secured.operator.state(alone)).state == "shipping"
    result = await client.signal(alone, "acme.order.shipped", wait=30)
    assert result.outcome == "moved", result
    assert (await secured.operator.state(alone)).state == "done"
    said = json.loads(await operator_cli(secured, "resume", "workflow", "racing", "--json"))
    assert said["resumed"], said


MIGRATING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: migrating}
spec:
  inputs: {customer: {type: string, required: true}}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.order.approved, goto: done}
    done:
      type: terminal
"""

LIMIT = "  concurrency:\n    - {key: inputs.customer, limit: 1}\n  initial_state:"


async def issued_operator(secured: Secured) -> Path:
    """An operator's credential, issued as an operator does it: ``interlock creds issue``."""
    path = secured.data / "cli-migrating-operator.creds"
    if not path.exists():
        code, _, errs, _ = await cli(
            secured,
            None,
            "creds", "issue", "operator", "--name", "cli-migrating-operator",
            "-o", str(path), "--keys", str(secured.data / "keys"),
        )  # fmt: skip
        assert code == 0, errs
    return path


async def test_a_run_migrated_onto_a_limit_takes_its_slot_and_one_migrated_off_frees_it(
    secured: Secured,
) -> None:
    """Runs in flight on a version without a limit, moved by ``interlock migrate`` onto one
    that limits them to one at a time per customer: one holds the slot, the others hold in
    their state what reaches them and go on, in turn, as the slot frees; moved back off
    the limit, a run gives its slot to the next in line, and one waiting is admitted. The
    logs never show two at work at once."""
    operator = await issued_operator(secured)
    client = Client(secured.operator.nc, SUBJECTS)

    async def ops(*args: str) -> str:
        code, out, errs, _ = await cli(secured, operator, *args)
        assert code == 0, (args, out, errs)
        return out

    async def apply(text: str) -> None:
        (await secured.operator.apply([("migrating.yaml", text)])).compiled.raise_for_errors()

    async def started() -> str:
        return await secured.operator.start("migrating", {"customer": "acme"})

    async def in_index(runs: list[str], version: int) -> None:
        for _ in range(300):  # the run index is written behind the runs
            listed = await client.runs(workflow="migrating")
            if {r.run_id for r in listed if r.version == version} >= set(runs):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{runs} never listed on version {version}")

    await apply(MIGRATING)  # version 1: no limit
    runs = [await started() for _ in range(3)]
    for run_id in runs:
        await until_recorded(secured, run_id, ev.StateEntered)
    await in_index(runs, 1)
    await apply(MIGRATING.replace("  initial_state:", LIMIT))  # version 2: one at a time
    moved = await ops("migrate", "migrating", "--to", "2")
    for run_id in runs:
        said = f"moved: {run_id} (v1, in waiting); waits for a slot of default/migrating#1 key"
        assert f"{said} 'acme'" in moved, moved
    for run_id in runs:
        await until_recorded(secured, run_id, ev.RunQueued)
    first = await admitted_one(secured, runs)
    second, third = [r for r in runs if r != first]
    # A waiting run is in its state and queued for the slot; a signal is held.
    described = await ops("describe", "run", second)
    assert "queued" in described, described
    assert "default/migrating#1" in described, described
    said = await ops("signal", second, "acme.order.approved")
    assert f"held by run {second}, queued for its slots" in said, said
    state = await secured.operator.state(second)
    assert (state.state, state.status) == ("waiting", "running"), state
    told = await client.signal(third, "acme.order.approved")
    assert (told.outcome, told.held_until) == ("held", "admitted"), told
    queues = await ops("queues", "--workflow", "migrating")
    assert "1/1" in queues, queues
    # The slot holder ends: the next takes the slot and decides what it held, and so on.
    assert (await client.signal(first, "acme.order.approved")).outcome == "moved"
    for run_id in runs:
        assert (await secured.operator.wait(run_id, 30)).status == "completed", run_id

    # Off the limit again: the holder's slot goes to the run waiting behind it, which is
    # admitted at once, as nothing asks for that limit any more.
    holder, waiting = await started(), await started()
    await until_recorded(secured, holder, ev.StateEntered)
    await until_recorded(secured, waiting, ev.RunQueued)
    await in_index([holder, waiting], 2)
    await apply(MIGRATING)  # version 3: no limit
    moved = await ops("migrate", "migrating", "--to", "3")
    said = f"moved: {holder} (v2, in waiting); gives back default/migrating#1 key 'acme'"
    assert said in moved, moved
    assert f"moved: {waiting} (v2" in moved, moved
    await until_recorded(secured, waiting, ev.StateEntered)
    for run_id in (holder, waiting):
        assert (await client.signal(run_id, "acme.order.approved")).outcome == "moved"
        assert (await secured.operator.wait(run_id, 30)).status == "completed", run_id
    for _ in range(300):  # the relay frees the slots as it reads the records
        left = [q for q in await client.queues(workflow="migrating") if q.running or q.queued]
        if not left:
            break
        await asyncio.sleep(0.1)
    assert left == []

    seen = await timeline(secured.operator.nc, SUBJECTS)
    assert seen.most[("default/migrating#1", "acme")] == 1, seen.most
    for run_id in [*runs, holder, waiting]:
        assert seen.counts[run_id].get("run.admitted", 0) == 1, (run_id, seen.counts[run_id])


async def admitted_one(secured: Secured, runs: list[str]) -> str:
    """The one run of ``runs`` admitted (the others wait): fails if two ever are."""
    for _ in range(600):
        admitted = [
            r
            for r in runs
            if any(isinstance(x, ev.RunAdmitted) for x in await secured.operator.read(r))
        ]
        assert len(admitted) <= 1, admitted
        if admitted:
            return admitted[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"none of {runs} was admitted")


WHY_WAITING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: why-waiting}
spec:
  inputs: {customer: {type: string, required: true}}
  concurrency:
    - {key: inputs.customer, limit: 1}
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: acme.order.approved, goto: done}
    done:
      type: terminal
"""


async def test_the_run_list_says_why_each_run_is_paused_or_queued(secured: Secured) -> None:
    """``interlock runs`` says what holds each run: paused by itself (and why), paused with
    its workflow (and why), queued behind its workflow's pause, or for a slot of which
    limit and key; the cells stay within their width, a long reason cut short."""
    operator = await issued_operator(secured)

    async def ops(*args: str) -> str:
        code, out, errs, _ = await cli(secured, operator, *args)
        assert code == 0, (args, out, errs)
        return out

    (await secured.operator.apply([("why.yaml", WHY_WAITING)])).compiled.raise_for_errors()
    holder = await secured.operator.start("why-waiting", {"customer": "acme"})
    await until_recorded(secured, holder, ev.RunAdmitted)
    behind = await secured.operator.start("why-waiting", {"customer": "acme"})
    await until_recorded(secured, behind, ev.RunQueued)
    await ops("pause", "run", holder, "--reason", "vendor outage " + "x" * 80)

    async def rows(expected: int) -> dict[str, str]:
        """Run id -> its row of the table, once every run is listed as expected."""
        for _ in range(300):  # the run index is written behind the runs
            table = await ops("runs", "--workflow", "why-waiting")
            found = {line.split()[0]: line for line in table.splitlines()[1:]}
            if len(found) == expected and all("(paused)" in found.get(r, "") for r in paused_now):
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(table)

    paused_now = [holder]
    shown = await rows(2)
    assert "running (paused)  waiting  paused by itself: vendor outage xxx" in shown[holder]
    assert shown[holder].rstrip().split("  ")[-2].endswith("x...")  # cut at its width
    assert "running (queued)" in shown[behind], shown
    assert "slot #1 key 'acme'" in shown[behind], shown

    await ops("pause", "workflow", "why-waiting", "--runs", "--reason", "freeze")
    later = await secured.operator.start("why-waiting", {"customer": "beta"})
    await until_recorded(secured, later, ev.RunQueued)
    paused_now = [holder, behind]
    shown = await rows(3)
    assert "paused by itself: vendor outage" in shown[holder]  # its own pause stays
    assert "paused with its workflow: freeze; slot #1 key 'acme'" in shown[behind], shown
    assert "running (queued)" in shown[later]
    assert "its workflow paused; slot #1 key 'beta'" in shown[later], shown
    listed = json.loads(await ops("runs", "--workflow", "why-waiting", "--json"))
    waits = {r["run_id"]: r["waiting"] for r in listed}
    assert {"kind": "slot", "name": "default/why-waiting#1", "key": "beta"} in waits[later]
    assert {"kind": "slot", "name": "default/why-waiting@paused"} in waits[later]
    await ops("resume", "workflow", "why-waiting")
    for run_id in (holder, behind, later):
        await secured.operator.cancel(run_id)  # (not what is tested)
