"""Concurrency limits in the core: a limited run starts queued (recorded, with its keys),
takes no event until admitted, is admitted once, fails at its deadline while queued; the
limits are checked with file:line:col and a rule."""

from __future__ import annotations

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.engine import Incoming
from interlock.core.limits import admitted, claims
from interlock.core.state import RunState, encode_state, fold
from interlock.core.vocabulary import RunStatus, TimerPurpose
from support.core import Run, compile_one, short

LIMITED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: limited, namespace: shop}
spec:
  inputs:
    customer: {type: string, required: true}
  deadline: {after: 1h}
  concurrency:
    - key: inputs.customer
      limit: 2
    - key: '"all:" + string(size(data))'
      limit: 50
      scope: model-api
      on_limit: skip
  initial_state: work
  states:
    work:
      actions: [{capability: echo}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""


def queued_run() -> Run:
    run = Run(compile_one(LIMITED), run_id="r1")
    run.start(
        {"customer": "acme"},
        trigger=Incoming(type="t", source="s", id="e", data={"a": 1, "b": 2}),
    )
    return run


def test_a_limited_run_starts_queued_with_its_keys() -> None:
    run = queued_run()
    assert [short(r) for r in run.log] == ["run.started", "timer.scheduled", "run.queued"]
    queued = run.log[-1]
    assert isinstance(queued, ev.RunQueued)
    assert queued.data.slots == [
        ev.SlotClaim(limit="shop/limited#1", key="acme", size=2),
        ev.SlotClaim(limit="shop/model-api", key="all:2", size=50, on_limit="skip"),
    ]
    assert run.state.queued
    assert run.state.state == ""
    assert run.state.status == RunStatus.RUNNING


def test_a_queued_run_takes_no_event_and_is_admitted_once() -> None:
    run = queued_run()
    assert run.send("task.completed", {"x": 1}) == []
    records = admitted(run.definition, run.state, run.now())
    assert [short(r) for r in records] == ["run.admitted", "state.entered", "action.requested"]
    assert isinstance(records[0], ev.RunAdmitted)
    assert records[0].data.limits == ["shop/limited#1", "shop/model-api"]
    run._apply(records)
    assert not run.state.queued
    assert run.state.state == "work"
    assert admitted(run.definition, run.state, run.now()) == []
    run.answer({})
    assert run.state.status == RunStatus.COMPLETED
    assert admitted(run.definition, run.state, run.now()) == []
    # The state folds from the log alone, byte for byte.
    assert encode_state(fold(run.log)) == encode_state(run.state)


def test_the_deadline_fails_a_queued_run_and_never_moves_it() -> None:
    run = queued_run()
    records = run.fire(TimerPurpose.RUN_DEADLINE)
    assert [short(r) for r in records] == ["timer.fired", "run.failed"]
    failed = records[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "timeout"
    assert "concurrency slot" in failed.data.error.message
    assert admitted(run.definition, run.state, run.now()) == []


def test_a_queued_run_can_be_cancelled() -> None:
    run = queued_run()
    records = run.cancel("not wanted")
    assert [short(r) for r in records] == ["run.cancelled"]
    assert run.state.status == RunStatus.CANCELLED


def test_a_key_that_cannot_be_computed_fails_the_run_at_its_start() -> None:
    text = LIMITED.replace("key: inputs.customer", "key: inputs.customer.name")
    run = Run(compile_one(text), run_id="r2")
    records = run.start({"customer": "acme"})
    assert [short(r) for r in records][-1] == "run.failed"
    failed = records[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.error_class == "schema_error"
    assert "shop/limited#1" in failed.data.error.message


def test_a_long_key_fails_the_run() -> None:
    run = Run(compile_one(LIMITED), run_id="r3")
    failed = run.start({"customer": "a" * 300})[-1]
    assert isinstance(failed, ev.RunFailed)
    assert "is 300 characters long (at most 256)" in failed.data.error.message


def test_workflows_without_limits_start_as_before() -> None:
    text = (
        LIMITED.split("  concurrency:")[0]
        + "  initial_state:"
        + LIMITED.split("  initial_state:")[1]
    )
    run = Run(compile_one(text), run_id="r4")
    records = run.start({"customer": "acme"})
    assert "run.queued" not in [short(r) for r in records]
    assert run.state.slots is None
    assert b"slots" not in encode_state(run.state)
    assert RunState().slots is None


def test_limits_are_checked_where_they_are_written() -> None:
    text = (
        LIMITED.replace("key: inputs.customer", "key: context.who")
        .replace("scope: model-api", "scope: Model_API")
        .replace("limit: 2", "limit: 0")
    )
    compiled = compile_sources([("m.yaml", text)])
    found = [f"{d.line}:{d.col} {d.rule}" for d in compiled.diagnostics]
    assert found == ["10:14 invalid-value"]
    compiled = compile_sources([("m.yaml", text.replace("limit: 0", "limit: 2"))])
    found = [f"{d.line}:{d.col} {d.rule}: {d.message}" for d in compiled.diagnostics]
    assert found == [
        "9:12 concurrency-key: a concurrency key sees only 'inputs', 'event' and 'data' "
        "(it is computed when the run starts); it reads 'context'",
        "13:14 bad-name: scope 'Model_API' must be a DNS label (lowercase letters, digits, '-')",
    ]
    twice = LIMITED.replace("      limit: 2\n", "      limit: 2\n      scope: model-api\n")
    compiled = compile_sources([("m.yaml", twice)])
    found = [f"{d.line}:{d.col} {d.rule}" for d in compiled.diagnostics]
    assert found == ["14:14 concurrency-scope"]


def test_a_limited_run_re_drives_to_its_own_log_and_explains_why_it_waited() -> None:
    run = Run(compile_one(LIMITED.replace("string(size(data))", "inputs.customer")))
    run.start({"customer": "acme"})
    run._apply(admitted(run.definition, run.state, run.now()))
    run.answer({})
    again = analysis.redrive(run.log, run.definition)
    assert [ev.encode(r) for r in again] == [ev.encode(r) for r in run.log]
    explained = analysis.explain(run.log, run.definition)
    assert explained["reproduces"] is True
    kinds = [step["input"]["kind"] for step in explained["steps"]]
    assert kinds[:2] == ["start", "admit"]
    assert explained["steps"][1]["input"]["limits"] == ["shop/limited#1", "shop/model-api"]
    # The slots are the orchestrator's, taken as recorded: without its limits (or with
    # others) the workflow takes the same path, and a replay says so.
    plain = compile_one(LIMITED.replace("  concurrency:", "  x-concurrency:"))
    assert analysis.replay(run.log, plain)["agree"] is True


def test_a_run_is_queued_with_its_priority() -> None:
    text = LIMITED.replace(
        "  deadline: {after: 1h}\n", "  priority: 'size(inputs.customer) * 10'\n"
    )
    run = Run(compile_one(text), run_id="r5")
    run.start({"customer": "acme"}, trigger=Incoming(type="t", source="s", id="e", data={}))
    queued = run.log[-1]
    assert isinstance(queued, ev.RunQueued)
    assert {s.priority for s in queued.data.slots} == {40}


def test_a_priority_that_is_not_an_integer_fails_the_run() -> None:
    text = LIMITED.replace("  deadline: {after: 1h}\n", "  priority: inputs.customer\n")
    run = Run(compile_one(text), run_id="r6")
    failed = run.start({"customer": "acme"})[-1]
    assert isinstance(failed, ev.RunFailed)
    assert failed.data.error.message == (
        "the priority is acme, not an integer from -1,000,000 to 1,000,000"
    )
    big = "  priority: 'size(inputs.customer) * 1000000'\n"
    text = LIMITED.replace("  deadline: {after: 1h}\n", big)
    failed = Run(compile_one(text), run_id="r7").start({"customer": "acme"})[-1]
    assert isinstance(failed, ev.RunFailed)
    assert "the priority is 4000000, not an integer from" in failed.data.error.message
    # One that reads nothing is every run's: refused where it is written.
    text = LIMITED.replace("  deadline: {after: 1h}\n", "  priority: '2000000'\n")
    found = [(d.rule, d.message) for d in compile_sources([("m.yaml", text)]).diagnostics]
    assert found == [
        (
            "priority",
            "the priority is always 2000000, not an integer from -1,000,000 to 1,000,000: "
            "every run would fail at its start",
        )
    ]


def test_a_weight_or_key_that_reads_nothing_and_fails_every_run_is_refused() -> None:
    """A weight of 10**9, a key of 300 characters, a fairness key that cannot be computed:
    each at its line and column, where each failed every run at its start."""
    long = '"' + "k" * 300 + '"'
    limit = f"      limit: 2\n      fair: '{long}'\n      weight: '1000000000'\n"
    text = LIMITED.replace("      limit: 2\n", limit)
    found = [
        f"{d.line}:{d.col} {d.rule} {d.message}"
        for d in compile_sources([("m.yaml", text)]).diagnostics
    ]
    assert found == [
        "11:13 concurrency-key the fairness key is always 300 characters long, not at most "
        "256: every run would fail at its start",
        "12:15 concurrency-key the weight is always 1000000000, not an integer from 1 to "
        "1,000: every run would fail at its start",
    ], found
    text = LIMITED.replace("      limit: 2\n", "      limit: 2\n      fair: '1 / 0'\n")
    (problem,) = compile_sources([("m.yaml", text)]).diagnostics
    assert problem.message.startswith("the fairness key reads nothing and cannot be computed")


def test_a_fairness_key_is_recorded_with_the_slot_and_checked() -> None:
    text = LIMITED.replace("      limit: 2\n", "      limit: 2\n      fair: inputs.customer\n")
    run = Run(compile_one(text), run_id="r8")
    run.start({"customer": "acme"}, trigger=Incoming(type="t", source="s", id="e", data={}))
    queued = run.log[-1]
    assert isinstance(queued, ev.RunQueued)
    assert [s.fair for s in queued.data.slots] == ["acme", ""]
    bad = LIMITED.replace("      limit: 2\n", "      limit: 2\n      fair: context.x\n")
    found = [f"{d.line}:{d.col} {d.rule}" for d in compile_sources([("m.yaml", bad)]).diagnostics]
    assert found == ["11:13 concurrency-key"]


def test_a_weight_is_recorded_with_the_slot_and_checked() -> None:
    weighted = (
        "      limit: 2\n      fair: inputs.customer\n      weight: 'size(inputs.customer)'\n"
    )
    text = LIMITED.replace("      limit: 2\n", weighted)
    run = Run(compile_one(text), run_id="r9")
    run.start({"customer": "acme"}, trigger=Incoming(type="t", source="s", id="e", data={}))
    queued = run.log[-1]
    assert isinstance(queued, ev.RunQueued)
    assert [(s.fair, s.weight) for s in queued.data.slots] == [("acme", 4), ("", 1)]
    # Not an integer from 1 to 1,000: the run fails at its start, saying so.
    for customer in ("", "x" * 1001):
        failed = Run(compile_one(text), run_id="r10").start({"customer": customer})[-1]
        assert isinstance(failed, ev.RunFailed)
        assert failed.data.error.message == (
            f"the weight of concurrency limit shop/limited#1 is {len(customer)}, not an "
            "integer from 1 to 1,000"
        )
    # Checked where it is written: it sees what a run starts with, and needs a fair.
    bad = text.replace("weight: 'size(inputs.customer)'", "weight: context.x")
    found = [f"{d.line}:{d.col} {d.rule}" for d in compile_sources([("m.yaml", bad)]).diagnostics]
    assert found == ["12:15 concurrency-key"]
    alone = LIMITED.replace("      limit: 2\n", "      limit: 2\n      weight: '2'\n")
    found = [
        f"{d.line}:{d.col} {d.rule} {d.message}"
        for d in compile_sources([("m.yaml", alone)]).diagnostics
    ]
    assert found == [
        "11:15 concurrency-key a weight is the share of a fairness key: it needs 'fair' beside it"
    ]


def test_limits_that_read_nothing_give_every_run_the_same_slots() -> None:
    """Keys that read nothing are computed once for a workflow: each run still gets a list
    of its own (a paused run's pause slot goes first in its own only), and keys that read
    the inputs or the event are each run's."""
    constant = LIMITED.replace("key: inputs.customer", "key: '\"all\"'").replace(
        "key: '\"all:\" + string(size(data))'", "key: '\"model\"'"
    )
    definition = compile_one(constant)
    first, problem = claims(definition, {"customer": "acme"}, None)
    assert problem is None
    assert [(c.limit, c.key) for c in first] == [
        ("shop/limited#1", "all"),
        ("shop/model-api", "model"),
    ]
    first.insert(0, first[1])
    again, _ = claims(definition, {"customer": "beta"}, None)
    assert [c.key for c in again] == ["all", "model"]
    varying = compile_one(LIMITED)
    for customer, data in (("acme", {"a": 1}), ("beta", {"a": 1, "b": 2})):
        slots, _ = claims(
            varying, {"customer": customer}, Incoming(type="t", source="s", id="e", data=data)
        )
        assert [c.key for c in slots] == [customer, f"all:{len(data)}"]
