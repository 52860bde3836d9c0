"""Spawn budgets across a tree of runs: ``budget.max_spawn_depth`` and
``budget.max_total_spawns``.

A spawn is an action requested. The limits a run works under come from its log: its own
``run.started`` (a child's is what the parent's ``action.requested`` handed down), the
spawns it requested and what its child runs reported when they ended. A refused spawn is
not asked for; its action fails with ``budget_exceeded`` and a code ``catch`` can match.
"""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.engine import Incoming
from interlock.core.spawn import SpawnProgress
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import LOOPER, SPAWN_CAPPED_MAP, TWO_STEP_CHILD, Run, compile_one, types

PARENT = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: parent}
spec:
  budget: {max_transitions: 20, @BUDGET@}
  initial_state: first
  states:
    first:
      actions: [{capability: prep}]
      on: [{event: task.completed, goto: delegate}]
    delegate:
      actions: [{workflow: child}]
      on: [{event: task.completed, goto: after}]
      catch:
        - {errors: [budget_exceeded], goto: refused, set: {code: "{{ result.error.code }}"}}
    after:
      actions: [{capability: wrap}]
      on: [{event: task.completed, goto: after}]
      catch:
        - {errors: [budget_exceeded], goto: refused, set: {code: "{{ result.error.code }}"}}
    refused: {type: terminal, outputs: {code: "{{ context.code }}"}}
"""


def _parent(budget: str) -> Run:
    return Run(compile_one(PARENT.replace("@BUDGET@", budget)), "r-parent")


def _child(handed: ev.SpawnBudget | None, budget: str = "") -> Run:
    child = Run(compile_one(TWO_STEP_CHILD.replace("{BUDGET}", budget)), "r-child")
    child.start(spawn=handed)
    return child


def _requested(run: Run) -> ev.ActionRequested:
    found = [r for r in run.log if isinstance(r, ev.ActionRequested)]
    return found[-1]


def _report(parent: Run, child: Run) -> None:
    """The child's end, answered to the parent's workflow action as the shell does."""
    end = child.log[-1]
    assert isinstance(end, ev.RunCompleted | ev.RunFailed)
    extensions = {"actionid": parent.pending_id(), "attempt": "1"}
    if end.data.spawns is not None:
        extensions["spawns"] = str(end.data.spawns)
    data: Any
    if isinstance(end, ev.RunCompleted):
        kind, data = "task.completed", dict(end.data.outputs)
    else:
        error = end.data.error
        kind = "task.failed"
        data = {"error": {"class": error.error_class, "message": error.message}}
        if error.code:
            data["error"]["code"] = error.code
    parent.deliver(
        Incoming(
            type=kind,
            source="interlock://runs/r-child",
            id="r-child.end",
            data=data,
            extensions=extensions,
        )
    )


def _replays(run: Run) -> None:
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_the_spawn_over_the_total_is_not_asked_for_and_fails_its_action() -> None:
    run = Run(compile_one(LOOPER))
    started = run.start()
    assert started[0].data.spawn == ev.SpawnBudget(depth=0, allowance=3)
    for _ in range(3):
        run.answer({})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {
        "why": "no spawn left: this run's share of budget.max_total_spawns (3) is spent"
    }
    requested = [r for r in run.log if isinstance(r, ev.ActionRequested)]
    assert len(requested) == 3
    refused = [r for r in run.log if isinstance(r, ev.ActionFailed)]
    assert [(r.data.error.error_class, r.data.error.code) for r in refused] == [
        ("budget_exceeded", "max_total_spawns")
    ]
    assert run.state.spawn is not None
    assert run.state.spawn.used == 3
    _replays(run)


def test_a_refused_spawn_fails_as_its_action_would_and_is_retried_by_its_policy() -> None:
    retried = LOOPER.replace(
        "[{capability: model.call}]",
        "[{capability: model.call, retry: {max_attempts: 2, errors: [budget_exceeded],"
        " backoff: {initial: 5s, jitter: false}}}]",
    )
    run = Run(compile_one(retried))
    run.start()
    run.answer({})
    run.answer({})
    records = run.answer({})  # the fourth request is refused: a failure to retry
    refused = [r for r in records if isinstance(r, ev.ActionFailed)]
    assert [ev.encode(r.data) for r in refused] == [
        b'{"action_id":"r-test:15","state":"work","index":0,"error":{"class":"budget_exceeded",'
        b'"message":"no spawn left: this run\'s share of budget.max_total_spawns (3) is spent",'
        b'"code":"max_total_spawns"},"will_retry":true}'
    ]
    records = run.fire("retry")  # attempt 2: refused again, and no attempt is left
    refused = [r for r in records if isinstance(r, ev.ActionFailed)]
    assert [(r.data.action_id, r.data.attempt, r.data.will_retry) for r in refused] == [
        ("r-test:15", 2, False)
    ]
    assert run.state.state == "over"
    _replays(run)


POLLING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: polling}
spec:
  budget: {max_total_spawns: 2}
  initial_state: poll
  states:
    poll:
      loop: {until: "result.done", max_iterations: 5, action: {capability: ci.status}}
      on: [{event: task.completed, goto: done}]
      catch: [{errors: [budget_exceeded], goto: over}]
    done: {type: terminal}
    over: {type: terminal}
"""


def test_a_refused_loop_iteration_fails_as_that_iteration() -> None:
    run = Run(compile_one(POLLING))
    run.start()
    run.answer({"done": False})
    records = run.answer({"done": False})  # iteration 3 is refused
    refused = [r for r in records if isinstance(r, ev.ActionFailed)]
    assert [(r.data.iteration, r.data.error.code) for r in refused] == [(3, "max_total_spawns")]
    assert run.state.state == "over"
    _replays(run)


def test_a_run_without_spawn_budgets_records_none() -> None:
    run = Run(compile_one(LOOPER.replace("max_total_spawns: 3, ", "")))
    run.start()
    run.answer({})
    assert run.log[0].data.spawn is None
    assert b"spawn" not in encode_state(run.state)
    assert all(getattr(r.data, "spawns", None) is None for r in run.log)


def test_depth_is_handed_down_and_a_too_deep_spawn_fails_the_parents_action() -> None:
    parent = _parent("max_spawn_depth: 1")
    parent.start()
    parent.answer({})
    request = _requested(parent)
    assert request.data.workflow == "child"
    assert request.data.spawn == ev.SpawnBudget(depth=1, max_depth=1)
    child = _child(request.data.spawn)
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, max_depth=1)
    # The child's first action would be a spawn at depth 2: refused, the child fails.
    assert types(child.log)[-2:] == ["action.failed", "run.failed"]
    failure = child.log[-1]
    assert isinstance(failure, ev.RunFailed)
    assert failure.data.error.code == "max_spawn_depth"
    assert "depth 2" in failure.data.error.message
    _report(parent, child)
    assert parent.state.state == "refused"
    assert parent.state.outputs == {"code": "max_spawn_depth"}
    _replays(parent)
    _replays(child)


def test_a_parent_without_spawn_budgets_hands_its_child_depth_one_and_nothing_else() -> None:
    parent = _parent("max_actions: 50")
    parent.start()
    parent.answer({})
    request = _requested(parent)
    assert request.data.spawn == ev.SpawnBudget(depth=1)
    # A child's own depth limit counts from where it stands in the tree.
    child = _child(request.data.spawn, "budget: {max_spawn_depth: 2}")
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, max_depth=3)


def test_a_child_keeps_the_tighter_depth_of_its_parents_and_its_own() -> None:
    handed = ev.SpawnBudget(depth=1, max_depth=5)
    child = _child(handed, "budget: {max_spawn_depth: 2}")
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, max_depth=3)
    child = _child(ev.SpawnBudget(depth=1, max_depth=2), "budget: {max_spawn_depth: 4}")
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, max_depth=2)


def test_the_total_is_shared_by_the_tree_and_a_child_is_charged_what_it_spent() -> None:
    parent = _parent("max_total_spawns: 6")
    parent.start()
    parent.answer({})  # prep: 1 spawn
    request = _requested(parent)
    # The workflow action is spawn 2; the child is handed the other 4, reserved.
    assert request.data.spawn == ev.SpawnBudget(depth=1, allowance=4)
    assert parent.state.spawn is not None
    assert parent.state.spawn.used == 6
    child = _child(request.data.spawn)
    child.answer({})
    child.answer({})
    end = child.log[-1]
    assert isinstance(end, ev.RunCompleted)
    assert end.data.spawns == 2
    _report(parent, child)
    completed = [r for r in parent.log if isinstance(r, ev.ActionCompleted)][-1]
    assert completed.data.spawns == 2
    # 1 (prep) + 1 (the child run) + 2 (its actions) + 1 (wrap, asked for since).
    assert parent.state.spawn is not None
    assert (parent.state.spawn.used, parent.state.spawn.held) == (5, {})
    parent.answer({})  # wrap again: spawn 6
    parent.answer({})  # a seventh is refused
    assert parent.state.outputs == {"code": "max_total_spawns"}
    assert len([r for r in parent.log if isinstance(r, ev.ActionRequested)]) == 4
    _replays(parent)
    _replays(child)


def test_a_child_that_spends_its_allowance_fails_and_so_does_the_parents_action() -> None:
    parent = _parent("max_total_spawns: 3")
    parent.start()
    parent.answer({})
    request = _requested(parent)
    assert request.data.spawn == ev.SpawnBudget(depth=1, allowance=1)
    child = _child(request.data.spawn)
    child.answer({})  # its one spawn; the second is refused
    end = child.log[-1]
    assert isinstance(end, ev.RunFailed)
    assert (end.data.error.code, end.data.spawns) == ("max_total_spawns", 1)
    _report(parent, child)
    assert parent.state.outputs == {"code": "max_total_spawns"}
    assert parent.state.spawn is not None
    assert parent.state.spawn.used == 3


def test_a_child_that_ends_in_a_failing_state_reports_what_it_spent() -> None:
    parent = _parent("max_total_spawns: 6")
    parent.start()
    parent.answer({})
    request = _requested(parent)
    failing = TWO_STEP_CHILD.replace(
        "done: {type: terminal}", "done: {type: terminal, fail: {message: gave up}}"
    ).replace("{BUDGET}", "")
    child = Run(compile_one(failing), "r-child")
    child.start(spawn=request.data.spawn)
    child.answer({})
    child.answer({})
    end = child.log[-1]
    assert isinstance(end, ev.RunFailed)
    assert (end.data.error.message, end.data.spawns) == ("gave up", 2)
    _report(parent, child)
    failed = [r for r in parent.log if isinstance(r, ev.ActionFailed)][-1]
    assert failed.data.spawns == 2


def test_a_childs_own_total_narrows_what_it_was_handed() -> None:
    child = _child(ev.SpawnBudget(depth=1, allowance=9), "budget: {max_total_spawns: 1}")
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, allowance=1)


def test_a_childs_own_total_does_not_widen_what_it_was_handed() -> None:
    child = _child(ev.SpawnBudget(depth=1, allowance=1), "budget: {max_total_spawns: 5}")
    assert child.log[0].data.spawn == ev.SpawnBudget(depth=1, allowance=1)


def test_a_child_whose_end_is_not_taken_keeps_its_reservation() -> None:
    parent = _parent("max_total_spawns: 10")
    parent.start()
    parent.answer({})
    parent.cancel()
    end = parent.log[-1]
    assert isinstance(end, ev.RunCancelled)
    # 1 (prep) + 1 (the child run) + its 8 reserved, never settled.
    assert end.data.spawns == 10


MAP_OF_CHILDREN = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  budget: {max_total_spawns: 13}
  initial_state: each
  states:
    each:
      map:
        over: "[1, 2, 3, 4]"
        as: n
        parallelism: 4
        action: {workflow: child}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_the_items_of_a_map_share_what_is_left_evenly() -> None:
    run = Run(compile_one(MAP_OF_CHILDREN))
    run.start()
    handed = [r.data.spawn for r in run.log if isinstance(r, ev.ActionRequested)]
    # 13: item 1 takes 1 and gets 12 // 4 = 3, leaving 9; item 2 gets 8 // 3 = 2,
    # leaving 6; item 3 gets 5 // 2 = 2, leaving 3; item 4 gets 2.
    assert [h.allowance for h in handed if h is not None] == [3, 2, 2, 2]
    assert run.state.spawn is not None
    assert run.state.spawn.used == 13


def test_a_refused_map_item_fails_the_map_once() -> None:
    run = Run(compile_one(SPAWN_CAPPED_MAP))
    run.start()
    assert run.state.state == "over"
    assert types(run.log).count("action.requested") == 2
    assert types(run.log).count("action.failed") == 1
    assert types(run.log).count("action.cancelled") == 2
    _replays(run)


DAG = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: steps}
spec:
  budget: {max_total_spawns: 1}
  initial_state: build
  states:
    build:
      dag:
        parallelism: 2
        steps:
          a: {action: {capability: work}}
          b: {action: {capability: work}}
      on: [{event: task.completed, goto: done}]
      catch: [{errors: [budget_exceeded], goto: over}]
    done: {type: terminal}
    over: {type: terminal}
"""


def test_a_refused_dag_step_fails_as_a_step() -> None:
    run = Run(compile_one(DAG))
    run.start()
    assert run.state.state == "over"
    assert types(run.log).count("action.requested") == 1
    failed = [r for r in run.log if isinstance(r, ev.ActionFailed)]
    assert [r.data.step for r in failed] == ["b"]
    _replays(run)


TWO_DAGS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: two-dags}
spec:
  budget: {max_total_spawns: 1}
  evidence: {events: [release.evidence]}
  initial_state: build
  states:
    build:
      dag:
        completion: all_settled
        parallelism: 1
        steps:
          a: {action: {capability: work}}
          b: {action: {capability: work}}
      on: [{event: task.completed, goto: ship}]
    ship:
      dag:
        steps:
          publish: {requires: {receipt: verified}, action: {capability: release.publish}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_a_dag_ended_by_a_refused_step_moves_on_and_asks_for_none_of_its_steps_again() -> None:
    run = Run(compile_one(TWO_DAGS))
    run.start()
    records = run.answer({})  # a: the one spawn; b is refused and the DAG has settled
    assert types(records) == [
        "action.completed",
        "action.failed",
        "dag.completed",
        "transition.fired",
        "state.entered",
        "dag.started",
        "gate.checked",
    ]
    assert [r.data.step for r in records if isinstance(r, ev.ActionFailed)] == ["b"]
    # The next DAG's step waits for its evidence; nothing of the DAG before is asked for.
    assert (run.state.status, run.state.state) == (RunStatus.RUNNING, "ship")
    assert run.state.dag is not None
    assert run.state.dag.status == {"publish": "held"}
    _replays(run)


DAG_OF_CHILDREN = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: steps}
spec:
  budget: {max_total_spawns: 9}
  initial_state: build
  states:
    build:
      dag:
        parallelism: 1
        steps:
          a: {action: {workflow: child}}
          b: {action: {workflow: child}}
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def test_the_steps_of_a_dag_share_what_is_left_evenly() -> None:
    run = Run(compile_one(DAG_OF_CHILDREN))
    run.start()
    first = _requested(run)
    # a takes 1 and gets 8 // 2 = 4, reserved; b, not yet asked for, keeps its share.
    assert first.data.spawn == ev.SpawnBudget(depth=1, allowance=4)
    extensions = {"actionid": first.data.action_id, "attempt": "1", "spawns": "1"}
    run.deliver(Incoming(type="task.completed", source="s", id="a.end", data={},
                         extensions=extensions))  # fmt: skip
    second = _requested(run)
    # Spent so far: 1 (a) + 1 (what a's run spent); b takes 1 and gets the other 6.
    assert second.data.step == "b"
    assert second.data.spawn == ev.SpawnBudget(depth=1, allowance=6)
    _replays(run)


def test_a_child_with_a_total_of_its_own_under_a_depth_only_parent() -> None:
    """The parent counts no total (only a depth): it reserved nothing for the child, and
    what the child reports it spent changes nothing in the parent's progress."""
    parent = _parent("max_spawn_depth: 2")
    parent.start()
    parent.answer({})
    request = _requested(parent)
    assert request.data.spawn == ev.SpawnBudget(depth=1, max_depth=2)
    child = _child(request.data.spawn, "budget: {max_total_spawns: 5}")
    child.answer({})
    child.answer({})
    end = child.log[-1]
    assert isinstance(end, ev.RunCompleted)
    assert end.data.spawns == 2
    before = parent.state.spawn
    assert before == SpawnProgress(depth=0, max_depth=2)
    _report(parent, child)
    completed = [r for r in parent.log if isinstance(r, ev.ActionCompleted)][-1]
    assert completed.data.spawns == 2
    assert parent.state.spawn == before
    assert parent.state.state == "after"
    _replays(parent)
