"""The checks lowering makes on each part of a workflow, every problem of a file at once:
its rule, its message and the line and column it points at (a key for a bad name, the
value otherwise). The manifests of ``manifests/invalid`` show each rule once; these put
the checks the rules share side by side (a terminal state's other parts, map, parallel and
loop states, actions, the workflow's inputs, triggers and correlation, a DAG's graph)."""

from __future__ import annotations

import pytest

from interlock.core.compiler import compile_sources
from interlock.core.definition import DeadlineDef
from interlock.core.expr import Literal

HEAD = "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: demo}\nspec:\n"


def problems(spec: str) -> list[str]:
    """``LINE:COL RULE: MESSAGE`` of every problem of a workflow whose spec is ``spec``
    (line 5 is the spec's first line)."""
    compiled = compile_sources([("m.yaml", HEAD + spec)])
    assert compiled.workflows == []
    return [f"{d.line}:{d.col} {d.rule}: {d.message}" for d in compiled.diagnostics]


def dag(*steps: str, budget: str = "", parallelism: int | None = None) -> str:
    """A spec whose state ``work`` runs a DAG of ``steps`` (a ``name: {...}`` line each)
    and then goes to ``done``; ``budget``: the spec's budget block, a line above
    ``states``. Without it and ``parallelism`` the first step is on line 10."""
    return (
        "  initial_state: work\n"
        + (f"  budget: {budget}\n" if budget else "")
        + "  states:\n    work:\n      dag:\n"
        + (f"        parallelism: {parallelism}\n" if parallelism is not None else "")
        + "        steps:\n"
        + "".join(f"          {step}\n" for step in steps)
        + "      on: [{event: task.completed, goto: done}]\n    done: {type: terminal}\n"
    )


def test_a_terminal_state_may_hold_nothing_that_runs() -> None:
    assert problems(
        """\
  initial_state: work
  budget: {max_transitions: 50}
  states:
    work:
      actions: [{capability: echo}]
      on: [{event: "bad event", goto: done}]
    done:
      type: terminal
      actions: [{capability: echo}]
      catch: [{errors: ["*"], goto: work}]
      timeout: {after: 1m, goto: work}
"""
    ) == [
        "10:20 bad-name: event type 'bad event' must be dot-separated words",
        "13:16 terminal-transitions: terminal state 'done' has actions (a terminal state "
        "ends the run)",
        "14:14 terminal-transitions: terminal state 'done' has catch (a terminal state "
        "ends the run)",
        "15:16 terminal-transitions: terminal state 'done' has timeout (a terminal state "
        "ends the run)",
    ]


def test_a_state_name_is_checked_at_its_key() -> None:
    assert problems(
        """\
  initial_state: 1work
  states:
    1work:
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "7:5 bad-name: state name '1work' must start with a letter and hold only letters, "
        "digits, '_' or '-'"
    ]


def test_map_parallel_and_loop_states() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      map: {over: "inputs.xs", as: inputs, action: {capability: echo}}
      on: [{event: task.completed, goto: fan}]
    fan:
      map: {over: "nope(", as: 1x, action: {capability: echo}}
      on: [{event: task.completed, goto: par}]
    par:
      parallel:
        actions:
          - {capability: a}
          - {capability: b, output: {x: y}}
          - {capability: c}
      on: [{event: task.completed, goto: again}]
    again:
      loop: {until: "iteration >", max_iterations: 2, action: {capability: echo}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "8:36 bad-name: map item name 'inputs' must be an identifier other than context, "
        "data, event, inputs, result, run, states",
        "11:24 cel-compile: CEL does not compile: 'nope('",
        "11:32 bad-name: map item name '1x' must be an identifier other than context, "
        "data, event, inputs, result, run, states",
        "17:29 map-output: a parallel action has no output mapping of its own: the state's "
        "result (the list of results) becomes states.par.output; read it there or map it "
        "in a transition's set",
        "21:32 cel-compile: CEL does not compile: 'iteration >'",
    ]


@pytest.mark.parametrize(("fan_out", "found"), [(3, []), (2, ["3 parallel actions"])])
def test_parallel_actions_count_against_the_fan_out_budget(fan_out: int, found: list[str]) -> None:
    text = f"""\
  initial_state: work
  budget: {{max_fan_out: {fan_out}}}
  states:
    work:
      parallel:
        actions: [{{capability: a}}, {{capability: b}}, {{capability: c}}]
      on: [{{event: task.completed, goto: done}}]
    done: {{type: terminal}}
"""
    compiled = compile_sources([("m.yaml", HEAD + text)])
    assert [str(d) for d in compiled.diagnostics] == [
        f"m.yaml:10:18: budget: {what} are above budget.max_fan_out ({fan_out})" for what in found
    ]


def test_an_action_names_one_well_formed_target() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions:
        - {capability: "bad cap"}
        - {workflow: "Bad/Name"}
        - {capability: echo, workflow: child}
        - {input: {a: 1}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "9:24 bad-name: capability name 'bad cap' must be dot-separated words",
        "10:22 bad-name: workflow 'Bad/Name' must be NAME or NAMESPACE/NAME (DNS labels)",
        "11:11 action-target: an action names exactly one of capability (work for an agent) "
        "and workflow (a child run)",
        "12:11 action-target: an action names exactly one of capability (work for an agent) "
        "and workflow (a child run)",
    ]


def test_the_workflow_inputs_triggers_and_correlation() -> None:
    assert problems(
        """\
  initial_state: work
  triggers:
    - {event: "a..b"}
    - {event: ok, input: {n: 1, k: "{{ event.data.k +  }}"}}
  correlate:
    key: "{{ inputs.k }}"
    events: {"x y": "event.data.k", good.ev: "nope(", ok.ev: "event.data.k"}
  inputs:
    1x: {type: string}
    n: {type: integer, default: "s"}
    m: {type: strin, default: "s"}
  states:
    work:
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "7:15 bad-name: event type 'a..b' must be dot-separated words",
        "8:53 cel-compile: CEL does not compile: 'event.data.k +'",
        "11:14 bad-name: event type 'x y' must be dot-separated words",
        "11:51 cel-compile: CEL does not compile: 'nope('",
        "13:5 bad-name: input name '1x' must be an identifier",
        "14:33 input-type: default of input 'n' is not a integer",
        "15:15 input-type: unknown input type 'strin' (string, integer, number, boolean, "
        "object, list, list[<type>], any)",
    ]


def test_a_dag_step_name_and_its_parallelism() -> None:
    assert problems(
        dag(
            "1a: {action: {capability: echo}}",
            "b: {action: {capability: echo}, depends_on: [1a]}",
            budget="{max_fan_out: 2}",
            parallelism=3,
        )
    ) == [
        "10:22 budget: parallelism 3 is above budget.max_fan_out (2)",
        "12:11 bad-name: step name '1a' must start with a letter and hold only letters, "
        "digits, '_' or '-'",
    ]


def test_a_dag_cycle_names_a_step_on_it_not_one_that_only_waits_for_it() -> None:
    # 'a' waits for the cycle b -> c -> b but is not on it; 'd' is ordered.
    assert problems(
        dag(
            "d: {action: {capability: echo}}",
            "a: {action: {capability: echo}, depends_on: [d, b]}",
            "b: {action: {capability: echo}, depends_on: [d, c]}",
            "c: {action: {capability: echo}, depends_on: [b]}",
        )
    ) == ["12:11 dag-cycle: the dependencies form a cycle through step 'b': it would wait forever"]


def test_error_classes_are_checked_where_an_author_names_one() -> None:
    known = (
        "timeout, cancelled, budget_exceeded, schema_error, agent_error, platform_error, "
        "expression_error, workflow_failed, payload_too_large, history_exceeded"
    )
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions: [{capability: echo, retry: {errors: [timeout, nope, "*"]}}]
      on: [{event: task.completed, goto: done}]
      catch: [{errors: [agent_error, oops], goto: failed}]
    done: {type: terminal}
    failed:
      type: terminal
      fail: {class: boom, message: "x"}
"""
    ) == [
        f"8:62 unknown-error-class: unknown error class 'nope' (known: {known}, *)",
        f"10:38 unknown-error-class: unknown error class 'oops' (known: {known}, *)",
        # A terminal state fails with one class: '*' is not one.
        f"14:21 unknown-error-class: unknown error class 'boom' (known: {known})",
    ]


def test_a_deadline_without_goto_fails_the_run_where_it_stands() -> None:
    compiled = compile_sources(
        [
            (
                "m.yaml",
                HEAD
                + """\
  initial_state: work
  deadline: {after: 10m, set: {late: true}}
  states:
    work:
      on: [{event: go, goto: done}]
    done: {type: terminal}
""",
            )
        ]
    )
    compiled.raise_for_errors()
    assert compiled.workflows[0].deadline == DeadlineDef(600.0, None, (("late", Literal(True)),))


def test_a_cel_error_points_into_a_plain_or_folded_scalar() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      on:
        - event: task.completed
          goto: done
          guard: result.ok && nope(
        - event: task.failed
          goto: done
          guard: >
            result.ok && oops
    done: {type: terminal}
"""
    ) == [
        "12:35 cel-compile: CEL does not compile: 'result.ok && nope('",
        "16:26 cel-compile: unknown variable 'oops' in CEL (known: context, data, event, "
        "inputs, result, run, states)",
    ]


def test_a_dag_cycle_is_found_after_steps_that_wait_for_a_later_declared_one() -> None:
    # 'a' can only be ordered once 'x', declared after it, is: it is not on the cycle.
    assert problems(
        dag(
            "a: {action: {capability: echo}, depends_on: [x]}",
            "x: {action: {capability: echo}}",
            "b: {action: {capability: echo}, depends_on: [c]}",
            "c: {action: {capability: echo}, depends_on: [b]}",
        )
    ) == ["12:11 dag-cycle: the dependencies form a cycle through step 'b': it would wait forever"]


def test_every_goto_and_set_is_checked_where_it_is_written() -> None:
    assert problems(
        """\
  initial_state: work
  deadline: {after: 1h, goto: nowhere, set: {a: "{{ 1 + }}"}}
  states:
    work:
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: done, set: {b: "{{ 2 + }}"}}]
      catch: [{errors: ["*"], goto: lost, set: {c: "{{ 3 + }}"}}]
      timeout: {after: 5m, goto: gone, set: {d: "{{ 4 + }}"}}
    done: {type: terminal, outputs: {r: "{{ 5 + }}"}}
"""
    ) == [
        "6:31 unknown-goto: goto 'nowhere' is not a state (states: work, done)",
        "6:55 cel-compile: CEL does not compile: '1 +'",
        "10:63 cel-compile: CEL does not compile: '2 +'",
        "11:37 unknown-goto: goto 'lost' is not a state (states: work, done)",
        "11:58 cel-compile: CEL does not compile: '3 +'",
        "12:34 unknown-goto: goto 'gone' is not a state (states: work, done)",
        "12:55 cel-compile: CEL does not compile: '4 +'",
        "13:47 cel-compile: CEL does not compile: '5 +'",
    ]


def test_a_zero_duration_is_refused_wherever_a_duration_is_written() -> None:
    # A malformed one is refused by the structure check already; zero gets this far.
    refused = "is not a duration (a number and a unit: 250ms, 30s, 30m, 1h, 1d)"
    assert problems(
        """\
  initial_state: work
  deadline: {after: 0s}
  states:
    work:
      actions:
        - capability: echo
          timeout: 0ms
          retry: {backoff: {initial: 0s, max: 0m}}
      on: [{event: task.completed, goto: done}]
      timeout: {after: 0h, goto: done}
    done: {type: terminal}
"""
    ) == [
        f"6:21 bad-duration: '0s' {refused}",
        f"11:20 bad-duration: '0ms' {refused}",
        f"12:38 bad-duration: '0s' {refused}",
        f"12:47 bad-duration: '0m' {refused}",
        f"14:24 bad-duration: '0h' {refused}",
    ]


@pytest.mark.parametrize(
    ("budget", "where", "found"),
    [
        (
            "  budget: {edges: {a: 1, b: 2}}\n",
            "on: [{event: task.completed, goto: done, budget: [a, c]}]",
            "10:60 unknown-budget: edge budget 'c' is not declared in spec.budget.edges "
            "(declared: a, b)",
        ),
        (
            "",
            "catch: [{goto: done, budget: [x]}]",
            "10:37 unknown-budget: edge budget 'x' is not declared in spec.budget.edges "
            "(declared: none)",
        ),
    ],
)
def test_an_edge_budget_not_declared_names_those_that_are(
    budget: str, where: str, found: str
) -> None:
    spec = f"""\
  initial_state: work
{budget}  states:
    work:
      actions: [{{capability: echo}}]
      on: [{{event: task.completed, goto: done}}]
      {where}
    done: {{type: terminal}}
"""
    if where.startswith("on:"):
        spec = spec.replace("      on: [{event: task.completed, goto: done}]\n", "")
    assert problems(spec) == [found]


def test_a_gate_needs_actions_or_an_event_from_outside_not_only_answers() -> None:
    assert problems(
        """\
  initial_state: work
  evidence: {events: [scan.done]}
  states:
    work:
      gate: {requires: {scan: passed}, evidence: ["event.data.ok"]}
      on: [{event: task.failed, goto: done}, {event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "9:7 gate-placement: state 'work' has a gate but no actions and takes no event from "
        "outside: a gate checks the answer that completes a state's actions, or the event a "
        "state without actions takes (a DAG step takes requires)"
    ]


def test_a_dag_step_unknown_to_its_dag_names_every_step_there_is() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      dag:
        steps:
          a: {action: {capability: echo}}
          b: {action: {capability: echo}, depends_on: [a, z]}
          c: {action: {capability: echo}, depends_on: [c]}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "11:59 dag-unknown-step: step 'b' depends on 'z', which is not a step of this dag "
        "(steps: a, b, c)",
        "12:56 dag-self-dependency: step 'c' depends on itself",
    ]


def test_a_dag_may_run_exactly_as_many_steps_at_once_as_the_fan_out_budget() -> None:
    compiled = compile_sources(
        [
            (
                "m.yaml",
                HEAD
                + """\
  initial_state: work
  budget: {max_fan_out: 2}
  states:
    work:
      dag:
        parallelism: 2
        steps:
          a: {action: {capability: echo}}
          b: {action: {capability: echo}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
""",
            )
        ]
    )
    compiled.raise_for_errors()
    dag = compiled.workflows[0].states["work"].dag
    assert dag is not None
    assert dag.parallelism == 2
    assert [step.name for step in dag.steps] == ["a", "b"]


def test_a_problem_in_a_dag_step_s_action_points_into_that_action() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      dag:
        steps:
          a:
            action: {capability: echo, input: {n: "{{ 1 + }}"}, timeout: 0s}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "11:57 cel-compile: CEL does not compile: '1 +'",
        "11:74 bad-duration: '0s' is not a duration (a number and a unit: 250ms, 30s, 30m, 1h, 1d)",
    ]


def test_a_gate_that_nothing_could_open_is_refused_where_it_is_written() -> None:
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      gate: {requires: {scan: passed}}
      on: [{event: task.completed, goto: dag}]
    dag:
      dag:
        steps:
          ship: {action: {capability: echo}, requires: {scan: passed}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "9:13 gate-without-evidence: state 'work' has a gate that reads no evidence "
        "(gate.evidence) and the workflow declares no evidence.events: it could never pass",
        "14:56 gate-without-evidence: step 'ship' requires evidence but the workflow "
        "declares no evidence.events: its gate could never open",
    ]


def test_a_gate_on_a_map_parallel_or_loop_state_is_refused_even_with_an_event_from_outside() -> (
    None
):
    gate = 'gate: {requires: {scan: passed}, evidence: ["event.data.ok"]}'
    assert problems(
        f"""\
  initial_state: fan
  evidence: {{events: [scan.done]}}
  states:
    fan:
      map: {{over: "inputs.xs", as: x, action: {{capability: echo}}}}
      {gate}
      on: [{{event: go, goto: par}}]
    par:
      parallel: {{actions: [{{capability: a}}, {{capability: b}}]}}
      {gate}
      on: [{{event: go, goto: again}}]
    again:
      loop: {{until: "true", max_iterations: 2, action: {{capability: echo}}}}
      {gate}
      on: [{{event: go, goto: done}}]
    done: {{type: terminal}}
"""
    ) == [
        f"{line}:7 gate-placement: state '{name}' has a gate but no actions and takes no "
        "event from outside: a gate checks the answer that completes a state's actions, or "
        "the event a state without actions takes (a DAG step takes requires)"
        for line, name in ((10, "fan"), (14, "par"), (18, "again"))
    ]


def test_a_problem_in_a_gate_or_a_fail_message_points_where_it_is_written() -> None:
    assert problems(
        """\
  initial_state: work
  evidence: {events: [scan.done]}
  states:
    work:
      actions: [{capability: echo}]
      gate: {requires: {scan: passed}, evidence: ["event.data.ok", "1 +"], when: "2 +"}
      on: [{event: task.completed, goto: failed}]
    failed:
      type: terminal
      fail: {class: agent_error, message: "{{ 3 + }}"}
"""
    ) == [
        "10:71 cel-compile: CEL does not compile: '1 +'",
        "10:85 cel-compile: CEL does not compile: '2 +'",
        "14:49 cel-compile: CEL does not compile: '3 +'",
    ]


def test_a_problem_in_a_map_loop_or_parallel_action_points_into_that_action() -> None:
    assert problems(
        """\
  initial_state: fan
  states:
    fan:
      map: {over: "inputs.xs", as: x, action: {capability: echo, timeout: 0s}}
      on: [{event: task.completed, goto: again}]
    again:
      loop: {until: "true", max_iterations: 2, action: {capability: echo, timeout: 0s}}
      on: [{event: task.completed, goto: par}]
    par:
      parallel: {actions: [{capability: a}, {capability: b, timeout: 0s}]}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        f"{where} bad-duration: '0s' is not a duration (a number and a unit: 250ms, 30s, "
        "30m, 1h, 1d)"
        for where in ("8:75", "11:84", "14:70")
    ]


def test_a_problem_in_the_correlation_key_points_where_it_is_written() -> None:
    assert problems(
        """\
  initial_state: work
  correlate: {key: "{{ inputs.k + }}", events: {ok.ev: "event.data.k"}}
  states:
    work:
      on: [{event: go, goto: done}]
    done: {type: terminal}
"""
    ) == ["6:33 cel-compile: CEL does not compile: 'inputs.k +'"]


@pytest.mark.parametrize(
    ("key", "reads"),
    [
        ('"{{ context.k }}"', "'context'"),
        ('"{{ run.id }}-{{ inputs.k }}-{{ states.work.output }}"', "'run', 'states'"),
        ('"{{ result.k }}{{ data }}"', "'data', 'result'"),
        ('"$.states.work.output"', "'$.states'"),
    ],
)
def test_a_correlation_key_may_read_only_the_inputs(key: str, reads: str) -> None:
    # It is rendered as the run starts, from its inputs: there is nothing else to read yet.
    assert problems(
        f"""\
  initial_state: work
  correlate: {{key: {key}, events: {{ok.ev: "event.data.k"}}}}
  states:
    work:
      actions: [{{capability: echo}}]
      on: [{{event: task.completed, goto: done}}]
    done: {{type: terminal}}
"""
    ) == [
        "6:20 cel-compile: the correlation key sees only 'inputs' (rendered when the run "
        f"starts); it reads {reads}"
    ]


def test_a_cel_error_after_an_escape_in_a_quoted_scalar_points_where_it_is_written() -> None:
    # An escaped newline makes the expression two lines long on one line of the file;
    # each escape, and a doubled quote, is one character of the value, more of the file.
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      on:
        - {event: task.completed, goto: done, guard: "result.ok &&\\n  nope("}
        - {event: task.failed, goto: done, guard: 'result.ok && ''x'' == oops'}
        - {event: go, goto: done, set: {a: "\\x41\\u00e9\\U0001F600\\t\\"{{ 1 + }}"}}
    done: {type: terminal}
"""
    ) == [
        "10:75 cel-compile: CEL does not compile: 'nope('",
        "11:74 cel-compile: unknown variable 'oops' in CEL (known: context, data, event, "
        "inputs, result, run, states)",
        "12:74 cel-compile: CEL does not compile: '1 +'",
    ]


def test_a_cel_error_in_a_plain_scalar_holding_two_quotes_points_where_it_is_written() -> None:
    # In a plain scalar '' is CEL's empty string, written as it reads: it shifts nothing
    # (only a single-quoted scalar doubles a quote to write one).
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      on:
        - event: task.completed
          goto: done
          guard: result.name != '' && oops
    done: {type: terminal}
"""
    ) == [
        "12:39 cel-compile: unknown variable 'oops' in CEL (known: context, data, event, "
        "inputs, result, run, states)",
    ]


def test_a_template_that_begins_a_block_scalar_is_placed_where_it_is_written() -> None:
    # The template stands at the value's very start: on its first line, an expression
    # written across lines, and the same template written twice.
    assert problems(
        """\
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input:
            a: |
              {{ [1,
                2,
                3 +] }}
            b: |
              {{ 1 + }} {{ 1 + }}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
    ) == [
        "14:20 cel-compile: CEL does not compile: '3 +]'",
        "16:20 cel-compile: CEL does not compile: '1 +'",
        "16:30 cel-compile: CEL does not compile: '1 +'",
    ]
