"""gate-outcome-impossible: a task.completed transition whose guard waits for a value the
state's capability never answers (its output schema's enum or const) is refused."""

from __future__ import annotations

import pytest

from interlock.core.compiler import compile_sources

WORKFLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: verify}
spec:
  initial_state: verify
  states:
    verify:
      actions: [{capability: prepare}, {capability: tests.run}]
      on:
        - {event: task.completed, guard: %s, goto: done}
        - {event: task.completed, goto: done}
    done: {type: terminal}
---
apiVersion: interlock.io/v1
kind: AgentDef
metadata: {name: gate}
spec:
  capabilities:
    - {name: prepare, output_schema: {properties: {outcome: {const: ready}}}}
    - name: tests.run
      output_schema:
        type: object
        properties:
          outcome: {enum: [passed, implementation-failure, 'say "hi"']}
          verdict: {const: checked}
          notes: {type: string}
          score: {type: integer, minimum: 0, maximum: 10}
          ratio: {type: number, exclusiveMaximum: 1}
"""


def _rules(guard: str) -> list[str]:
    return [d.rule for d in compile_sources([("v.yaml", WORKFLOW % guard)]).diagnostics]


@pytest.mark.parametrize(
    "guard",
    [
        """'result.outcome == "failed"'""",
        """'"failed" == result.outcome'""",
        """"result.outcome == 'failed'\"""",
        """'result.verdict == "unchecked"'""",
        """'result.notes != "" && result.outcome == "ready"'""",  # prepare's, not the last's
        """"result.outcome == 'say \\"bye\\"'\"""",
        # CEL's escapes are read: "\x41" is "A", which is never answered either.
        """'result.outcome == "\\x41" || result.outcome == "failed"'""",
        """'result.outcome in ["failed", "error"]'""",
        """'result.outcome == "failed" || result.verdict == "unchecked"'""",
        """'result.verdict != "checked" && result.outcome != "passed"'""",
        """'!(result.verdict in ["checked", "other"])'""",
        """'(result.outcome == "passed" && result.verdict != "checked") || result.outcome == ""'""",
        """'result.score > 10'""",
        """'result.score >= 11 || result.score < 0'""",
        """'result.ratio >= 1.0'""",
        """'result.score == 12 && result.notes == "x"'""",
    ],
)
def test_a_value_the_capability_never_answers_is_refused(guard: str) -> None:
    assert _rules(guard) == ["gate-outcome-impossible"]


@pytest.mark.parametrize(
    "guard",
    [
        """'result.outcome == "implementation-failure"'""",
        """'result.verdict == "checked"'""",
        """'result.notes == "anything"'""",  # no enum: any value
        """'result.outcome != "failed"'""",  # "failed" is never answered: always holds
        """'result.score == "high"'""",  # a number compared with a text: not judged
        """"result.outcome == 'passed'\"""",
        """"'passed' == result.outcome\"""",
        """"result.outcome == 'say \\"hi\\"'\"""",
        """'result.level == "high"'""",  # a field the schema does not name
        """'result.outcome in ["failed", "passed"]'""",
        """'result.outcome == "failed" || result.notes == "x"'""",  # notes: any string
        """'result.outcome == "failed" || inputs.force'""",  # not read: may hold
        """'result.outcome == "failed" || true'""",  # a literal alone is not read
        """'size(result.notes) > 0 && result.outcome == "failed"'""",  # a function: not read
        """'result.outcome != "passed" && result.verdict == "checked"'""",
        """'result.score > 9'""",
        """'result.score >= 0 && result.score <= 10'""",
        """'result.ratio < 1.0'""",
        """'result.score > 5 && result.score < 3'""",  # correlated ranges: not judged
    ],
)
def test_a_value_it_may_answer_is_accepted(guard: str) -> None:
    assert _rules(guard) == []


def test_without_the_agentdef_nothing_is_known() -> None:
    text = WORKFLOW.split("---")[0] % """'result.outcome == "failed"'"""
    assert compile_sources([("v.yaml", text)]).diagnostics == []


def test_other_events_are_not_the_capabilitys_answers() -> None:
    text = (WORKFLOW % """'result.outcome == "passed"'""").replace(
        "{event: task.completed, goto: done}\n",
        "{event: task.completed, goto: done}\n"
        "        - {event: review.done, guard: 'data.outcome == \"failed\"', goto: done}\n",
    )
    assert compile_sources([("v.yaml", text)]).diagnostics == []


def test_a_schema_that_names_no_fields_allows_any_value() -> None:
    text = (
        (WORKFLOW % """'result.outcome == "failed"'""")
        .replace("[{capability: prepare}, {capability: tests.run}]", "[{capability: prepare}]")
        .replace("{properties: {outcome: {const: ready}}}", "{type: object}")
    )
    assert compile_sources([("v.yaml", text)]).diagnostics == []


def test_states_and_entries_that_cannot_tell_are_passed_over_not_the_rest() -> None:
    """A state without actions, one whose capability has no output schema, and an entry on
    another event come first; the impossible guard after them is still found."""
    text = (
        (WORKFLOW % """'result.outcome == "failed"'""")
        .replace(
            "  initial_state: verify\n  states:\n",
            "  initial_state: intake\n"
            "  states:\n"
            "    intake:\n"
            "      on: [{event: order.placed, goto: prep}]\n"
            "    prep:\n"
            "      actions: [{capability: free.form}]\n"
            "      on: [{event: task.completed, guard: 'result.outcome == \"x\"', goto: verify}]\n",
        )
        .replace(
            "        - {event: task.completed, guard:",
            "        - {event: review.done, goto: done}\n        - {event: task.completed, guard:",
        )
        .replace(
            "    - {name: prepare,",
            "    - {name: free.form}\n    - {name: prepare,",
        )
    )
    diags = compile_sources([("v.yaml", text)]).diagnostics
    assert [(d.rule, d.message) for d in diags] == [
        (
            "gate-outcome-impossible",
            "transition 1 of state 'verify' waits for result.outcome == \"failed\", which no "
            "answer of capability 'tests.run' can satisfy (its output schema allows "
            'result.outcome: "passed", "implementation-failure", "say \\"hi\\"")',
        )
    ]
