"""ctxmesh Workflow resources load as written: the seed's examples validate and convert,
and each of the controller's rules refuses a file that breaks it, at the original place."""

from __future__ import annotations

import pytest

from interlock.dialects import detect, prepare
from support.dialects import FIXTURES, converted_matches, errors_of, run_cli

EXAMPLES = sorted(FIXTURES.glob("ctxmesh-*.yaml"))


def test_the_seed_examples_are_fixtures() -> None:
    assert [p.name for p in EXAMPLES] == [
        "ctxmesh-support-flow.yaml",
        "ctxmesh-triage-then-answer.yaml",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_validates_as_written(path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(["validate", str(path)], capsys)
    assert code == 0, err
    assert "ok  workflow my-team/" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_converts_to_a_manifest_that_validates(path, capsys) -> None:  # type: ignore[no-untyped-def]
    documents = converted_matches(path, capsys)
    assert documents[0]["apiVersion"] == "interlock.io/v1"
    assert {d["kind"] for d in documents[1:]} == {"AgentDef"}


def test_support_flow_maps_branches_default_and_catch_codes() -> None:
    prepared = prepare([("s.yaml", (FIXTURES / "ctxmesh-support-flow.yaml").read_text())])
    assert detect(prepared.lowered[0].source.data) == "ctxmesh"
    spec = prepared.documents[0].data["spec"]
    assert spec["inputs"] == {"message": {"type": "string"}}
    assert spec["initial_state"] == "classify"
    classify = spec["states"]["classify"]
    assert classify["actions"] == [
        {"capability": "triage-agent", "input": {"message": "{{ inputs.message }}"}}
    ]
    assert classify["on"] == [
        {
            "event": "task.completed",
            "guard": 'states.classify.output.topic == "billing"',
            "goto": "billing",
        },
        {"event": "task.completed", "goto": "general"},
    ]
    # ["tool_error", "*"]: "*" takes every failure.
    assert spec["states"]["billing"]["catch"] == [{"errors": ["*"], "goto": "fallback"}]
    agents = {a.data["metadata"]["name"]: a.data for a in prepared.agents}
    assert agents["triage-agent"]["spec"]["capabilities"][0]["output_schema"] == {
        "type": "object",
        "properties": {"topic": {"type": "string"}},
    }


def test_catch_by_code_and_by_class() -> None:
    text = STEPS.format(
        steps="""
    - name: a
      agentRef: worker
      catch:
        - errors: [tool_error, guardrail_denied]
          next: b
        - errors: [timeout]
          next: b
        - errors: [agent_error]
          next: b
      onError: b
    - name: b
      agentRef: worker
"""
    )
    prepared = prepare([("c.yaml", text)])
    assert prepared.documents[0].data["spec"]["states"]["a"]["catch"] == [
        {"codes": ["tool_error", "guardrail_denied"], "goto": "b"},
        {"errors": ["timeout"], "goto": "b"},
        {"errors": ["agent_error"], "codes": ["", "agent_error"], "goto": "b"},
        {"errors": ["*"], "goto": "b"},
    ]


def test_map_and_loop_lower_to_native_constructs() -> None:
    text = STEPS.format(
        steps="""
    - name: plan
      agentRef: planner
      input: {question: input.question}
      outputSchema: {type: object}
      next: research
    - name: research
      map: {over: steps.plan.output.questions, as: q, do: one, join: summarize}
    - name: one
      agentRef: researcher
      input: {question: q, at: index}
    - name: summarize
      agentRef: writer
      input: {findings: steps.research.output}
      next: polish
    - name: polish
      loop: {until: steps.review.output.approved, maxIterations: 3, do: review}
    - name: review
      agentRef: reviewer
      outputSchema: {type: object}
      input: {digest: steps.summarize.output.digest}
"""
    )
    assert errors_of("m.yaml", text) == [
        "m.yaml:26:23: ctxmesh.output-schema: step 'review' reads steps.summarize.output, "
        "so step 'summarize' must declare an outputSchema"
    ]
    fixed = text.replace("next: polish", "next: polish\n      outputSchema: {type: object}")
    prepared = prepare([("m.yaml", fixed)])
    assert prepared.ok, prepared.diagnostics
    states = prepared.documents[0].data["spec"]["states"]
    assert set(states) == {"plan", "research", "summarize", "polish", "done"}
    assert states["research"]["map"] == {
        "over": "states.plan.output.questions",
        "as": "q",
        "parallelism": 1,
        "completion": "all",
        "action": {
            "capability": "researcher",
            "input": {"question": "{{ q }}", "at": "{{ index }}"},
        },
    }
    assert states["research"]["on"] == [{"event": "task.completed", "goto": "summarize"}]
    assert states["polish"]["loop"]["until"] == "result.approved"
    assert states["polish"]["loop"]["max_iterations"] == 3


STEPS = """\
apiVersion: agents.ctxmesh.ai/v1beta1
kind: Workflow
metadata: {{name: wf, namespace: team}}
spec:
  registryRef: reg
  steps:{steps}"""

BROKEN = [
    (
        "two edges",
        """
    - name: a
      agentRef: x
      next: b
      branches: [{when: "true", to: b}]
    - name: b
      agentRef: x
""",
        ["b.yaml:10:7: ctxmesh.edge-kind: step 'a' sets next and branches: exactly one"],
    ),
    (
        "unknown target",
        """
    - name: a
      agentRef: x
      next: nowhere
""",
        ["b.yaml:9:13: ctxmesh.unknown-step: next 'nowhere' names no step"],
    ),
    (
        "duplicate step",
        """
    - name: a
      agentRef: x
    - name: a
      agentRef: x
""",
        ["b.yaml:9:13: ctxmesh.duplicate-step: step 'a' is defined twice"],
    ),
    (
        "referenced output without a schema",
        """
    - name: a
      agentRef: x
      next: b
    - name: b
      agentRef: x
      input: {t: steps.a.output.topic}
""",
        ["b.yaml:12:18: ctxmesh.output-schema: step 'b' reads steps.a.output"],
    ),
    (
        "CEL that does not compile",
        """
    - name: a
      agentRef: x
      branches: [{when: "input.x ==", to: a}]
""",
        ["b.yaml:9:34: ctxmesh.cel: CEL does not compile"],
    ),
    (
        "unknown CEL variable",
        """
    - name: a
      agentRef: x
      input: {m: context.x}
""",
        ["b.yaml:9:18: ctxmesh.cel: unknown variable 'context' (known: input, steps)"],
    ),
    (
        "not a DNS label",
        """
    - name: Not_A_Label
      agentRef: x
""",
        ["b.yaml:7:13: ctxmesh.invalid-value: name 'Not_A_Label' must be a DNS label"],
    ),
    (
        "missing agentRef",
        """
    - name: a
""",
        ["b.yaml:7:7: ctxmesh.missing-field: missing required field 'agentRef'"],
    ),
    (
        "onError on a map node",
        """
    - name: a
      map: {over: "[1]", as: i, do: b}
      onError: b
    - name: b
      agentRef: x
""",
        ["b.yaml:9:7: ctxmesh.onerror-node: onError is not supported on map/loop nodes"],
    ),
    (
        "loop without maxIterations",
        """
    - name: a
      loop: {until: "true", do: b}
    - name: b
      agentRef: x
""",
        ["b.yaml:8:13: ctxmesh.missing-field: missing required field 'maxIterations'"],
    ),
    (
        "unknown key",
        """
    - name: a
      agentRef: x
      retry: 3
""",
        ["b.yaml:9:7: ctxmesh.unknown-key: unknown key 'retry' in step 'a'"],
    ),
    (
        "negative retries",
        """
    - name: a
      agentRef: x
      retries: -1
""",
        ["b.yaml:9:16: ctxmesh.invalid-value: retries must be 0 to 2147483647, got -1"],
    ),
]


@pytest.mark.parametrize(("what", "steps", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_rule_refuses_a_file_that_breaks_it(
    what: str, steps: str, expected: list[str]
) -> None:
    errors = errors_of("b.yaml", STEPS.format(steps=steps))
    assert len(errors) == len(expected), errors
    for got, want in zip(errors, expected, strict=True):
        assert got.startswith(want), (got, want)


WRITTEN = FIXTURES.parent / "written"


def test_a_step_name_with_a_dash_is_read_with_the_index_form() -> None:
    # steps.score-batch would be a subtraction: CEL's index syntax is the only spelling.
    path = WRITTEN / "ctxmesh-score-batch.yaml"
    prepared = prepare([(str(path), path.read_text())])
    assert prepared.ok, prepared.diagnostics
    states = prepared.documents[0].data["spec"]["states"]
    assert states["score-batch"]["on"][0]["guard"] == (
        'has(states["score-batch"].output.note) && states["score-batch"].output.score >= 0.5'
    )
    assert states["high-value"]["actions"][0]["input"] == {
        "score": '{{ states["score-batch"].output.score }}',
        "note": "{{ states['score-batch'].output.note }}",
    }
    assert states["each-item"]["map"]["over"] == 'states["score-batch"].output.items'


def test_the_index_form_of_a_do_step_reads_its_map_and_its_loop() -> None:
    text = STEPS.format(
        steps="""
    - name: fan-out
      map: {over: "[1, 2]", as: i, do: one-item, join: sum-up}
    - name: one-item
      agentRef: x
      input: {i: i}
      outputSchema: {type: object}
    - name: sum-up
      agentRef: x
      input: {all: 'steps["one-item"].output'}
      next: polish
    - name: polish
      loop: {until: 'has(steps["re-view"].output.ok)', maxIterations: 2, do: re-view}
    - name: re-view
      agentRef: x
      outputSchema: {type: object}
"""
    )
    prepared = prepare([("d.yaml", text)])
    assert prepared.ok, prepared.diagnostics
    states = prepared.documents[0].data["spec"]["states"]
    assert states["sum-up"]["actions"][0]["input"] == {"all": '{{ states["fan-out"].output }}'}
    assert states["polish"]["loop"]["until"] == "has(result.ok)"


@pytest.mark.parametrize(
    ("cel", "expected"),
    [
        (
            'steps["nowhere"].output.x',
            'i.yaml:12:19: ctxmesh.unknown-step: steps["nowhere"] names no step',
        ),
        (
            "has(steps['a-b'].output.t)",
            "i.yaml:12:23: ctxmesh.output-schema: step 'c' reads steps['a-b'].output, so step "
            "'a-b' must declare an outputSchema",
        ),
        (
            "steps[input.which].output",
            "i.yaml:12:19: ctxmesh.cel: a step reference names its step: steps.<name> or "
            'steps["<name>"]',
        ),
    ],
)
def test_the_index_form_is_checked_like_the_dot_form(cel: str, expected: str) -> None:
    text = STEPS.format(
        steps=f"""
    - name: a-b
      agentRef: x
      next: c
    - name: c
      agentRef: x
      input: {{t: '{cel.replace("'", "''")}'}}
"""
    )
    errors = errors_of("i.yaml", text)
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors


def test_missing_registry_ref_and_steps() -> None:
    text = "apiVersion: agents.ctxmesh.ai/v1beta1\nkind: Workflow\nmetadata: {name: w}\nspec: {}\n"
    assert errors_of("r.yaml", text) == [
        "r.yaml:4:7: ctxmesh.missing-field: missing required field 'registryRef'",
        "r.yaml:4:7: ctxmesh.missing-field: missing required field 'steps'",
    ]


def test_a_native_error_in_the_lowered_manifest_points_into_the_original() -> None:
    # An orphan step is a native rule (unreachable-state), reported at the step.
    text = STEPS.format(
        steps="\n    - name: a\n      agentRef: x\n    - name: orphan\n      agentRef: x\n"
    )
    assert errors_of("o.yaml", text) == [
        "o.yaml:9:7: unreachable-state: state 'orphan' cannot be reached from initial state 'a'"
    ]


def test_agents_given_are_the_registry(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    agents = tmp_path / "registry.yaml"
    agents.write_text(
        "apiVersion: interlock.io/v1\nkind: AgentDef\nmetadata: {name: triage-agent}\n"
        "spec: {capabilities: [{name: triage-agent}]}\n"
    )
    path = FIXTURES / "ctxmesh-triage-then-answer.yaml"
    code, _, err = run_cli(["validate", str(path), "--agents", str(agents)], capsys)
    assert code == 1
    assert (
        f"{path}:17:17: unknown-capability: no AgentDef declares capability 'answer-agent'" in err
    )


def test_retries_retry_any_failure_before_catch() -> None:
    text = STEPS.format(
        steps="""
    - name: a
      agentRef: worker
      retries: 2
      catch:
        - errors: [tool_error]
          next: b
    - name: b
      agentRef: worker
"""
    )
    prepared = prepare([("c.yaml", text)])
    action = prepared.documents[0].data["spec"]["states"]["a"]["actions"][0]
    assert action["retry"] == {"max_attempts": 3, "errors": ["*"]}


MAPPED = STEPS.format(
    steps="""
    - name: list
      agentRef: lister
      outputSchema: {type: object, properties: {items: {type: array}}}
      next: each
    - name: each
      map: {over: steps.list.output.items, as: it, do: work, parallelism: 8}
    - name: work
      agentRef: worker
"""
)


def test_a_parallelism_above_max_fan_out_runs_max_fan_out_at_a_time() -> None:
    text = MAPPED.replace("spec:\n", "spec:\n  budget: {maxFanOut: 2}\n", 1)
    assert errors_of("c.yaml", text) == []
    prepared = prepare([("c.yaml", text)])
    assert prepared.documents[0].data["spec"]["states"]["each"]["map"]["parallelism"] == 2


@pytest.mark.parametrize(
    ("budget", "expected", "parallelism"),
    [
        # No block: every default (maxFanOut 4, maxSpawnDepth 3, maxTotalSpawns 20).
        ("", {"max_spawn_depth": 3, "max_total_spawns": 20}, 4),
        # A field left out takes its default; maxFanOut bounds items in flight, not items.
        ("  budget: {maxTotalSpawns: 7}\n", {"max_spawn_depth": 3, "max_total_spawns": 7}, 4),
        (
            "  budget: {maxFanOut: 100, maxSpawnDepth: 1}\n",
            {"max_spawn_depth": 1, "max_total_spawns": 20, "max_fan_out": 100},
            8,
        ),
    ],
)
def test_ctxmesh_budget_defaults_apply_to_what_the_file_leaves_out(
    budget: str, expected: dict[str, int], parallelism: int
) -> None:
    text = MAPPED.replace("spec:\n", "spec:\n" + budget, 1)
    assert errors_of("c.yaml", text) == []
    spec = prepare([("c.yaml", text)]).documents[0].data["spec"]
    assert spec["budget"] == expected
    assert spec["states"]["each"]["map"]["parallelism"] == parallelism


def test_an_expression_in_a_block_scalar_is_lowered_without_its_line_break() -> None:
    """``when: |`` keeps a line break at the end of its value: the lowered guard (what
    ``interlock convert`` writes) is the expression alone, not a quoted scalar ending in
    a blank line."""
    text = (
        "apiVersion: agents.ctxmesh.ai/v1beta1\nkind: Workflow\n"
        "metadata: {name: blocky, namespace: my-team}\n"
        "spec:\n  registryRef: support\n  steps:\n"
        "    - name: classify\n      agentRef: triage-agent\n"
        "      outputSchema: {type: object}\n"
        "      input:\n        topic: |\n          input.topic\n"
        "      branches:\n        - when: |\n            steps.classify.output.a == 1\n"
        "          to: classify\n"
    )
    prepared = prepare([("b.yaml", text)])
    assert prepared.diagnostics == []
    state = prepared.documents[0].data["spec"]["states"]["classify"]
    assert state["on"][0]["guard"] == "states.classify.output.a == 1"
    assert state["actions"][0]["input"] == {"topic": "{{ inputs.topic }}"}
