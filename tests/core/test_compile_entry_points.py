"""The compiler's other ways in: one workflow from text, stored documents (workflow, AgentDef,
Webhook) read back, Webhook manifests with every rule they can break, and the error that
carries diagnostics."""

from __future__ import annotations

import textwrap

import pytest

from interlock.core.compiler import (
    compile_agent_data,
    compile_sources,
    compile_webhook_data,
    compile_workflow_data,
    compile_workflow_text,
)
from interlock.core.diagnostics import Diagnostic, ManifestError
from interlock.core.vocabulary import InterlockError
from support.core import ROOT

WORKFLOW = (ROOT / "examples" / "code-review.yaml").read_text()
AGENTS = (ROOT / "examples" / "agents.yaml").read_text()


def test_a_manifest_error_lists_every_diagnostic_in_file_order() -> None:
    later = Diagnostic("b.yaml", 1, 1, "bad-name", "second file")
    second = Diagnostic("a.yaml", 7, 3, "unknown-key", "later line")
    first = Diagnostic("a.yaml", 2, 9, "missing-field", "first line")
    error = ManifestError([later, second, first])
    assert isinstance(error, InterlockError)
    assert error.diagnostics == [first, second, later]
    assert str(error) == (
        "a.yaml:2:9: missing-field: first line\n"
        "a.yaml:7:3: unknown-key: later line\n"
        "b.yaml:1:1: bad-name: second file"
    )


def test_compile_workflow_text_gives_the_one_workflow_or_says_why_not() -> None:
    definition = compile_workflow_text(WORKFLOW, "review.yaml")
    assert definition.name == "code-review"
    with pytest.raises(ManifestError) as none:
        compile_workflow_text(AGENTS, "agents.yaml")
    assert str(none.value) == "agents.yaml:1:1: wrong-kind: expected exactly one Workflow document"
    two = WORKFLOW + "\n---\n" + WORKFLOW.replace("name: code-review", "name: code-review-2")
    with pytest.raises(ManifestError, match="expected exactly one Workflow document"):
        compile_workflow_text(two)
    with pytest.raises(ManifestError) as broken:
        compile_workflow_text("kind: Pipeline\n", "p.yaml")
    assert [(d.rule, d.path) for d in broken.value.diagnostics] == [("unknown-kind", "p.yaml")]


def test_stored_documents_compile_back_to_what_they_were() -> None:
    definition = compile_workflow_text(WORKFLOW)
    again = compile_workflow_data(definition.manifest)
    assert again.spec_hash == definition.spec_hash
    assert again.states.keys() == definition.states.keys()
    with pytest.raises(ManifestError) as stored:
        compile_workflow_data({"kind": "Workflow"})
    assert all(d.path == "<stored>" for d in stored.value.diagnostics)
    [agent] = compile_sources([("agents.yaml", AGENTS)]).agents
    back = compile_agent_data(agent.manifest)
    assert (back.name, back.capabilities) == (agent.name, agent.capabilities)


HOOK = """\
apiVersion: interlock.io/v1
kind: Webhook
metadata: {name: gh, namespace: ci}
spec:
  scheme: github
  secret: {env: GH_SECRET}
  type: {header: X-GitHub-Event, prefix: com.github., values: [pull_request, push]}
"""


def test_a_webhook_compiles_with_its_defaults() -> None:
    [hook] = compile_sources([("hooks.yaml", HOOK)]).webhooks
    assert (hook.namespace, hook.name) == ("ci", "gh")
    assert hook.source == "interlock://webhooks/ci/gh"
    assert hook.replay_window_s == 300.0  # 5m
    stored = compile_webhook_data(hook.manifest)
    assert stored == hook
    named = HOOK + "  source: urn:github\n  replay_window: 7d\n"
    [hook] = compile_sources([("hooks.yaml", named)]).webhooks
    assert hook.source == "urn:github"
    assert hook.replay_window_s == 7 * 86400.0
    [hook] = compile_sources([("hooks.yaml", HOOK + "  replay_window: 1s\n")]).webhooks
    assert hook.replay_window_s == 1.0


def test_every_rule_a_webhook_breaks_is_reported_where_it_is_broken() -> None:
    broken = textwrap.dedent(
        """\
        apiVersion: interlock.io/v1
        kind: Webhook
        metadata: {name: gh}
        spec:
          scheme: github
          secret: {env: GH, file: /run/gh}
          signals: {secret: {}}
          type: {header: "a b", values: [x]}
          id: {field: a, value: v}
          subject: {}
          signature_header: "bad header"
          replay_window: 8d
        """
    )
    compiled = compile_sources([("hooks.yaml", broken)])
    assert compiled.webhooks == []
    one_of = "name exactly one of 'header', 'field' (a dotted path into the JSON body) or 'value'"
    secret = (
        "a secret names exactly one of 'env' (an environment variable) or 'file' (a path); "
        "it is never written in the manifest"
    )
    assert [str(d) for d in compiled.diagnostics] == [
        f"hooks.yaml:6:11: bad-secret: {secret}",
        f"hooks.yaml:7:21: bad-secret: {secret}",
        "hooks.yaml:8:18: bad-name: 'a b' is no header",
        f"hooks.yaml:9:7: bad-mapping: {one_of}, not field and value",
        f"hooks.yaml:10:12: bad-mapping: {one_of}, not none",
        "hooks.yaml:11:21: bad-name: not an HTTP header name",
        "hooks.yaml:12:18: bad-duration: replay_window '8d' must be a duration from 1s to 7d",
    ]


@pytest.mark.parametrize("window", ["0s", "8d", "soon"])
def test_a_replay_window_outside_one_second_to_seven_days_is_refused(window: str) -> None:
    compiled = compile_sources([("hooks.yaml", HOOK + f"  replay_window: {window}\n")])
    assert [d.rule for d in compiled.diagnostics] == ["bad-duration"]


def test_a_stored_webhook_that_breaks_a_rule_raises() -> None:
    [hook] = compile_sources([("hooks.yaml", HOOK)]).webhooks
    manifest = {**hook.manifest, "metadata": {"name": "Bad_Name"}}
    with pytest.raises(ManifestError) as caught:
        compile_webhook_data(manifest, "stored/gh")
    [diagnostic] = caught.value.diagnostics
    assert (diagnostic.path, diagnostic.rule) == ("stored/gh", "bad-name")


def test_workflows_after_a_duplicate_name_are_still_checked() -> None:
    again = WORKFLOW.replace("metadata:", "metadata:  # the same name again", 1)
    broken = WORKFLOW.replace("name: code-review", "name: code-review-2", 1).replace(
        "initial_state:", "initial_state: nowhere\n  x-was:", 1
    )
    compiled = compile_sources([("a.yaml", WORKFLOW), ("b.yaml", again), ("c.yaml", broken)])
    assert [(d.path, d.rule) for d in compiled.diagnostics] == [
        ("b.yaml", "duplicate-name"),
        ("c.yaml", "initial-state"),
    ]
