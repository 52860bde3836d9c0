"""The validator: one failing manifest per rule, each error at its exact line and column.

Every file in manifests/invalid/ starts with ``# expect: LINE:COL RULE: MESSAGE`` and must
give exactly that one diagnostic, message included (``{path}`` stands for the file's path):
the message is what the author reads to fix the file.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from interlock.core import lowering_scope
from interlock.core.compiler import compile_sources
from interlock.core.diagnostics import Diagnostic
from support.core import MANIFESTS, ROOT

INVALID = sorted((MANIFESTS / "invalid").glob("*.yaml"))
EXPECT = re.compile(r"^# expect: (\d+):(\d+) ([a-z-]+): (.+)$")

RULES = {
    "bad-size",
    "continue-terminal",
    "action-target",
    "capability-clash",
    "budget",
    "map-output",
    "fail-non-terminal",
    "state-kind",
    "dag-self-dependency",
    "dag-unknown-step",
    "dag-cycle",
    "gate-without-evidence",
    "gate-placement",
    "unknown-budget",
    "unbounded-cycle",
    "gate-outcome-impossible",
    "quorum-unreachable",
    "required-step-bypass",
    "unknown-error-class",
    "yaml-syntax",
    "yaml-limit",
    "duplicate-key",
    "unsupported",
    "wrong-type",
    "missing-field",
    "unknown-key",
    "invalid-value",
    "unknown-kind",
    "bad-name",
    "initial-state",
    "unknown-goto",
    "unreachable-state",
    "no-terminal-path",
    "terminal-transitions",
    "outputs-non-terminal",
    "cel-compile",
    "cel-cost",
    "cel-type",
    "unknown-state-ref",
    "no-output-ref",
    "bad-duration",
    "deadline",
    "archive",
    "unknown-capability",
    "input-type",
    "duplicate-name",
    "bad-schema",
    "bad-secret",
    "bad-mapping",
    "unsigned-type",
    "concurrency-key",
    "concurrency-scope",
    "priority",
    "trigger-key",
    "trigger-flow",
    "capability-key",
}


def diagnostics(text: str, path: str = "m.yaml") -> list[Diagnostic]:
    return compile_sources([(path, textwrap.dedent(text))]).diagnostics


def test_every_rule_has_a_failing_manifest() -> None:
    assert {p.stem for p in INVALID} == RULES


def _emitted_rules() -> set[str]:
    """Rule ids passed to the diagnostic helpers of the compiler and the YAML loader."""
    position = {"error": 1, "diag": 1, "_at": 1, "Diagnostic": 3}
    found: set[str] = set()
    for module in (
        "compiler.py",
        "names.py",
        "structure.py",
        "lowering.py",
        "lowering_scope.py",
        "lowering_states.py",
        "lowering_dag.py",
        "lowering_capacity.py",
        "outcomes.py",
        "rules.py",
        "source.py",
    ):
        tree = ast.parse((ROOT / "orchestrator/interlock/core" / module).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            index = position.get(name)
            if index is None or len(node.args) <= index:
                continue
            arg = node.args[index]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_rule_the_compiler_emits_is_covered() -> None:
    """A new rule id in the compiler needs a manifest here (and a line in docs/language.md)."""
    emitted = _emitted_rules()
    # wrong-kind only comes from compile_workflow_text (one workflow expected), never a file
    assert emitted - {"wrong-kind"} == RULES


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_manifest(path: Path) -> None:
    text = path.read_text()
    match = EXPECT.match(text.splitlines()[0])
    assert match, f"{path.name}: first line must be '# expect: LINE:COL RULE: MESSAGE'"
    line, col, rule, message = int(match[1]), int(match[2]), match[3], match[4]
    assert rule == path.stem
    found = compile_sources([(str(path), text)]).diagnostics
    assert [(d.rule, d.line, d.col) for d in found] == [(rule, line, col)], "\n".join(
        str(d) for d in found
    )
    assert found[0].path == str(path)
    assert found[0].message == message.replace("{path}", str(path))
    assert str(found[0]) == f"{path}:{line}:{col}: {rule}: {found[0].message}"


def test_x_keys_are_accepted_everywhere_an_author_writes() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        x-owner: platform
        metadata:
          name: demo
          x-ticket: OPS-1
        spec:
          x-notes: anything
          inputs:
            who:
              type: string
              x-ui: text
          triggers:
            - event: thing.created
              x-why: because
          initial_state: work
          states:
            work:
              x-color: blue
              actions:
                - capability: echo
                  x-cost: 3
              on:
                - event: task.completed
                  goto: done
                  x-label: finish
            done:
              type: terminal
        ---
        apiVersion: interlock.io/v1
        kind: AgentDef
        x-owner: platform
        metadata:
          name: echo
        spec:
          x-notes: anything
          capabilities:
            - name: echo
              x-cost: cheap
        """
    )
    assert found == []


def test_x_keys_do_not_reach_the_definition_but_count_in_the_hash() -> None:
    base = """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: done
          states:
            done: {type: terminal%s}
        """
    plain = compile_sources([("a.yaml", textwrap.dedent(base % ""))]).workflows[0]
    noted = compile_sources([("a.yaml", textwrap.dedent(base % ", x-note: hi"))]).workflows[0]
    assert plain.states.keys() == noted.states.keys()
    assert plain.spec_hash != noted.spec_hash


def test_other_unknown_keys_are_errors_even_next_to_x_keys() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo, x-a: 1, labelz: {}}
        spec:
          initial_state: done
          states:
            done: {type: terminal}
        """
    )
    assert [(d.rule, d.line, d.col) for d in found] == [("unknown-key", 3, 32)]
    assert "'labelz'" in found[0].message


def test_all_errors_of_a_file_are_reported_in_order() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata:
          name: demo
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
                - event: task.failed
                  goto: nowhere
                  unless: true
            done:
              type: terminal
        """
    )
    assert [(d.line, d.col, d.rule) for d in found] == [
        (11, 20, "bad-duration"),
        (14, 32, "cel-compile"),
        (17, 17, "unknown-goto"),
        (18, 11, "unknown-key"),
    ]


def test_errors_of_every_file_and_document_are_reported() -> None:
    bad_goto = """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: %s}
        spec:
          initial_state: a
          states:
            a: {on: [{event: go, goto: b}]}
            b: {type: terminal, on: [{event: go, goto: a}]}
        """
    one = textwrap.dedent(bad_goto % "one")
    two = "---\n" + textwrap.dedent(bad_goto % "two") + "---\n" + textwrap.dedent(bad_goto % "3x")
    found = compile_sources([("one.yaml", one), ("two.yaml", two)]).diagnostics
    assert [(d.path, d.line, d.rule) for d in found] == [
        ("one.yaml", 8, "terminal-transitions"),
        ("two.yaml", 9, "terminal-transitions"),
        ("two.yaml", 18, "terminal-transitions"),
    ]


def test_multi_document_file_with_workflow_and_agentdef() -> None:
    text = textwrap.dedent(
        """\
        # a comment before the first document
        ---
        apiVersion: interlock.io/v1
        kind: AgentDef
        metadata: {name: tools}
        spec:
          capabilities: [{name: echo}, {name: review}]
        ---
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: work
          states:
            work:
              actions: [{capability: review}, {capability: echo}]
              on: [{event: task.completed, goto: done}]
            done: {type: terminal}
        """
    )
    compiled = compile_sources([("both.yaml", text)])
    assert compiled.diagnostics == []
    assert compiled.capabilities_checked
    assert [w.name for w in compiled.workflows] == ["demo"]
    assert [sorted(a.capabilities) for a in compiled.agents] == [["echo", "review"]]
    broken = text.replace("{capability: echo}", "{capability: ech0}")
    found = compile_sources([("both.yaml", broken)]).diagnostics
    assert [(d.line, d.col, d.rule) for d in found] == [(16, 52, "unknown-capability")]


def test_capabilities_unchecked_without_agentdefs_and_checked_from_agent_sources() -> None:
    workflow = (MANIFESTS / "valid/zynax-hello.yaml").read_text()
    alone = compile_sources([("w.yaml", workflow)])
    assert alone.ok
    assert not alone.capabilities_checked
    other = "apiVersion: interlock.io/v1\nkind: AgentDef\nmetadata: {name: a}\n"
    other += "spec: {capabilities: [{name: summarize}]}\n"
    checked = compile_sources([("w.yaml", workflow)], agent_sources=[("a.yaml", other)])
    assert [d.rule for d in checked.diagnostics] == ["unknown-capability"]
    known = compile_sources([("w.yaml", workflow)], known_capabilities={"echo"})
    assert known.ok
    assert known.capabilities_checked


def test_on_stays_a_key_and_yes_stays_a_string() -> None:
    """YAML 1.1 would read ``on`` as true; the manifest language is YAML 1.2 core schema."""
    compiled = compile_sources(
        [
            (
                "m.yaml",
                textwrap.dedent(
                    """\
                    apiVersion: interlock.io/v1
                    kind: Workflow
                    metadata: {name: demo}
                    spec:
                      context: {answer: yes, when: 2026-01-01}
                      initial_state: a
                      states:
                        a:
                          on:
                            - {event: go, goto: b}
                        b: {type: terminal}
                    """
                ),
            )
        ]
    )
    assert compiled.ok, compiled.diagnostics
    definition = compiled.workflows[0]
    assert definition.context == {"answer": "yes", "when": "2026-01-01"}
    assert [t.goto for t in definition.states["a"].transitions] == ["b"]


def test_zynax_seed_manifests_validate_unchanged() -> None:
    paths = sorted((MANIFESTS / "valid").glob("zynax-*.yaml"))
    compiled = compile_sources([(str(p), p.read_text()) for p in paths])
    assert compiled.diagnostics == []
    assert compiled.capabilities_checked
    workflows = {w.name: w for w in compiled.workflows}
    assert set(workflows) == {"code-review", "hello"}
    review = workflows["code-review"]
    assert review.api_version == "zynax.io/v1"
    assert review.namespace == "engineering"
    assert review.version_label == "1.0.0"
    assert review.triggers[0].event == "github.pull_request.opened"
    assert review.triggers[0].filter == ((("repository",), "zynax-io/zynax"),)
    assert review.states["waiting_for_human"].kind == "human_in_the_loop"
    fix = review.states["fix"]
    assert fix.actions[0].timeout_s == 1800.0
    assert fix.actions[0].output == (("message", "reply"),)
    assert [t.goto for t in fix.transitions_for("task.completed")] == ["merge", "fix"]
    agents = {a.name: a for a in compiled.agents}
    summarize = agents["code-review-agent"].capabilities["summarize"]
    assert agents["code-review-agent"].api_version == "zynax.io/v1alpha1"
    assert summarize.timeout_s == 30
    assert summarize.max_retries == 2
    assert summarize.input_schema is not None
    assert summarize.input_schema["required"] == ["text"]
    assert summarize.output_schema is not None
    assert summarize.output_schema["required"] == ["summary"]


def test_examples_validate_with_their_agents() -> None:
    workflow = ROOT / "examples/code-review.yaml"
    agents = ROOT / "examples/agents.yaml"
    compiled = compile_sources(
        [(str(workflow), workflow.read_text())], agent_sources=[(str(agents), agents.read_text())]
    )
    assert compiled.diagnostics == []
    assert compiled.capabilities_checked
    assert [w.name for w in compiled.workflows] == ["code-review"]
    assert compiled.workflows[0].capabilities() <= {
        c for a in compiled.agents for c in a.capabilities
    }


def test_the_init_template_validates() -> None:
    text = (ROOT / "orchestrator/interlock/templates/workflow.yaml").read_text()
    assert compile_sources([("t.yaml", text.replace("__NAME__", "demo"))]).ok


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("30s", 30), ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("1d", 86400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert lowering_scope.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "30 minutes", "-1s", "1w", "1.5.2s"])
def test_malformed_durations(text: str) -> None:
    assert lowering_scope.parse_duration(text) is None


def test_a_zero_duration_is_an_error() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: a
          states:
            a:
              actions: [{capability: echo, timeout: 0s}]
              on: [{event: task.completed, goto: b}]
            b: {type: terminal}
        """
    )
    assert [(d.rule, d.line) for d in found] == [("bad-duration", 8)]


def test_cel_errors_inside_templates_point_into_the_string() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: a
          states:
            a:
              actions:
                - capability: echo
                  input:
                    message: "Hello {{ inptus.name }} and {{ 1 + }}"
              on: [{event: task.completed, goto: b}]
            b: {type: terminal}
        """
    )
    assert [(d.line, d.col, d.rule) for d in found] == [
        (11, 32, "cel-compile"),
        (11, 56, "cel-compile"),
    ]
    assert "unknown variable 'inptus'" in found[0].message


def test_cel_error_line_inside_a_block_scalar() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: a
          states:
            a:
              on:
                - event: go
                  guard: |
                    data.x > 1 &&
                    data.y > > 1
                  goto: b
            b: {type: terminal}
        """
    )
    assert [(d.line, d.rule) for d in found] == [(12, "cel-compile")]


def test_cel_error_column_inside_a_block_scalar() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: a
          states:
            a:
              on:
                - event: go
                  guard: |
                    data.y > > 1
                  goto: b
            b: {type: terminal}
        """
    )
    # line 11 is "            data.y > > 1" (12 spaces once dedented): the second '>' stands
    # at column 22.
    assert [(d.line, d.col) for d in found] == [(11, 22)]


@pytest.mark.parametrize("style", ["|", ">", "|-", ">+"])
def test_template_errors_on_any_line_of_a_block_scalar_are_placed_where_written(
    style: str,
) -> None:
    """A template's place is found among the block's lines as written: on its first line,
    on a later one (after a blank one, in a folded block whose value is one line), the
    same template written twice, and an expression written across lines."""
    found = diagnostics(
        f"""\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {{name: demo}}
        spec:
          initial_state: a
          states:
            a:
              actions:
                - capability: echo
                  input:
                    notes:
                      - {style}
                        first {{{{ 1 + }}}} and
                        then {{{{ inptus.x }}}}

                          more {{{{ 1 + }}}} {{{{ 1 + }}}}
                        last {{{{ [1,
                          2 +] }}}}
              on: [{{event: task.completed, goto: b}}]
            b: {{type: terminal}}
        """
    )
    # Line 13 is "                first {{ 1 + }} and" once dedented (16 spaces): its
    # error stands at the '+' (column 28); on line 18, "                  2 +] }}", at
    # the ']' (column 22).
    assert [(d.line, d.col) for d in found] == [
        (13, 28),
        (14, 25),
        (16, 29),
        (16, 39),
        (18, 22),
    ]
    assert "unknown variable 'inptus'" in found[1].message


def test_unknown_variables_in_guards_are_compile_errors() -> None:
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: demo}
        spec:
          initial_state: a
          states:
            a:
              on:
                - {event: go, goto: b, guard: 'reslt.ok && [1].all(x, x > 0)'}
            b: {type: terminal}
        """
    )
    assert [(d.line, d.col, d.rule) for d in found] == [(9, 40, "cel-compile")]
    assert "'reslt'" in found[0].message


def test_agentdef_duplicate_capability_and_bad_values() -> None:
    found = diagnostics(
        """\
        apiVersion: zynax.io/v1alpha1
        kind: AgentDef
        metadata: {name: tools}
        spec:
          capabilities:
            - name: echo
            - name: echo
              timeout_seconds: 0
              max_retries: -1
        """
    )
    assert [(d.line, d.col, d.rule) for d in found] == [
        (7, 13, "duplicate-name"),
        (8, 24, "invalid-value"),
        (9, 20, "invalid-value"),
    ]


def test_a_manifest_must_be_a_mapping_with_a_kind() -> None:
    assert [(d.rule, d.line) for d in diagnostics("- a\n- b\n")] == [("wrong-type", 1)]
    found = diagnostics("apiVersion: interlock.io/v1\nmetadata: {name: a}\n")
    assert [(d.rule, d.line, d.col) for d in found] == [("missing-field", 1, 1)]


def test_empty_documents_are_skipped() -> None:
    agent = "apiVersion: interlock.io/v1\nkind: AgentDef\nmetadata: {name: a}\n"
    agent += "spec: {capabilities: [{name: echo}]}\n"
    compiled = compile_sources([("m.yaml", f"---\n{agent}---\n---\n{agent}---\n")])
    assert compiled.diagnostics == []
    assert len(compiled.agents) == 2


def test_empty_file_has_nothing_to_report() -> None:
    compiled = compile_sources([("empty.yaml", "# nothing here\n")])
    assert compiled.ok
    assert compiled.workflows == []
    assert compiled.agents == []


def test_a_wrong_type_names_what_was_expected_and_what_was_given() -> None:
    """The message says the expected types in the manifest's words (a mapping, a list),
    the alternatives of a union joined with "or", and null never among them."""
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: AgentDef
        metadata: {name: a, version: [1]}
        spec:
          capabilities:
            - {name: echo, input_schema: [1], description: {a: 1}}
            - {name: other, output_schema: text, description: 7}
        """
    )
    assert [f"{d.line}:{d.col} {d.rule}: {d.message}" for d in found] == [
        "3:30 wrong-type: metadata.version must be string or integer or number, got list",
        "6:34 wrong-type: spec.capabilities.0.input_schema must be a mapping, got list",
        "6:52 wrong-type: spec.capabilities.0.description must be string, got mapping",
        "7:36 wrong-type: spec.capabilities.1.output_schema must be a mapping, got string",
        "7:55 wrong-type: spec.capabilities.1.description must be string, got int",
    ]


def test_a_number_where_a_cel_expression_goes_says_to_quote_it() -> None:
    """``weight: 2`` is a number to YAML; a CEL field wants its text."""
    found = diagnostics(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: w}
        spec:
          concurrency:
            - {key: '"all"', limit: 1, fair: inputs.tenant, weight: 2}
          initial_state: done
          states: {done: {type: terminal}}
        """
    )
    assert [f"{d.line}:{d.col} {d.rule}: {d.message}" for d in found] == [
        "6:61 wrong-type: spec.concurrency.0.weight must be string, got int "
        "(a CEL expression: quote it, weight: '2')",
    ]


def test_errors_inside_optional_sections_name_the_section_and_the_rest_is_still_checked() -> None:
    """``map`` and ``timeout`` are optional: an error inside one is reported at the key
    that is wrong in it, not as "the section is not null"; unknown keys are dropped so the
    rules of the state machine still run on the rest of the document."""
    states = """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: w}
        spec:
          initial_state: work
          states:
            work:
              %s
              timeout: %s
              on: [{event: task.completed, goto: done, when: now}]
            orphan: {on: [{event: x, goto: done}]}
            done: {type: terminal}
        """
    missing = diagnostics(
        states % ('map: {over: "[1]", action: {capability: echo}}', "{after: 5s}")
    )
    assert [f"{d.line}:{d.col} {d.rule}: {d.message}" for d in missing] == [
        "8:12 missing-field: spec.states.work.map: 'as' is a required property",
        "9:16 missing-field: spec.states.work.timeout: 'goto' is a required property",
        "10:48 unknown-key: unknown key 'when' in spec.states.work.on.0 "
        "(allowed: budget, continue_as_new, description, event, goto, guard, set)",
    ]
    unknown = diagnostics(
        states
        % (
            'map: {over: "[1]", as: x, action: {capability: echo, colour: red}, extra: 1}',
            "{after: 5s, goto: done}",
        )
    )
    assert [f"{d.line}:{d.col} {d.rule}" for d in unknown] == [
        "8:60 unknown-key",
        "8:74 unknown-key",
        "10:48 unknown-key",
        "11:5 unreachable-state",
    ]
    assert "'colour' in spec.states.work.map.action (allowed: capability," in unknown[0].message
    assert unknown[1].message == (
        "unknown key 'extra' in spec.states.work.map "
        "(allowed: action, as, completion, over, parallelism)"
    )
    wrong = diagnostics(states % ("actions: [{capability: echo}]", "{after: 5, goto: done}"))
    first = wrong[0]
    assert f"{first.line}:{first.col} {first.message}" == (
        "9:24 spec.states.work.timeout.after must be string, got int"
    )


def test_every_example_sends_echo_what_the_examples_agentdef_of_echo_takes() -> None:
    """`interlock apply examples/*.yaml` (docs/operations.md's first step on one machine)
    puts examples/agents.yaml's echo in place of the reference one: each example's input to
    echo must pass its schema, or that example's runs fail with schema_error."""
    import jsonschema
    import yaml

    def actions(node: object) -> list[dict[str, object]]:
        if isinstance(node, list):
            return [a for item in node for a in actions(item)]
        if not isinstance(node, dict):
            return []
        own = [node] if node.get("capability") == "echo" else []
        return own + [a for value in node.values() for a in actions(value)]

    def rendered(value: object) -> object:  # a template stands for some text
        if isinstance(value, dict):
            return {k: rendered(v) for k, v in value.items()}
        return "x" if isinstance(value, str) and "{{" in value else value

    agents = list(yaml.safe_load_all((ROOT / "examples/agents.yaml").read_text()))
    echo = next(c for a in agents for c in a["spec"]["capabilities"] if c["name"] == "echo")
    sent = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for action in actions(doc):
                jsonschema.validate(rendered(action.get("input", {})), echo["input_schema"])
                sent += 1
    assert sent >= 8, sent
