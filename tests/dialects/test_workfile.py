"""Workfiles load as written: the document structure's rules, both forms, and conversion."""

from __future__ import annotations

import pytest
from dialect_support import FIXTURES, converted_matches, errors_of, run_cli

from interlock.dialects import prepare

EXAMPLES = sorted(FIXTURES.glob("workfile-*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_validates_and_converts(path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(["validate", str(path)], capsys)
    assert code == 0, err
    converted_matches(path, capsys)


def test_identity_is_recorded_with_every_run_and_the_name_made_a_label() -> None:
    prepared = prepare([("i.yaml", (FIXTURES / "workfile-inbox-triage.yaml").read_text())])
    wf = prepared.documents[0].data
    assert wf["metadata"] == {
        "name": "inbox-triage",
        "version": 7,
        "labels": {"owner": "support-team"},
    }
    assert wf["spec"]["context"]["workfile"] == {
        "format": 1,
        "name": "inbox_triage",
        "owner": "support-team",
        "version": 7,
    }
    assert wf["spec"]["triggers"] == [{"event": "email.received"}]
    # An absent optional input without a default reads as null.
    note = wf["spec"]["states"]["classify"]["actions"][0]["input"]["note"]
    assert note == "{{ (has(inputs.note) ? inputs.note : null) }}"


def test_a_file_without_a_name_is_named_after_the_file() -> None:
    prepared = prepare([("dir/Daily_Report.workfile", "steps:\n  - a: {agent: x}\n")])
    assert prepared.documents[0].data["metadata"]["name"] == "daily-report"


def test_a_conditional_first_step_is_decided_before_it() -> None:
    text = "steps:\n  - a: {agent: x, when: '{{ inputs.go }}'}\n  - b: {agent: y}\n"
    prepared = prepare([("c.yaml", text)], "workfile")
    states = prepared.documents[0].data["spec"]
    assert states["initial_state"] == "start"
    assert states["states"]["start"]["on"] == [
        {"event": "task.completed", "guard": "inputs.go", "goto": "a"},
        {"event": "task.completed", "goto": "b"},
    ]


BROKEN = [
    ("unknown key", "name: a\nsteps: [{a: {agent: x}}]\ntriggers: []\n", "1:1", "x"),
    ("both forms", "steps: [{a: {agent: x}}]\ninitial: s\nstates: {s: {type: terminal}}\n", "", ""),
    (
        "states without initial",
        "states: {s: {type: terminal}}\n",
        "1:1",
        "workfile.initial-required",
    ),
    (
        "steps with initial",
        "workfile: 1\nsteps: [{a: {agent: x}}]\ninitial: a\n",
        "3:1",
        "workfile.initial-with-steps",
    ),
    (
        "unsupported version",
        "workfile: 2\nsteps: [{a: {agent: x}}]\n",
        "1:11",
        "workfile.unsupported-version",
    ),
    ("bad name", "name: Inbox-Triage\nsteps: [{a: {agent: x}}]\n", "1:7", "workfile.invalid-value"),
    (
        "bad output name",
        "steps: [{a: {agent: x}}]\noutputs: {Url: x}\n",
        "2:11",
        "workfile.bad-name",
    ),
    (
        "unknown name in an expression",
        "steps: [{a: {agent: x, with: {v: '{{ b.c }}'}}}]\n",
        "1:34",
        "workfile.expression",
    ),
    (
        "a filter",
        "steps: [{a: {agent: x, with: {v: '{{ inputs.x | upper }}'}}}]\n",
        "1:34",
        "workfile.expression",
    ),
    (
        "unknown input type",
        "inputs: {x: {type: str}}\nsteps: [{a: {agent: x}}]\n",
        "1:20",
        "workfile.input-type",
    ),
    ("two kinds", "steps: [{a: {agent: x, tool: y}}]\n", "1:13", "workfile.step-kind"),
    (
        "duplicate step",
        "steps: [{a: {agent: x}}, {a: {agent: y}}]\n",
        "1:26",
        "workfile.duplicate-step",
    ),
    (
        "unknown goto",
        "initial: s\nstates: {s: {on: [{event: e, goto: t}]}}\n",
        "2:36",
        "workfile.unknown-state",
    ),
]


@pytest.mark.parametrize(("what", "text", "where", "rule"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_rule_refuses_a_file_that_breaks_it(
    what: str, text: str, where: str, rule: str
) -> None:
    if what == "unknown key":
        # `triggers` is no Workfile key, so the document is not detected as one by itself.
        errors = errors_of("w.yaml", text, "workfile")
        assert errors == [
            "w.yaml:3:1: workfile.unknown-key: unknown key 'triggers' in a Workfile (allowed: "
            "initial, inputs, name, on, outputs, owner, recovery, states, steps, version, workfile)"
        ]
        return
    if what == "both forms":
        errors = errors_of("w.yaml", text, "workfile")
        assert any("workfile.steps-or-states" in e for e in errors), errors
        return
    errors = errors_of("w.yaml", text, "workfile")
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"w.yaml:{where}: {rule}:"), errors


def test_x_keys_are_allowed_anywhere() -> None:
    text = "x-top: 1\ninputs: {a: {type: string, x-doc: y}}\nsteps: [{s: {agent: x, x-note: z}}]\n"
    assert errors_of("w.yaml", text) == []
