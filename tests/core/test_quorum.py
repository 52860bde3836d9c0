"""Quorums: ``completion: {at_least: N}`` over a map or a parallel state is done once N
distinct producers (the ``source`` of each answer) have answered; who answered is in the
result; it fails as soon as the quorum can no longer be reached."""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.engine import Incoming
from interlock.core.state import encode_state, fold
from interlock.core.vocabulary import RunStatus
from support.core import Run, compile_one, types

PEERS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: peers}
spec:
  initial_state: review
  states:
    review:
      parallel:
        completion: {at_least: 2}
        actions:
          - {capability: review.alice}
          - {capability: review.bob}
          - {capability: review.carol}
      on:
        - event: task.completed
          guard: result.map(r, r.source).size() >= 2
          goto: done
      catch:
        - {errors: ["*"], goto: stuck, set: {why: "{{ result.error.code }}"}}
    done:
      type: terminal
      outputs: {by: "{{ states.review.output.map(r, r.source) }}"}
    stuck:
      type: terminal
      outputs: {why: "{{ context.why }}"}
"""


def _answer(run: Run, item: int, source: str, data: Any = None, failed: bool = False) -> None:
    action = next(a for a, p in run.state.pending.items() if p.item == item)
    run.answers += 1
    run.deliver(
        Incoming(
            type="task.failed" if failed else "task.completed",
            source=source,
            id=f"a-{run.answers}",
            data={"error": {"class": "agent_error", "message": "no"}} if failed else data,
            extensions={"actionid": action},
        )
    )


def test_the_quorum_completes_with_distinct_producers_and_cancels_the_rest() -> None:
    run = Run(compile_one(PEERS))
    run.start()
    _answer(run, 0, "interlock://agent/alice", {"ok": True})
    assert run.state.status == RunStatus.RUNNING
    _answer(run, 1, "interlock://agent/bob", {"ok": True})
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"by": ["interlock://agent/alice", "interlock://agent/bob"]}
    cancelled = [r for r in run.log if isinstance(r, ev.ActionCancelled)]
    assert len(cancelled) == 1
    assert cancelled[0].data.reason == "parallel reached its quorum"
    started = next(r for r in run.log if isinstance(r, ev.MapStarted))
    assert (started.data.completion, started.data.at_least) == ("at_least", 2)
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_one_producer_answering_twice_counts_once() -> None:
    run = Run(compile_one(PEERS))
    run.start()
    _answer(run, 0, "interlock://agent/alice", {})
    _answer(run, 1, "interlock://agent/alice", {})
    assert run.state.status == RunStatus.RUNNING
    assert run.state.map is not None
    assert set(run.state.map.sources.values()) == {"interlock://agent/alice"}
    _answer(run, 2, "interlock://agent/carol", {})
    assert run.state.status == RunStatus.COMPLETED


def test_the_quorum_fails_as_soon_as_it_cannot_be_reached() -> None:
    run = Run(compile_one(PEERS))
    run.start()
    _answer(run, 0, "interlock://agent/alice", failed=True)
    assert run.state.status == RunStatus.RUNNING
    _answer(run, 1, "interlock://agent/bob", failed=True)
    # One action left: at most one more producer; the quorum of 2 is out of reach.
    assert run.state.status == RunStatus.COMPLETED
    assert run.state.outputs == {"why": "quorum_not_met"}
    assert types(run.log).count("action.cancelled") == 1


def test_each_state_visit_counts_its_own_answers() -> None:
    text = PEERS.replace(
        "          goto: done\n",
        "          goto: done\n        - {event: again, goto: review}\n",
    ).replace("at_least: 2", "at_least: 3")
    run = Run(compile_one(text))
    run.start()
    _answer(run, 0, "interlock://agent/alice", {})
    _answer(run, 1, "interlock://agent/bob", {})
    run.send("again", event_id="again-1")
    assert run.state.map is not None
    assert run.state.map.sources == {}
    _answer(run, 2, "interlock://agent/carol", {})
    assert run.state.status == RunStatus.RUNNING


def test_a_quorum_larger_than_the_parallel_actions_is_refused() -> None:
    diags = compile_sources([("q.yaml", PEERS.replace("at_least: 2", "at_least: 4"))]).diagnostics
    assert [(d.rule, d.line) for d in diags] == [("quorum-unreachable", 9)]


def _fail(run: Run, item: int, error_class: str, message: str) -> None:
    action = next(a for a, p in run.state.pending.items() if p.item == item)
    run.answers += 1
    run.deliver(
        Incoming(
            type="task.failed",
            source="interlock://agent/x",
            id=f"a-{run.answers}",
            data={"error": {"class": error_class, "message": message}},
            extensions={"actionid": action},
        )
    )


def test_an_unreachable_quorum_fails_the_run_with_the_last_actions_failure() -> None:
    # No catch: the failure is the run's, as the engine worded it.
    uncaught = PEERS[: PEERS.index("      catch:")] + PEERS[PEERS.index("    done:") :]
    run = Run(compile_one(uncaught[: uncaught.index("    stuck:")]))
    run.start()
    _fail(run, 1, "timeout", "bob timed out")
    assert run.state.status == RunStatus.RUNNING
    _fail(run, 0, "agent_error", "alice crashed")
    assert run.state.status == RunStatus.FAILED
    # The failure of the last action in the state's order (not the last to arrive).
    assert run.state.error == ev.ErrorInfo(
        error_class="timeout",
        message="parallel 'review' needs 2 distinct producers, 0 answered; "
        "last action failure: bob timed out",
        code="quorum_not_met",
    )
    [cancelled] = [r for r in run.log if isinstance(r, ev.ActionCancelled)]
    assert cancelled.data.reason == "parallel cannot reach its quorum"
    assert run.state.pending == {}


VOTES = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: votes}
spec:
  initial_state: vote
  states:
    vote:
      map:
        over: '["a", "b", "c", "d"]'
        as: voter
        action: {capability: vote, input: {voter: "{{ voter }}"}}
        parallelism: 1
        completion: {at_least: 2}
      on:
        - {event: task.completed, goto: done}
    done: {type: terminal}
"""


def _vote(run: Run, source: str) -> list[ev.AnyRecord]:
    [action] = run.state.pending
    run.answers += 1
    return run.deliver(
        Incoming(
            type="task.completed",
            source=source,
            id=f"a-{run.answers}",
            data={"ok": True},
            extensions={"actionid": action},
        )
    )


def test_a_map_quorum_requests_items_until_it_is_met_and_no_more() -> None:
    run = Run(compile_one(VOTES))
    run.start()
    assert types(_vote(run, "interlock://agent/x")) == ["action.completed", "action.requested"]
    assert types(_vote(run, "interlock://agent/y")) == [
        "action.completed", "map.completed", "transition.fired", "state.entered", "run.completed",
    ]  # fmt: skip
    assert types(run.log).count("action.requested") == 2
    assert run.state.status == RunStatus.COMPLETED


def test_a_map_quorum_one_producer_cannot_meet_fails_without_a_last_failure() -> None:
    run = Run(compile_one(VOTES))
    run.start()
    for _ in range(3):
        assert types(_vote(run, "interlock://agent/x")) == ["action.completed", "action.requested"]
    assert types(_vote(run, "interlock://agent/x")) == ["action.completed", "run.failed"]
    assert run.state.error == ev.ErrorInfo(
        error_class="agent_error",
        message="map 'vote' needs 2 distinct producers, 1 answered",
        code="quorum_not_met",
    )
