"""A problem in an expression (of a dialect file, or a native guard) is reported where it is
written, however the YAML spells the scalar: folded (``>-``) or literal (``|``) block
scalars, plain or quoted scalars continued on the next lines, and quoted ones with escapes;
and it quotes the expression as the author wrote it, not as it was rewritten."""

from __future__ import annotations

from support.dialects import errors_of

CTXMESH = """\
apiVersion: agents.ctxmesh.ai/v1beta1
kind: Workflow
metadata: {name: errs, namespace: my-team}
spec:
  registryRef: support
  steps:
    - name: classify
      agentRef: triage-agent
      outputSchema: {type: object}
      branches:
        - when: >-
            steps.classify.output.topic == "billing"
            && steps.nope.output.x
          to: billing
        - when: |
            steps.classify.output.topic ==
              ))
          to: billing
        - {when: "steps.classify.output.a == \\"\\u00e9\\" && stepz.x", to: billing}
        - when: steps.classify.output.a == 1
            || steps.gone.output.b
          to: billing
      default: billing
    - name: billing
      agentRef: billing-agent
      input:
        a: 'input.x +'
"""


def _at(text: str, line: int, word: str) -> str:
    """``line:col`` of ``word`` on ``line`` (1-based) of ``text``."""
    return f"{line}:{text.splitlines()[line - 1].index(word) + 1}"


def test_a_ctxmesh_expression_s_problem_is_where_it_is_written() -> None:
    assert errors_of("e.yaml", CTXMESH) == [
        f"e.yaml:{_at(CTXMESH, 13, 'steps.nope')}: ctxmesh.unknown-step: steps.nope names no step",
        f"e.yaml:{_at(CTXMESH, 17, '))')}: ctxmesh.cel: CEL does not compile: '))'",
        f"e.yaml:{_at(CTXMESH, 19, 'stepz')}: ctxmesh.cel: unknown variable 'stepz' "
        "(known: input, steps)",
        f"e.yaml:{_at(CTXMESH, 21, 'steps.gone')}: ctxmesh.unknown-step: steps.gone names no step",
        # as written (input), not as rewritten (inputs), at the end where it stops
        f"e.yaml:{_at(CTXMESH, 27, '+')}: ctxmesh.cel: CEL does not compile: 'input.x +'",
    ]


WORKFILE = """\
name: errs_wf
inputs:
  subject: string
steps:
  - classify:
      agent: mail.classify
      with:
        a: >-
          {{ inputs.subject
             + nope.x }}
        b: "\\u00e9\\"{{ inputz.y }}"
        c: |
          line one
          {{ inputs.subject | upper }}
  - after:
      tool: t.x
      when: "{{ classify.category == 'a' &&
             missing.q }}"
"""


def test_a_workfile_expression_s_problem_is_where_it_is_written() -> None:
    known = "(known: after, classify, inputs, run)"
    assert errors_of("w.yaml", WORKFILE) == [
        f"w.yaml:{_at(WORKFILE, 10, 'nope')}: workfile.expression: unknown name 'nope' in "
        f"'inputs.subject\\n   + nope.x' {known}",
        f"w.yaml:{_at(WORKFILE, 11, 'inputz')}: workfile.expression: unknown name 'inputz' "
        f"in 'inputz.y' {known}",
        # a filter is refused as one, at its name
        f"w.yaml:{_at(WORKFILE, 14, 'upper')}: workfile.expression: the filter `| upper` in "
        "'inputs.subject | upper' is not supported: the Workfile format does not define its "
        "filters, so none is; write CEL functions instead (an instant: run.started_at + "
        "duration('4h'))",
        f"w.yaml:{_at(WORKFILE, 18, 'missing')}: workfile.expression: unknown name 'missing' "
        f"in \"classify.category == 'a' && missing.q\" {known}",
    ]


ZYNAX = """\
apiVersion: zynax.io/v1
kind: Workflow
metadata: {name: guards}
spec:
  initial_state: a
  states:
    a:
      type: human_in_the_loop
      on:
        - event: go
          guard: >-
            data.x == 1
            && nope.y
          goto: b
        - event: go.two
          guard: data.x == 1
            && nope2.y
          goto: b
        - event: go.three
          guard: |
            data.x == 1 &&
              ))
          goto: b
    b: {type: terminal}
"""


def test_a_native_guard_s_problem_is_where_it_is_written() -> None:
    """The zynax format (native): a guard folded or continued across lines."""
    known = "in CEL (known: context, data, event, inputs, result, run, states)"
    assert errors_of("z.yaml", ZYNAX) == [
        f"z.yaml:{_at(ZYNAX, 13, 'nope')}: cel-compile: unknown variable 'nope' {known}",
        f"z.yaml:{_at(ZYNAX, 17, 'nope2')}: cel-compile: unknown variable 'nope2' {known}",
        f"z.yaml:{_at(ZYNAX, 22, '))')}: cel-compile: CEL does not compile: '))'",
    ]


LISTED = """\
apiVersion: v1
kind: List
items:
- apiVersion: agents.ctxmesh.ai/v1beta1
  kind: Workflow
  metadata: {name: first, namespace: my-team}
  spec:
    registryRef: support
    steps:
    - {name: classify, agentRef: triage-agent, next: nowhere}
- apiVersion: agents.ctxmesh.ai/v1beta1
  kind: Workflow
  metadata: {name: second, namespace: my-team}
  spec:
    registryRef: support
"""


def test_a_kubectl_list_s_items_are_checked_each_at_its_own_place() -> None:
    assert errors_of("l.yaml", LISTED) == [
        f"l.yaml:{_at(LISTED, 10, 'nowhere')}: ctxmesh.unknown-step: next 'nowhere' names no step",
        # the second item's spec (its mapping begins at its first key)
        f"l.yaml:{_at(LISTED, 15, 'registryRef')}: ctxmesh.missing-field: missing required "
        "field 'steps'",
    ]
