"""Workfiles load as written: the document structure's rules, both forms, and conversion."""

from __future__ import annotations

import pytest

from interlock.dialects import prepare
from support.dialects import FIXTURES, converted_matches, errors_of, run_cli

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


@pytest.mark.parametrize(
    "path",
    ["dir/Daily_Report.workfile", "daily_report.workfile.yaml", "daily_report.yml"],
)
def test_a_file_without_a_name_is_named_after_the_file(path: str) -> None:
    """Whichever suffixes the file's name has (``.workfile.yaml`` is no part of it)."""
    prepared = prepare([(path, "steps:\n  - a: {agent: x}\n")], "workfile")
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
        "1:38",
        "workfile.expression",
    ),
    (
        "a filter",
        "steps: [{a: {agent: x, with: {v: '{{ inputs.x | upper }}'}}}]\n",
        "1:49",
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


CALLER = """\
name: caller
steps:
  - notify: {call: notify_owner, with: {to: "{{ inputs.who }}"}}
  - log: {agent: audit.log, with: {ref: "{{ notify.message_id }}"}}
outputs:
  sent: "{{ notify.sent }}"
"""


def test_a_path_into_a_call_of_a_workfile_without_outputs_is_refused() -> None:
    callee = "name: notify_owner\nsteps:\n  - send: {agent: mail.send}\n"
    prepared = prepare([("caller.yaml", CALLER), ("notify.yaml", callee)])
    found = [str(d) for d in prepared.diagnostics]
    assert found == [
        "caller.yaml:4:41: workfile.call-outputs: notify.message_id: the called Workfile "
        "notify-owner declares no outputs (its result is empty)",
        "caller.yaml:6:9: workfile.call-outputs: notify.sent: the called Workfile "
        "notify-owner declares no outputs (its result is empty)",
    ]


def test_a_path_into_a_call_must_name_an_output_of_the_called_workfile() -> None:
    callee = (
        "name: notify_owner\nsteps:\n  - send: {agent: mail.send}\n"
        "outputs: {sent: '{{ send.ok }}'}\n"
    )
    prepared = prepare([("caller.yaml", CALLER), ("notify.yaml", callee)])
    assert [str(d) for d in prepared.diagnostics] == [
        "caller.yaml:4:41: workfile.call-outputs: notify.message_id: the called Workfile "
        "notify-owner has no output 'message_id' (it declares: sent)"
    ]
    # Given alone, the called file is not known: nothing to check against.
    assert prepare([("caller.yaml", CALLER)]).ok


def test_a_filter_is_refused_by_name_and_a_bar_in_a_string_is_not_a_filter() -> None:
    text = "steps: [{a: {agent: x, with: {v: '{{ run.started_at | add_hours(4) }}'}}}]\n"
    assert errors_of("w.yaml", text, "workfile") == [
        "w.yaml:1:55: workfile.expression: the filter `| add_hours` in "
        "'run.started_at | add_hours(4)' is not supported: the Workfile format does not "
        "define its filters, so none is; write CEL functions instead (an instant: "
        "run.started_at + duration('4h'))"
    ]
    text = (
        'steps: [{a: {agent: x, with: {v: "{{ inputs.x == \'a|b\' || inputs.x == \\"|\\" }}"}}}]\n'
    )
    assert errors_of("w.yaml", text, "workfile") == []


def test_run_started_at_is_a_timestamp() -> None:
    text = "steps: [{a: {agent: x, with: {due: \"{{ run.started_at + duration('4h') }}\"}}}]\n"
    prepared = prepare([("w.yaml", text)], "workfile")
    action = prepared.documents[0].data["spec"]["states"]["a"]["actions"][0]
    assert action["input"] == {"due": "{{ timestamp(run.started_at) + duration('4h') }}"}


def test_owner_and_version_are_not_readable_from_an_expression() -> None:
    text = 'owner: a\nversion: 2\nsteps: [{a: {agent: x, with: {v: "{{ context.workfile }}"}}}]\n'
    assert errors_of("w.yaml", text, "workfile") == [
        "w.yaml:3:38: workfile.expression: unknown name 'context' in 'context.workfile' "
        "(known: a, inputs, run)"
    ]
