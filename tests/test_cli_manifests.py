"""``interlock validate`` and ``interlock init``, end to end, as a user types them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INTERLOCK = Path(sys.executable).parent / "interlock"
INVALID = ROOT / "tests/core/manifests/invalid"


def interlock(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INTERLOCK), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        input=stdin,
        timeout=60,
        check=False,
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    for name in ("code-review.yaml", "agents.yaml"):
        (tmp_path / name).write_text((ROOT / "examples" / name).read_text())
    return tmp_path


THREE_ERRORS = """\
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
          timeout: soon
      on:
        - event: task.completed
          guard: 'result.score >'
          goto: done
          when: later
    done:
      type: terminal
"""
BROKEN_ERRORS = [
    "broken.yaml:11:20: bad-duration: 'soon' is not a duration "
    "(a number and a unit: 250ms, 30s, 30m, 1h, 1d)",
    "broken.yaml:14:32: cel-compile: CEL does not compile: 'result.score >'",
    "broken.yaml:16:11: unknown-key: unknown key 'when' in spec.states.work.on.0 "
    "(allowed: budget, continue_as_new, description, event, goto, guard, set)",
]

# Each call starts a process (about a second on a loaded machine): one call per behaviour.


def test_validate_the_examples_with_their_agents() -> None:
    result = interlock(
        "validate", "examples/code-review.yaml", "--agents", "examples/agents.yaml", cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ok  workflow default/code-review: 6 states, 1 trigger, capabilities: echo, review",
        "ok  agentdef default/echo: capabilities: echo, review",
    ]
    assert result.stderr == ""


def test_validate_invalid_files_prints_every_error_sorted_by_path(work: Path) -> None:
    (work / "broken.yaml").write_text(THREE_ERRORS)
    (work / "goto.yaml").write_text((INVALID / "unknown-goto.yaml").read_text())
    result = interlock("validate", "goto.yaml", "broken.yaml", cwd=work)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        *BROKEN_ERRORS,
        "goto.yaml:12:17: unknown-goto: goto 'dnoe' is not a state (states: work, done)",
        "4 errors",
    ]


def test_validate_a_missing_file_is_a_usage_error(work: Path) -> None:
    result = interlock("validate", "nope.yaml", cwd=work)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("interlock: nope.yaml: cannot read: ")
    assert "Traceback" not in result.stderr


def test_validate_json_with_agents_missing_a_capability(work: Path) -> None:
    (work / "broken.yaml").write_text(THREE_ERRORS)
    agents = (work / "agents.yaml").read_text().replace("- name: review", "- name: reviews")
    (work / "agents.yaml").write_text(agents)
    result = interlock(
        "validate", "code-review.yaml", "broken.yaml", "--agents", "agents.yaml", "--json", cwd=work
    )
    assert result.returncode == 1
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert report["capabilities_checked"] is True
    assert report["workflows"] == []
    assert [(e["path"], e["line"], e["col"], e["rule"]) for e in report["errors"]] == [
        ("broken.yaml", 11, 20, "bad-duration"),
        ("broken.yaml", 14, 32, "cel-compile"),
        ("broken.yaml", 16, 11, "unknown-key"),
        ("code-review.yaml", 68, 23, "unknown-capability"),
    ]
    assert report["errors"][-1]["message"] == "no AgentDef declares capability 'review'"


def test_init_writes_a_workflow_that_validates(work: Path) -> None:
    result = interlock("init", "workflow", "my-flow", "-o", "my-flow.yaml", cwd=work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "wrote my-flow.yaml\n"
    assert "name: my-flow" in (work / "my-flow.yaml").read_text()
    check = interlock("validate", "my-flow.yaml", cwd=work)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("ok  workflow default/my-flow: ")
    # The template asks for echo, whose AgentDef a new user has in no folder: the note names
    # the one installed with the reference agent, which validates it.
    echo = ROOT / "agents" / "interlock_agents" / "manifests" / "echo.yaml"
    assert check.stderr == (
        "note: capabilities not checked (no AgentDef given: add --agents FILE); for echo, "
        f"the reference agents' AgentDefs: --agents {echo}\n"
    )
    checked = interlock("validate", "my-flow.yaml", "--agents", str(echo), cwd=work)
    assert (checked.returncode, checked.stderr) == (0, "")


def test_a_workflow_that_asks_for_no_capability_validates_without_a_note(work: Path) -> None:
    (work / "timer.yaml").write_text(
        "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: timer}\n"
        "spec:\n  initial_state: wait\n  states:\n"
        "    wait: {timeout: {after: 1s, goto: done}}\n    done: {type: terminal}\n"
    )
    check = interlock("validate", "timer.yaml", cwd=work)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("ok  workflow default/timer: 2 states, 0 triggers, ")
    assert check.stderr == ""


def test_init_refuses_to_overwrite_without_force(work: Path) -> None:
    target = work / "mine.yaml"
    target.write_text("# my work\n")
    result = interlock("init", "workflow", "mine", "-o", "mine.yaml", cwd=work)
    assert result.returncode == 2
    assert result.stderr == "interlock: mine.yaml exists (use --force to overwrite)\n"
    assert target.read_text() == "# my work\n"
    result = interlock("init", "workflow", "mine", "-o", "mine.yaml", "--force", cwd=work)
    assert result.returncode == 0
    assert "name: mine" in target.read_text()


def test_validate_a_webhook(work: Path) -> None:
    (work / "github.yaml").write_text(
        "apiVersion: interlock.io/v1\nkind: Webhook\nmetadata: {name: github}\nspec:\n"
        "  scheme: github\n  secret: {env: GITHUB_WEBHOOK_SECRET}\n"
        "  type: {header: X-GitHub-Event, prefix: com.github., values: [push]}\n"
    )
    result = interlock("validate", "github.yaml", cwd=work)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "ok  webhook default/github: POST /webhooks/github, scheme github, "
        "source interlock://webhooks/default/github\n"
    )


def test_an_unknown_name_lists_only_what_the_expression_may_read(work: Path) -> None:
    """A weight, a fairness key, a limit key and a priority are computed when the run
    starts, a trigger's key when its event arrives: an unknown name lists what each sees."""
    (work / "unknown.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: interlock.io/v1
            kind: Workflow
            metadata: {name: wf}
            spec:
              priority: prio.x
              triggers:
                - {event: a.b, debounce: {period: 1m, key: kk.y}}
              concurrency:
                - {key: team.z, limit: 2, fair: tenant.z, weight: tier.w}
              initial_state: a
              states:
                a: {type: terminal}
            """
        )
    )
    result = interlock("validate", "unknown.yaml", cwd=work)
    assert result.returncode == 1
    start = "(known: data, event, inputs)"
    assert result.stderr.splitlines() == [
        f"unknown.yaml:5:13: cel-compile: unknown variable 'prio' in CEL {start}",
        "unknown.yaml:7:48: cel-compile: unknown variable 'kk' in CEL (known: data, event)",
        f"unknown.yaml:9:13: cel-compile: unknown variable 'team' in CEL {start}",
        f"unknown.yaml:9:37: cel-compile: unknown variable 'tenant' in CEL {start}",
        f"unknown.yaml:9:55: cel-compile: unknown variable 'tier' in CEL {start}",
        "5 errors",
    ]


SCHEMA_AND_CEL = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {namespace: default}
spec:
  inputs:
    customer: {type: string, required: true}
  priority: 'size(inputs.customer) +'
  concurrency:
    - {key: inputs.customer, limit: "two"}
    - {key: 'customer.name', limit: 1}
  states:
    wait:
      type: human_in_the_loop
      on:
        - {guard: "true", goto: done}
        - {event: go, guard: "data.x >", goto: done}
    done:
      type: terminal
      outputs: {n: "{{ inputs.customer + }}"}
---
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: llm}
spec:
  capabilities:
    - name: llm.complete
      timeout_seconds: soon
      concurrency: {limit: 2, key: 'input.account +'}
"""


def test_validate_reports_schema_and_expression_errors_in_one_round(work: Path) -> None:
    """Each schema error, and the expressions' errors of what the schema left (a limit and
    a transition it refused are left out; a missing name and first state are stood in
    for), each where it is written: not the expressions only once the schema is fixed."""
    (work / "both.yaml").write_text(SCHEMA_AND_CEL)
    result = interlock("validate", "both.yaml", cwd=work)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "both.yaml:3:11: missing-field: metadata: 'name' is a required property",
        "both.yaml:5:3: missing-field: spec: 'initial_state' is a required property",
        "both.yaml:7:36: cel-compile: CEL does not compile: 'size(inputs.customer) +'",
        "both.yaml:9:37: wrong-type: spec.concurrency.0.limit must be integer, got string",
        "both.yaml:10:14: cel-compile: unknown variable 'customer' in CEL "
        "(known: data, event, inputs)",
        "both.yaml:15:11: missing-field: spec.states.wait.on.0: 'event' is a required property",
        "both.yaml:16:38: cel-compile: CEL does not compile: 'data.x >'",
        "both.yaml:19:40: cel-compile: CEL does not compile: 'inputs.customer +'",
        "both.yaml:27:24: wrong-type: spec.capabilities.0.timeout_seconds must be number, "
        "got string",
        "both.yaml:28:51: cel-compile: CEL does not compile: 'input.account +'",
        "10 errors",
    ]


MISTYPED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: typed
spec:
  initial_state: wait
  states:
    wait:
      on:
        - event: go
          guard: 'data.n > 1 && "a" + 1 == "a1"'
          goto: done
        - {event: stop, guard: 'data.n * 2 > 3 && data.s + "!" == "x!"', goto: done}
        - event: more
          set: {said: '{{ ("x" + "y") - "y" }}'}
          goto: done
    done:
      type: terminal
"""


def test_validate_reports_an_operator_its_literals_types_refuse(work: Path) -> None:
    """`"a" + 1` fails at every evaluation whatever the run's values: reported where it
    stands, with the schema's and the other expressions' errors; what reads a run's values
    (their types are JSON's, known at run time) is left to run time."""
    (work / "typed.yaml").write_text(MISTYPED)
    result = interlock("validate", "typed.yaml", cwd=work)
    assert result.returncode == 1
    fails = "CEL has no such operator, and the expression fails whatever the run's values"
    hint = "(convert one side: string(x), int(x), double(x))"
    assert result.stderr.splitlines() == [
        f"typed.yaml:11:33: cel-type: '+' of string and int: {fails} {hint}",
        f"typed.yaml:15:28: cel-type: '-' of string and string: {fails} {hint}",
        "2 errors",
    ]
