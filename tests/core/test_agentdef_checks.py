"""An AgentDef's own checks: its metadata, each capability's name (it becomes a NATS
subject), a capability named twice, and both JSON Schemas of a capability. Every problem of
the document is reported where it is, and a valid AgentDef keeps every field it declares."""

from __future__ import annotations

import textwrap

import pytest

from interlock.core.compiler import (
    compile_agent_data,
    compile_sources,
    compile_webhook_data,
    compile_workflow_text,
)
from interlock.core.definition import CapabilityDef
from interlock.core.diagnostics import ManifestError


def agentdef(capabilities: str, name: str = "tools") -> str:
    """An AgentDef ``name`` of namespace ``ops`` whose capabilities are the YAML list
    ``capabilities`` (its items start on line 6)."""
    return (
        "apiVersion: interlock.io/v1\nkind: AgentDef\n"
        f"metadata: {{name: {name}, namespace: ops}}\nspec:\n  capabilities:\n"
        + textwrap.indent(textwrap.dedent(capabilities), "    ")
    )


BROKEN = agentdef(
    """\
    - name: "code review"
    - name: lint.python
      output_schema: {type: object, required: verdict}
    - name: lint.python
      input_schema: {type: 12}
      output_schema: {type: object, properties: 3}
    """,
    name="Tools_1",
)


def test_every_broken_check_of_an_agentdef_is_reported_where_it_is_broken() -> None:
    compiled = compile_sources([("agents.yaml", BROKEN)])
    assert compiled.agents == []
    assert [str(d) for d in compiled.diagnostics] == [
        "agents.yaml:3:18: bad-name: metadata.name 'Tools_1' is not a DNS label (lowercase "
        "letters, digits and '-', 1-63 characters, starting and ending with a letter or digit)",
        "agents.yaml:6:13: bad-name: capability name 'code review' must be dot-separated "
        "words of letters, digits, '_' or '-' (it becomes a NATS subject)",
        # A capability without an input_schema still has its output_schema checked.
        "agents.yaml:8:22: bad-schema: output_schema is not a valid JSON Schema: "
        "'verdict' is not of type 'array'",
        "agents.yaml:9:13: duplicate-name: capability 'lint.python' twice",
        "agents.yaml:10:21: bad-schema: input_schema is not a valid JSON Schema: "
        "12 is not valid under any of the given schemas",
        "agents.yaml:11:22: bad-schema: output_schema is not a valid JSON Schema: "
        "3 is not of type 'object'",
    ]


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("lint", None),
        ("lint.python-3_x", None),
        ("lint..python", 6),
        ("lint.*", 6),
        ("lint.>", 6),
        (".lint", 6),
    ],
)
def test_a_capability_name_must_be_a_plain_nats_subject(name: str, line: int | None) -> None:
    text = agentdef(f'- name: "{name}"\n')
    compiled = compile_sources([("agents.yaml", text)])
    found = [(d.line, d.col, d.rule) for d in compiled.diagnostics]
    assert found == ([] if line is None else [(line, 13, "bad-name")])
    assert [a.name for a in compiled.agents] == ([] if line else ["tools"])


def test_a_valid_agentdef_keeps_every_field_it_declares() -> None:
    text = agentdef(
        """\
        - name: lint.python
          description: Lints Python sources
          input_schema: {type: object, required: [files]}
          output_schema: {type: object, properties: {verdict: {type: string}}}
          timeout_seconds: 90
          max_retries: 2
        - name: format
        """
    )
    [agent] = compile_sources([("agents.yaml", text)]).agents
    assert (agent.name, agent.namespace, agent.api_version) == ("tools", "ops", "interlock.io/v1")
    assert agent.capabilities == {
        "lint.python": CapabilityDef(
            name="lint.python",
            input_schema={"type": "object", "required": ["files"]},
            output_schema={"type": "object", "properties": {"verdict": {"type": "string"}}},
            timeout_s=90.0,
            max_retries=2,
            description="Lints Python sources",
        ),
        "format": CapabilityDef(name="format"),
    }
    assert agent.manifest["metadata"] == {"name": "tools", "namespace": "ops"}
    assert compile_agent_data(agent.manifest) == agent


def test_stored_documents_that_break_a_rule_name_where_they_came_from() -> None:
    stored = {
        "apiVersion": "interlock.io/v1",
        "kind": "AgentDef",
        "metadata": {"name": "tools"},
        "spec": {"capabilities": [{"name": "a b"}]},
    }
    with pytest.raises(ManifestError) as agent:
        compile_agent_data(stored)
    assert [(d.path, d.rule) for d in agent.value.diagnostics] == [("<stored>", "bad-name")]
    with pytest.raises(ManifestError) as workflow:
        compile_workflow_text("kind: Workflow\n")
    assert {d.path for d in workflow.value.diagnostics} == {"<manifest>"}
    hook = {
        "apiVersion": "interlock.io/v1",
        "kind": "Webhook",
        "metadata": {"name": "Bad_Name"},
        "spec": {"scheme": "github", "secret": {"env": "GH"}, "type": {"value": "a"}},
    }
    with pytest.raises(ManifestError) as webhook:
        compile_webhook_data(hook)
    assert [(d.path, d.rule) for d in webhook.value.diagnostics] == [("<stored>", "bad-name")]


def test_capabilities_that_make_the_same_nats_name_are_refused_where_the_second_is() -> None:
    """``a.b`` and ``a_b`` make the same subject token: one task consumer, one set of
    heartbeat keys and permissions for both, so an agent of one could take the other's
    tasks. Refused in one AgentDef, across two, and against the registry's."""
    one = compile_sources([("tools.yaml", agentdef("- name: lint.python\n- name: lint_python\n"))])
    [diag] = one.diagnostics
    assert (diag.path, diag.line, diag.rule) == ("tools.yaml", 7, "capability-clash")
    assert "'lint_python' and 'lint.python' make the same NATS name (lint_python)" in diag.message

    two = compile_sources(
        [
            ("a.yaml", agentdef("- name: review.deep\n", name="a")),
            ("b.yaml", agentdef("- name: review_deep\n", name="b")),
        ]
    )
    assert [(d.path, d.rule) for d in two.diagnostics] == [("b.yaml", "capability-clash")]

    known = compile_sources(
        [("b.yaml", agentdef("- name: review_deep\n", name="b"))],
        known_capabilities={"review.deep"},
    )
    assert [(d.path, d.line, d.rule) for d in known.diagnostics] == [
        ("b.yaml", 6, "capability-clash")
    ]
    # The same name again (an AgentDef applied anew) is no clash.
    again = compile_sources(
        [("a.yaml", agentdef("- name: review.deep\n", name="a"))],
        known_capabilities={"review.deep"},
    )
    assert again.ok
