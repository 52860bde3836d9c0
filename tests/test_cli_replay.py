"""The debugging commands offline, as a user types them: exported logs (the golden logs)
and manifest files, no server."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from interlock.cli.main import main
from interlock.core import events as ev
from interlock.core.state import fold

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
WORKFLOW = GOLDEN / "code-review.yaml"


def interlock(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as typed, run in this process (these need no server; a subprocess per
    call would cost a second of start-up each)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def log(name: str) -> str:
    return str(GOLDEN / f"{name}.jsonl")


@pytest.fixture
def stricter(tmp_path: Path) -> Path:
    path = tmp_path / "stricter.yaml"
    path.write_text(
        WORKFLOW.read_text().replace("guard: result.score > 7", "guard: result.score > 8")
    )
    return path


def test_explain_names_the_false_guard_and_its_values() -> None:
    done = interlock(
        "explain", "--file", log("code-review-guard-failure"), "--workflow", str(WORKFLOW)
    )
    assert done.returncode == 0, done.stderr
    assert (
        "on[0] approval.granted -> merge: `data.approver in inputs.approvers` "
        '(data.approver = "mallory", inputs.approvers = ["alice","bob"]): false'
    ) in done.stdout
    assert "data.approver is absent" in done.stdout
    assert '=> on[0] fired: approval -> merge, set {"approver":"bob"}' in done.stdout
    at = interlock(
        "explain",
        "--file",
        log("code-review-guard-failure"),
        "--workflow",
        str(WORKFLOW),
        "--at",
        "11",
        "--json",
    )
    report = json.loads(at.stdout)
    assert [s["seq"] for s in report["steps"]] == [11]
    assert report["steps"][0]["checks"][0]["outcome"] == "false"


def test_explain_offline_needs_the_manifest() -> None:
    done = interlock("explain", "--file", log("code-review-guard-failure"))
    assert done.returncode == 2
    assert "--workflow FILE" in done.stderr


def test_replay_against_exits_0_when_the_logs_agree_and_1_when_they_diverge(
    stricter: Path,
) -> None:
    same = interlock(
        "replay", "--file", log("code-review-merged-fix-loop"), "--against", str(WORKFLOW)
    )
    assert same.returncode == 0, same.stderr
    assert "its 27 records agree" in same.stdout
    differ = interlock(
        "replay", "--file", log("code-review-merged-fix-loop"), "--against", str(stricter)
    )
    assert differ.returncode == 1, differ.stderr
    assert "diverges from" in differ.stdout
    assert "at record 16 (guard)" in differ.stdout
    assert "(result.score = 8): false" in differ.stdout
    # Without --against: the fold, step by step, as before.
    plain = interlock("replay", "--file", log("code-review-merged-fix-loop"), "--json")
    assert plain.returncode == 0
    assert len(plain.stdout.splitlines()) == 27


def test_replay_against_a_version_that_refuses_the_inputs_says_the_run_never_starts(
    tmp_path: Path,
) -> None:
    refusing = tmp_path / "refusing.yaml"
    refusing.write_text(
        WORKFLOW.read_text().replace("    pr:\n      type: integer", "    pr:\n      type: string")
    )
    differ = interlock(
        "replay", "--file", log("code-review-merged-fix-loop"), "--against", str(refusing)
    )
    assert differ.returncode == 1, differ.stderr
    assert "at record 1 (not_started)" in differ.stdout
    assert "input 'pr' must be string" in differ.stdout
    assert differ.stdout.rstrip().endswith("new end:      never started")


def test_shadow_groups_the_golden_runs(stricter: Path) -> None:
    done = interlock(
        "shadow", "code-review", "--candidate", str(stricter), "--file", str(GOLDEN), "--json"
    )
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["runs"], summary["agree"], summary["diverge"]) == (8, 6, 2)
    assert [g["count"] for g in summary["groups"]] == [2]
    latest = interlock(
        "shadow",
        "code-review",
        "--candidate",
        str(stricter),
        "--file",
        str(GOLDEN),
        "--runs",
        "1",
        "--json",
    )
    assert json.loads(latest.stdout)["runs"] == 1


def test_fork_offline_writes_the_forks_log(tmp_path: Path) -> None:
    out = tmp_path / "fork.jsonl"
    done = interlock(
        "fork",
        "--file",
        log("code-review-fix-failed"),
        "--at",
        "9",
        "--workflow",
        str(WORKFLOW),
        "--run-id",
        "r-fork",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "forked r-golden-failed at record 9 as r-fork" in done.stdout
    records = ev.decode_lines(out.read_bytes())
    assert isinstance(records[9], ev.RunForked)
    state = fold(records)
    assert (state.run_id, state.state, state.status) == ("r-fork", "fix", "running")
    refused = interlock(
        "fork", "--file", log("code-review-fix-failed"), "--at", "11", "--workflow", str(WORKFLOW)
    )
    assert refused.returncode == 1
    assert "already ended (failed)" in refused.stderr


def test_migrate_offline_is_a_dry_run(tmp_path: Path, stricter: Path) -> None:
    running = tmp_path / "running.jsonl"
    lines = (GOLDEN / "code-review-merged-fix-loop.jsonl").read_bytes().splitlines(True)
    running.write_bytes(b"".join(lines[:14]))
    done = interlock(
        "migrate", "code-review", "--to", str(stricter), "--file", str(running), "--json"
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert [r["run_id"] for r in summary["moved"]] == ["r-golden-merged"]
    assert summary["dry_run"] is True


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_walkthrough_manifests_validate(version: int) -> None:
    done = interlock(
        "validate",
        str(ROOT / "docs" / "debugging" / f"code-review-v{version}.yaml"),
        "--agents",
        str(ROOT / "examples" / "agents.yaml"),
    )
    assert done.returncode == 0, done.stderr


LIMITED_AGENT = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: llm-agent}
spec:
  capabilities:
    - name: llm.complete
      timeout_seconds: 30
      concurrency: {limit: 2, key: input.account}
"""

ASKS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: asks}
spec:
  inputs:
    account: {type: string, required: true}
  initial_state: work
  states:
    work:
      actions:
        - capability: llm.complete
          input: {account: "{{ inputs.account }}"}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_offline_a_run_its_capabilities_shaped_needs_their_agentdefs(tmp_path: Path) -> None:
    """A run whose capability declares a timeout and a limit, explained and replayed from
    its exported log with the workflow alone: the records the AgentDef shaped differ, and
    the command says to give it (--agents); given, the log is reproduced."""
    from interlock.core.capacity import admitted
    from interlock.core.compiler import compile_sources
    from interlock.core.definition import link
    from support.core import Run

    compiled = compile_sources([("agent.yaml", LIMITED_AGENT), ("asks.yaml", ASKS)])
    (agent,) = compiled.agents
    run = Run(link(compiled.workflows[0], agent.capabilities), run_id="r1")
    run.start({"account": "acme"})
    action = run.pending_id()
    run._apply(admitted(run.definition, run.state, run.now(), action_id=action, attempt=1))
    run.answer({"text": "ok"}, action_id=action)
    exported = tmp_path / "r1.jsonl"
    exported.write_bytes(b"".join(ev.encode(r) + b"\n" for r in run.log))
    (tmp_path / "asks.yaml").write_text(ASKS)
    (tmp_path / "agent.yaml").write_text(LIMITED_AGENT)
    workflow, agents = str(tmp_path / "asks.yaml"), str(tmp_path / "agent.yaml")
    note = "note: no AgentDef given (--agents FILE)"
    alone = interlock("explain", "--file", str(exported), "--workflow", workflow)
    assert "does not reproduce" in alone.stdout
    assert note in alone.stderr
    replayed = interlock("replay", "--file", str(exported), "--against", workflow)
    assert replayed.returncode == 1
    assert note in replayed.stderr
    linked = interlock(
        "explain", "--file", str(exported), "--workflow", workflow, "--agents", agents
    )
    assert "does not reproduce" not in linked.stdout
    assert linked.stderr == ""
    again = interlock("replay", "--file", str(exported), "--against", workflow, "--agents", agents)
    assert again.returncode == 0, again.stdout


ECHOES = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: echoes}
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: {said: hi}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_offline_the_note_names_the_reference_agents_agentdef_to_give(tmp_path: Path) -> None:
    """A run of the echo reference agent's capability, explained from its exported log with
    the workflow alone: the note names the capability and the AgentDef file that declares
    it, as installed; given as the note says, the log is reproduced."""
    import re

    import interlock_agents
    from interlock.core.compiler import compile_sources
    from interlock.core.definition import link
    from support.core import Run

    compiled = compile_sources(
        [("echo.yaml", interlock_agents.manifest_text("echo")), ("echoes.yaml", ECHOES)]
    )
    (agent,) = compiled.agents
    run = Run(link(compiled.workflows[0], agent.capabilities), run_id="r1")
    run.start({})
    run.answer({"said": "hi"}, action_id=run.pending_id())
    exported = tmp_path / "r1.jsonl"
    exported.write_bytes(b"".join(ev.encode(r) + b"\n" for r in run.log))
    workflow = tmp_path / "echoes.yaml"
    workflow.write_text(ECHOES)
    alone = interlock("explain", "--file", str(exported), "--workflow", str(workflow))
    assert "does not reproduce" in alone.stdout
    note = re.search(r"capabilities \(echo\) declare .*; give --agents (\S+)$", alone.stderr)
    assert note is not None, alone.stderr
    assert Path(note.group(1)).read_text() == interlock_agents.manifest_text("echo")
    given = interlock(
        "explain", "--file", str(exported), "--workflow", str(workflow), "--agents", note[1]
    )
    assert "does not reproduce" not in given.stdout
    assert given.stderr == ""


ORDERS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: orders}
spec:
  inputs:
    customer: {type: string, required: true}
    region: {type: string, required: true}
  concurrency:
    - {key: inputs.customer, limit: 1}
  initial_state: wait
  states:
    wait:
      type: human_in_the_loop
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""

REGIONAL = ORDERS.replace(
    "- {key: inputs.customer, limit: 1}", "- {key: inputs.region, limit: 2, scope: regions}"
)


def test_migrate_offline_says_which_slots_each_run_asks_for_and_gives_back(
    tmp_path: Path,
) -> None:
    """Offline, from an exported log and the next version's manifest, each run that would
    move says which slots it gives back and which it would wait for, as online."""
    from interlock.core.compiler import compile_sources
    from interlock.core.engine import admit
    from support.core import Run

    (v1,) = compile_sources([("orders.yaml", ORDERS)]).workflows
    run = Run(v1, run_id="r1")
    run.start({"customer": "acme", "region": "eu"})
    run._apply(admit(run.definition, run.state, run.now()))  # holds its slot, in wait
    exported = tmp_path / "r1.jsonl"
    exported.write_bytes(b"".join(ev.encode(r) + b"\n" for r in run.log))
    regional = tmp_path / "regional.yaml"
    regional.write_text(REGIONAL)
    args = ("migrate", "orders", "--to", str(regional), "--file", str(exported))
    said = interlock(*args)
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines()[1] == (
        "  would move: r1 (v1, in wait); waits for a slot of default/regions key 'eu'; "
        "gives back default/orders#1 key 'acme'"
    )
    summary = json.loads(interlock(*args, "--json").stdout)
    (moved,) = summary["moved"]
    assert moved["asks"] == [{"limit": "default/regions", "key": "eu"}]
    assert moved["frees"] == [{"limit": "default/orders#1", "key": "acme"}]
    # Onto the same limits (a guard changed, say), a run neither asks nor gives back.
    same = tmp_path / "same.yaml"
    same.write_text(ORDERS.replace("goto: done}", "goto: done, guard: 'true'}"))
    (unchanged,) = json.loads(
        interlock("migrate", "orders", "--to", str(same), "--file", str(exported), "--json").stdout
    )["moved"]
    assert {"asks", "frees"}.isdisjoint(unchanged)


def test_the_offline_explain_of_docs_debugging_prints_what_the_page_shows() -> None:
    """docs/debugging.md's one example that needs no server (a golden log): each line the
    page shows (`...` stands for lines left out) is a line the command prints."""
    page = (ROOT / "docs" / "debugging.md").read_text(encoding="utf-8")
    command = "$ interlock explain --file tests/golden/code-review-guard-failure.jsonl "
    rest, *shown = page.split(command, 1)[1].split("```", 1)[0].splitlines()
    flags = rest.split()
    assert flags[:2] == ["--workflow", "tests/golden/code-review.yaml"], flags
    done = interlock(
        "explain", "--file", log("code-review-guard-failure"), "--workflow", str(WORKFLOW),
        *flags[2:],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    for line in shown:
        if line.strip() not in ("", "..."):
            assert line in printed, (line, done.stdout)
