"""Every manifest in examples/ validates, and runs end to end on a real nats-server.

One test per path through each construct, the failure paths included. The orchestrator
runs in-process with :class:`ClockTimers` on a :class:`ManualClock`: backoffs, timeouts and
waits of hours come due when a test advances the clock. The capabilities are answered by a
real SDK worker in this process whose handlers each test scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from interlock.cli.main import main as interlock_main
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.engine import derive_run_id
from interlock.core.seen import event_key
from interlock.runtime.client import InterlockClient
from interlock.runtime.correlation import CorrelationIndex
from interlock.runtime.errors import InvalidInputs
from interlock.runtime.flow import child_run_id
from interlock.runtime.service import Orchestrator
from interlock.runtime.timers import ClockTimers
from interlock.sdk import AgentError, RetryableError, TaskContext
from interlock.transport.cloudevents import CloudEvent, decode_message
from interlock.transport.subjects import Subjects
from support.flow import (
    WAIT,
    RecordingAgents,
    ScriptedStack,
    eventually,
    of,
    worker_orchestrator,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INTERLOCK = str(Path(sys.executable).with_name("interlock"))

AGENT_FILES = [
    EXAMPLES / "control-flow-agents.yaml",
    EXAMPLES / "ingest-agents.yaml",
    REPO / "agents" / "interlock_agents" / "manifests" / "echo.yaml",
]

RUN_HERE = {
    "retry.yaml": "charge-card",
    "action-timeout.yaml": "price-quote",
    "wait-expiry.yaml": "await-approval",
    "map-all.yaml": "fetch-pages",
    "map-any.yaml": "first-mirror",
    "loop.yaml": "wait-for-ci",
    "budgets.yaml": "draft-review",
    "correlation.yaml": "order-delivery",
    "cancel.yaml": "nightly-batch",
    "typed-inputs.yaml": "provision-env",
    "subworkflow.yaml": "greet-parent",
}
"""The examples this module runs, with the workflow each test starts."""
RUN_ELSEWHERE = {
    "ingest.yaml": "tests/flow/test_flow_e2e.py",
    "code-review.yaml": "tests/flow/test_signal_cli.py",
    "debounce.yaml": "tests/flow/test_trigger_windows.py",
    "capability-limits.yaml": "tests/runtime/test_capability_limits.py",
    "concurrency.yaml": "tests/flow/test_concurrency_example.py",
}
"""Examples run end to end by other modules."""


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def workflow_files() -> list[Path]:
    return [p for p in example_files() if "\nkind: Workflow" in p.read_text()]


# --- every example is valid, and stays so ------------------------------------------------


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_example_validates_with_the_agents_files(path: Path) -> None:
    compiled = compile_sources(
        [(str(path), path.read_text())],
        agent_sources=[(str(p), p.read_text()) for p in AGENT_FILES if p != path],
    )
    assert compiled.diagnostics == []
    assert compiled.capabilities_checked


def documented_command(path: Path) -> list[str]:
    """The ``interlock validate ...`` command in an example's header comment."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#   interlock validate"):
            text = line.removeprefix("#")
            while text.endswith("\\"):
                i += 1
                text = text[:-1] + lines[i].removeprefix("#")
            return shlex.split(text)[1:]
    raise AssertionError(f"{path.name} names no `interlock validate` command in its header")


def test_the_header_parser_reads_continued_lines(tmp_path: Path) -> None:
    example = tmp_path / "x.yaml"
    example.write_text(
        "# a\n#   interlock validate a.yaml \\\n#     --agents b.yaml c.yaml\nk: v\n"
    )
    assert documented_command(example) == ["validate", "a.yaml", "--agents", "b.yaml", "c.yaml"]


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_the_validate_command_in_each_header_passes(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    argv = documented_command(path)
    assert interlock_main(argv) == 0, capsys.readouterr()


def test_every_workflow_example_is_run_end_to_end() -> None:
    names = {p.name for p in workflow_files()}
    assert names == set(RUN_HERE) | set(RUN_ELSEWHERE)
    for example, module in RUN_ELSEWHERE.items():
        assert example in (REPO / module).read_text(), f"{module} does not run {example}"


MISTAKE = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: mistake}
spec:
  budget: {max_fan_out: 4}
  initial_state: work
  states:
    work:
%s
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""

MISTAKES = [
    pytest.param(
        "      loop: {until: result.ok, action: {capability: echo}}",
        "missing-field",
        "max_iterations",
        id="loop-without-max_iterations",
    ),
    pytest.param(
        "      map: {over: inputs.xs, parallelism: 2, action: {capability: echo}}",
        "missing-field",
        "'as'",
        id="map-without-as",
    ),
    pytest.param(
        "      actions: [{capability: echo}]\n      catch: [{errors: [timeout], goto: nowhere}]",
        "unknown-goto",
        "goto 'nowhere' is not a state",
        id="catch-to-an-unknown-state",
    ),
    pytest.param(
        "      actions: [{capability: echo}]\n      timeout: {after: 1h, goto: nowhere}",
        "unknown-goto",
        "goto 'nowhere' is not a state",
        id="timeout-to-an-unknown-state",
    ),
    pytest.param(
        "      actions: [{capability: echo}]\n      catch: [{errors: [oops], goto: done}]",
        "unknown-error-class",
        "unknown error class 'oops'",
        id="unknown-error-class",
    ),
    pytest.param(
        "      map: {over: inputs.xs, as: x, parallelism: 8, action: {capability: echo}}",
        "budget",
        "parallelism 8 is above budget.max_fan_out (4)",
        id="parallelism-above-the-budget",
    ),
    pytest.param(
        "      actions: [{capability: echo, workflow: child}]",
        "action-target",
        "exactly one of capability",
        id="capability-and-workflow",
    ),
    pytest.param(
        "      actions: [{capability: echo}]\n"
        "      loop: {until: result.ok, max_iterations: 2, action: {capability: echo}}",
        "state-kind",
        "has actions and loop",
        id="actions-and-a-loop",
    ),
]


@pytest.mark.parametrize(("state", "rule", "message"), MISTAKES)
def test_a_control_flow_mistake_is_named_by_its_rule(state: str, rule: str, message: str) -> None:
    compiled = compile_sources([("mistake.yaml", MISTAKE % state)])
    assert [(d.rule, message in d.message) for d in compiled.diagnostics] == [(rule, True)], [
        str(d) for d in compiled.diagnostics
    ]


def test_a_map_with_the_default_parallelism_fits_a_small_fan_out_budget() -> None:
    state = "      map: {over: inputs.xs, as: x, action: {capability: echo}}"
    compiled = compile_sources([("mistake.yaml", MISTAKE % state)])
    assert [str(d) for d in compiled.diagnostics] == []


# --- the stack -----------------------------------------------------------------------------


async def _default(capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
    answers: dict[str, Callable[[], Any]] = {
        "payment.charge": lambda: {"receipt": f"rcpt-{inp['order']}"},
        "inventory.lookup": lambda: {"price": 12.5},
        "page.fetch": lambda: {"url": inp["url"], "position": inp["position"]},
        "mirror.download": lambda: {"mirror": inp["mirror"], "sha256": "9f86d08"},
        "ci.status": lambda: {"status": "success", "iteration": inp["iteration"]},
        "draft.write": lambda: {"text": f"{inp['topic']} ({inp['feedback'] or 'first'})"},
        "draft.review": lambda: {"score": 9, "notes": "good"},
        "warehouse.pack": lambda: {"parcel": f"P-{inp['order']}"},
        "batch.run": lambda: {"rows": 10},
        "fetch": lambda: {"rows": 3},
        "echo": lambda: inp,
    }
    return answers[capability]()


CAPABILITIES = [
    "payment.charge",
    "inventory.lookup",
    "page.fetch",
    "mirror.download",
    "ci.status",
    "draft.write",
    "draft.review",
    "warehouse.pack",
    "batch.run",
    "fetch",
    "echo",
]


class Agents(RecordingAgents):
    """The examples' capabilities, answered in this process; a test scripts a handler with
    ``agents.script(capability, handler)``."""

    def __init__(self) -> None:
        super().__init__(CAPABILITIES)
        self.calls: Counter[tuple[str, str, int]] = Counter()
        """(capability, action id, attempt) -> how often a handler ran for it."""
        self.started: set[str] = set()
        """Action ids whose handler has started."""
        self.cancelled: list[str] = []
        """Action ids whose handler was cancelled (the agent was told to stop)."""

    def received(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> None:
        self.calls[(capability, ctx.action_id, ctx.attempt)] += 1
        super().received(capability, inp, ctx)
        self.started.add(ctx.action_id)

    async def default(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        return await _default(capability, inp, ctx)

    async def handle(self, capability: str, inp: dict[str, Any], ctx: TaskContext) -> Any:
        try:
            return await super().handle(capability, inp, ctx)
        except asyncio.CancelledError:
            self.cancelled.append(ctx.action_id)
            raise


async def hang(inp: dict[str, Any], ctx: TaskContext) -> Any:
    """A handler that never answers (until it is cancelled)."""
    await asyncio.Event().wait()


class Stack(ScriptedStack[Agents]):
    def __init__(
        self,
        client: InterlockClient,
        timers: ClockTimers,
        agents: Agents,
        orchestrator: Orchestrator,
        url: str,
    ) -> None:
        super().__init__(client, timers, agents, source="test://examples")
        self.orchestrator = orchestrator
        self.url = url
        self.subjects = client.subjects

    async def start(self, workflow: str, inputs: dict[str, Any]) -> str:
        return await self.client.start(workflow, inputs)

    async def outlive(self, run_id: str, seconds: float) -> None:
        """Advance the clock past every timer the run ever set, once all are scheduled,
        and check that they did come due (a finished run keeps no timers to wait on)."""
        timer_ids = [t.timer_id for t in of(await self.records(run_id), ev.TimerScheduled)]
        assert timer_ids, "the run set no timer"
        await eventually(
            lambda: all(self.timers.knows(t) for t in timer_ids), "its timers scheduled"
        )
        assert await self.timers.advance(seconds) >= len(timer_ids)

    async def retry_pending(self, run_id: str, attempt: int) -> ev.TimerScheduledData:
        """Wait until the run waits out a backoff before ``attempt``; that retry timer."""
        state = await self.run_until(
            run_id,
            lambda s: (
                not s.pending
                and any(t.purpose == "retry" and t.attempt == attempt for t in s.timers.values())
            ),
            f"a retry timer for attempt {attempt}",
        )
        return next(
            t for t in state.timers.values() if t.purpose == "retry" and t.attempt == attempt
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "INTERLOCK_URL": self.url, "INTERLOCK_PREFIX": self.subjects.prefix}
        return subprocess.run(
            [INTERLOCK, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )


@pytest.fixture
async def stack(nats_url: str, subjects: Subjects) -> AsyncIterator[Stack]:
    agents = Agents()
    async with worker_orchestrator(
        nats_url,
        subjects,
        [*AGENT_FILES, *workflow_files()],
        agents,
        worker="example-agent",
        concurrency=16,
    ) as (client, timers, orchestrator):
        yield Stack(client, timers, agents, orchestrator, nats_url)


def types(records: list[ev.AnyRecord]) -> list[str]:
    return [ev.record_type(r).removeprefix(ev.PREFIX) for r in records]


def seconds_between(earlier: str, later: str) -> float:
    parse = datetime.fromisoformat
    return (
        parse(later.replace("Z", "+00:00")) - parse(earlier.replace("Z", "+00:00"))
    ).total_seconds()


# --- retry, backoff and catch (retry.yaml) ---------------------------------------------------


async def test_retry_waits_out_each_backoff_then_succeeds(stack: Stack) -> None:
    async def flaky(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if ctx.attempt < 3:
            raise RetryableError("card network busy")
        return {"receipt": "rcpt-1"}

    stack.agents.script("payment.charge", flaky)
    run_id = await stack.start("charge-card", {"order": "A-1", "amount": 20})
    for attempt, wait in ((2, 1), (3, 2)):
        timer = await stack.retry_pending(run_id, attempt)
        scheduled = next(
            r
            for r in await stack.records(run_id)
            if isinstance(r, ev.TimerScheduled) and r.data.timer_id == timer.timer_id
        )
        assert seconds_between(scheduled.time, timer.fire_at) == wait  # no jitter: exact
        await stack.advance(run_id, wait - 0.5)
        requested = of(await stack.records(run_id), ev.ActionRequested)
        assert len(requested) == attempt - 1, "the retry came before its backoff"
        await stack.advance(run_id, 0.5)

    state = await stack.finished(run_id)
    assert state.outputs == {"status": "charged", "receipt": "rcpt-1"}
    records = await stack.records(run_id)
    requested = of(records, ev.ActionRequested)
    assert [r.attempt for r in requested] == [1, 2, 3]
    assert len({r.action_id for r in requested}) == 1
    assert [(f.attempt, f.will_retry) for f in of(records, ev.ActionFailed)] == [
        (1, True),
        (2, True),
    ]
    assert set(stack.agents.calls.values()) == {1}  # each attempt handled once


async def test_retry_out_of_attempts_is_caught_by_error_class(stack: Stack) -> None:
    async def busy(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise RetryableError("card network busy")

    stack.agents.script("payment.charge", busy)
    run_id = await stack.start("charge-card", {"order": "A-2", "amount": 20})
    for attempt, wait in ((2, 1), (3, 2), (4, 4)):
        await stack.retry_pending(run_id, attempt)
        await stack.advance(run_id, wait)
    state = await stack.finished(run_id)
    assert state.outputs == {"status": "declined", "reason": "card network busy"}
    records = await stack.records(run_id)
    failures = of(records, ev.ActionFailed)
    assert [(f.attempt, f.error.error_class, f.will_retry) for f in failures] == [
        (1, "agent_error", True),
        (2, "agent_error", True),
        (3, "agent_error", True),
        (4, "agent_error", False),
    ]
    [fired] = of(records, ev.TransitionFired)
    assert (fired.from_state, fired.to_state, fired.event_type, fired.transition) == (
        "charge",
        "declined",
        "task.failed",
        -1,  # a catch, not an `on` entry
    )


async def test_a_schema_error_is_not_retried_and_routed_by_on_task_failed(stack: Stack) -> None:
    run_id = await stack.start("charge-card", {"order": "A-3", "amount": -5})
    state = await stack.finished(run_id)
    assert state.outputs == {"status": "rejected"}
    records = await stack.records(run_id)
    [failure] = of(records, ev.ActionFailed)
    assert failure.error.error_class == "schema_error"
    assert "amount" in failure.error.message
    assert not failure.will_retry
    [fired] = of(records, ev.TransitionFired)
    assert (fired.to_state, fired.event_type, fired.transition) == ("rejected", "task.failed", 1)
    assert not stack.agents.calls  # refused before it reached an agent


# --- action timeouts (action-timeout.yaml) ---------------------------------------------------


async def test_an_answer_in_time_wins_and_the_timeout_is_ignored(stack: Stack) -> None:
    run_id = await stack.start("price-quote", {"sku": "SKU-1"})
    state = await stack.finished(run_id)
    assert state.outputs == {"sku": "SKU-1", "price": 12.5}
    records = await stack.records(run_id)
    [requested] = of(records, ev.ActionRequested)
    assert requested.timeout_s == 5
    [timer] = of(records, ev.TimerScheduled)
    assert (timer.purpose, timer.fire_at) == ("action-timeout", requested.deadline)
    await stack.outlive(run_id, 60)  # the timer comes due: the run has finished with it
    assert len(await stack.records(run_id)) == len(records)


async def test_an_action_that_never_answers_times_out_and_fails_the_run(stack: Stack) -> None:
    stack.agents.script("inventory.lookup", hang)
    notices: list[CloudEvent] = []

    async def on_notice(msg: Msg) -> None:
        notices.append(decode_message(msg.headers, msg.data))

    control = await stack.client.nc.subscribe(stack.client.subjects.control_all, cb=on_notice)
    run_id = await stack.start("price-quote", {"sku": "SKU-2"})
    agents = stack.agents
    await eventually(lambda: agents.calls.total() == 1, "attempt 1 at the agent")
    await stack.advance(run_id, 5)  # the action's timeout
    # The agent is told to stop: its handler is cancelled.
    await eventually(lambda: len(agents.cancelled) == 1, "attempt 1 stopped")
    await stack.retry_pending(run_id, 2)
    await stack.advance(run_id, 1)  # the backoff
    await eventually(lambda: agents.calls.total() == 2, "attempt 2 at the agent")
    await stack.advance(run_id, 5)
    await eventually(lambda: len(agents.cancelled) == 2, "attempt 2 stopped")
    # The worker and this subscription each get the notice on their own connection: the
    # worker stopping says nothing about this callback having run yet.
    await eventually(lambda: len(notices) == 2, "both cancel notices seen here too")
    await control.unsubscribe()
    # Each notice names its attempt, so a worker that remembers it skips that attempt only.
    assert [(n.type, n.extensions.get("attempt")) for n in notices] == [
        ("io.interlock.task.cancel", "1"),
        ("io.interlock.task.cancel", "2"),
    ]
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "timeout"  # no catch: the run fails with the class
    records = await stack.records(run_id)
    failures = of(records, ev.ActionFailed)
    assert [(f.attempt, f.error.error_class, f.will_retry) for f in failures] == [
        (1, "timeout", True),
        (2, "timeout", False),
    ]
    assert [t.purpose for t in of(records, ev.TimerFired)] == [
        "action-timeout",
        "retry",
        "action-timeout",
    ]


# --- state timeouts: a wait with an expiry (wait-expiry.yaml) --------------------------------


async def test_a_decision_before_the_expiry_moves_the_run_on(stack: Stack) -> None:
    run_id = await stack.start("await-approval", {"change": "CHG-1"})
    await stack.in_state(run_id, "waiting")
    # Fail-closed: an approval that names no approver does not fire.
    await stack.send("approval.granted", {}, run_id=run_id, id="anonymous")
    await stack.run_until(
        run_id,
        lambda s: event_key("test://examples", "anonymous") in s.seen,
        "the approval recorded",
    )
    assert (await stack.client.state(run_id)).state == "waiting"
    await stack.send("approval.granted", {"approver": "ada"}, run_id=run_id, id="ada")
    state = await stack.finished(run_id)
    assert state.outputs == {"change": "CHG-1", "status": "approved", "approver": "ada"}
    # The expiry is stale now: when it comes due, nothing happens.
    records = await stack.records(run_id)
    await stack.outlive(run_id, 25 * 3600)
    assert len(await stack.records(run_id)) == len(records)
    assert "timer.fired" not in types(records)


async def test_a_wait_expires_once_after_its_timeout(stack: Stack) -> None:
    run_id = await stack.start("await-approval", {"change": "CHG-2"})
    await stack.in_state(run_id, "waiting")
    await stack.advance(run_id, 23 * 3600)
    assert (await stack.client.state(run_id)).state == "waiting"
    await stack.advance(run_id, 3600)
    state = await stack.finished(run_id)
    assert state.outputs == {
        "change": "CHG-2",
        "status": "expired",
        "reason": "no decision within 24h",
    }
    records = await stack.records(run_id)
    assert [t.purpose for t in of(records, ev.TimerFired)] == ["state-timeout"]
    [fired] = of(records, ev.TransitionFired)
    assert (fired.event_type, fired.to_state) == ("state.timeout", "expired")
    # An approval that comes too late changes nothing.
    late = await stack.send("approval.granted", {"approver": "bob"}, run_id=run_id, id="late")
    await stack.ingested(late)
    assert len(await stack.records(run_id)) == len(records)


# --- map, completion all (map-all.yaml) -------------------------------------------------------


async def test_map_all_joins_the_results_in_input_order(stack: Stack) -> None:
    last_requested = asyncio.Event()

    async def fetch(inp: dict[str, Any], ctx: TaskContext) -> Any:
        # The first item answers only once the last one is requested: with parallelism 2,
        # b and c have finished by then, so the items finish out of input order.
        if inp["url"] == "d":
            last_requested.set()
        if inp["url"] == "a":
            await asyncio.wait_for(last_requested.wait(), WAIT)
        return {"url": inp["url"], "position": inp["position"]}

    stack.agents.script("page.fetch", fetch)
    urls = ["a", "b", "c", "d"]
    run_id = await stack.start("fetch-pages", {"urls": urls})
    state = await stack.finished(run_id)
    assert state.outputs == {"pages": [{"url": u, "position": i} for i, u in enumerate(urls)]}
    records = await stack.records(run_id)
    assert of(records, ev.MapStarted)[0].items == urls
    completions = [d.item for d in of(records, ev.ActionCompleted)]
    assert completions != sorted(completions), "the items did not finish out of order"
    in_flight = peak = 0
    for r in records:
        if isinstance(r, ev.ActionRequested):
            in_flight += 1
            peak = max(peak, in_flight)
        elif isinstance(r, ev.ActionCompleted):
            in_flight -= 1
    assert peak == 2  # parallelism


async def test_map_all_fails_fast_and_the_failure_is_caught(stack: Stack) -> None:
    first_running = asyncio.Event()

    async def fetch(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if inp["url"] == "a":
            first_running.set()
            await asyncio.Event().wait()
        await first_running.wait()
        raise AgentError("404 not found")

    stack.agents.script("page.fetch", fetch)
    run_id = await stack.start("fetch-pages", {"urls": ["a", "missing", "c"]})
    state = await stack.finished(run_id)
    assert state.outputs == {"error": "item 1 of map 'fetch' failed: 404 not found"}
    records = await stack.records(run_id)
    [cancelled] = of(records, ev.ActionCancelled)
    assert cancelled.reason == "map failed fast"
    assert [r.item for r in of(records, ev.ActionRequested)] == [0, 1]  # c never started
    await eventually(lambda: stack.agents.cancelled == [cancelled.action_id], "item 0 stopped")


async def test_a_map_over_more_items_than_the_fan_out_budget_fails(stack: Stack) -> None:
    run_id = await stack.start("fetch-pages", {"urls": [f"u{i}" for i in range(11)]})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"  # not in the catch: the run fails
    assert "budget.max_fan_out (10)" in state.error.message
    assert "action.requested" not in types(await stack.records(run_id))


# --- map, completion any (map-any.yaml) --------------------------------------------------------


async def test_map_any_takes_the_first_success_and_cancels_the_rest(stack: Stack) -> None:
    slow_running = asyncio.Event()
    broken_answered = asyncio.Event()

    async def download(inp: dict[str, Any], ctx: TaskContext) -> Any:
        mirror = inp["mirror"]
        if mirror == "slow":
            slow_running.set()
            await asyncio.Event().wait()
        if mirror == "broken":
            broken_answered.set()
            raise AgentError("connection refused")
        await slow_running.wait()
        await broken_answered.wait()
        return {"mirror": mirror, "sha256": "9f86d08"}

    stack.agents.script("mirror.download", download)
    counters = stack.orchestrator.counters
    letters, late = (
        counters["dead_lettered:answer-not-awaited"],
        counters["answers_late:action-cancelled"],
    )
    run_id = await stack.start(
        "first-mirror", {"file": "iso", "mirrors": ["slow", "fast", "broken"]}
    )
    state = await stack.finished(run_id)
    assert state.outputs == {"mirror": "fast", "sha256": "9f86d08"}
    records = await stack.records(run_id)
    [done] = of(records, ev.MapCompleted)
    assert done.result == {"mirror": "fast", "sha256": "9f86d08"}
    requested = {r.item: r.action_id for r in of(records, ev.ActionRequested)}
    cancelled = of(records, ev.ActionCancelled)
    assert requested[0] in {c.action_id for c in cancelled}
    assert {c.reason for c in cancelled} == {"map completed (any)"}
    await eventually(lambda: requested[0] in stack.agents.cancelled, "the slow mirror stopped")
    # Its worker answered `cancelled`, as asked: a late answer, dropped, not a dead letter.
    await eventually(
        lambda: counters["answers_late:action-cancelled"] == late + 1, "the late answer dropped"
    )
    assert counters["dead_lettered:answer-not-awaited"] == letters


async def test_map_any_fails_only_when_every_item_failed(stack: Stack) -> None:
    async def down(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise AgentError(f"{inp['mirror']} is down")

    stack.agents.script("mirror.download", down)
    run_id = await stack.start("first-mirror", {"file": "iso", "mirrors": ["m1", "m2", "m3"]})
    state = await stack.finished(run_id)
    assert state.outputs == {"why": "every item of map 'download' failed; last: m3 is down"}
    records = await stack.records(run_id)
    assert len(of(records, ev.ActionFailed)) == 3
    assert "map.completed" not in types(records)


# --- loop (loop.yaml) ---------------------------------------------------------------------------


async def test_a_loop_repeats_until_its_predicate_holds(stack: Stack) -> None:
    async def ci(inp: dict[str, Any], ctx: TaskContext) -> Any:
        n = inp["iteration"]
        if n == 1:
            return {"status": "running", "iteration": n}
        if n == 2:
            return {"iteration": n}  # no status: `until` errors, recorded, the loop goes on
        return {"status": "success", "iteration": n}

    stack.agents.script("ci.status", ci)
    run_id = await stack.start("wait-for-ci", {"commit": "abc123"})
    state = await stack.finished(run_id)
    assert state.outputs == {"commit": "abc123", "checked": 3}
    records = await stack.records(run_id)
    assert [r.iteration for r in of(records, ev.ActionRequested)] == [1, 2, 3]
    assert [r["iteration"] for r in stack.agents.inputs["ci.status"]] == [1, 2, 3]
    [guard] = of(records, ev.GuardFailed)
    assert (guard.event_type, guard.transition, guard.guard) == (
        "loop.until",
        -1,
        'result.status == "success"',
    )


async def test_a_loop_past_max_iterations_fails_with_budget_exceeded(stack: Stack) -> None:
    async def pending(inp: dict[str, Any], ctx: TaskContext) -> Any:
        return {"status": "pending", "iteration": inp["iteration"]}

    stack.agents.script("ci.status", pending)
    run_id = await stack.start("wait-for-ci", {"commit": "def456"})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == "loop 'poll' did not finish in max_iterations (3)"
    assert len(of(await stack.records(run_id), ev.ActionRequested)) == 3


# --- budgets (budgets.yaml) -------------------------------------------------------------------


async def test_a_back_edge_goes_round_within_the_budget(stack: Stack) -> None:
    async def review(inp: dict[str, Any], ctx: TaskContext) -> Any:
        if "first" in inp["draft"]:
            return {"score": 5, "notes": "shorter"}
        return {"score": 9, "notes": "good"}

    stack.agents.script("draft.review", review)
    run_id = await stack.start("draft-review", {"topic": "budgets"})
    state = await stack.finished(run_id)
    assert state.outputs == {"text": "budgets (shorter)", "score": 9}
    fired = of(await stack.records(run_id), ev.TransitionFired)
    assert [(f.from_state, f.to_state) for f in fired] == [
        ("write", "review"),
        ("review", "write"),
        ("write", "review"),
        ("review", "published"),
    ]


async def test_a_back_edge_loop_exceeds_the_transition_budget(stack: Stack) -> None:
    async def never_good(inp: dict[str, Any], ctx: TaskContext) -> Any:
        return {"score": 5, "notes": "again"}

    stack.agents.script("draft.review", never_good)
    run_id = await stack.start("draft-review", {"topic": "loops"})
    state = await stack.finished(run_id)
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.error_class == "budget_exceeded"
    assert state.error.message == "more than budget.max_transitions (6) transitions"
    records = await stack.records(run_id)
    assert len(of(records, ev.TransitionFired)) == 6
    capabilities = Counter(r.capability for r in of(records, ev.ActionRequested))
    assert capabilities == {"draft.write": 4, "draft.review": 3}


# --- correlation (correlation.yaml) -----------------------------------------------------------


async def parked(stack: Stack, key: str) -> list[CloudEvent]:
    index = CorrelationIndex(stack.client.nc, stack.subjects)
    with contextlib.suppress(NotFoundError):
        return await index.parked("default", "order-delivery", key)
    return []


async def test_an_event_reaches_the_run_with_its_key_and_no_other(stack: Stack) -> None:
    one = await stack.start("order-delivery", {"order": "O-1"})
    two = await stack.start("order-delivery", {"order": "O-2"})
    await stack.in_state(one, "in_transit")
    await stack.in_state(two, "in_transit")
    await stack.send("parcel.delivered", {"order_id": "O-2", "signed_by": "bob"}, id="d-2")
    state = await stack.finished(two)
    assert state.outputs == {"order": "O-2", "parcel": "P-O-2", "signed_by": "bob"}
    [received] = of(await stack.records(two), ev.EventReceived)
    assert received.event["id"] == "d-2"
    assert "runid" not in received.event
    assert (await stack.client.state(one)).state == "in_transit"


async def test_an_event_before_its_run_waits_is_parked_then_taken(stack: Stack) -> None:
    release = asyncio.Event()

    async def pack(inp: dict[str, Any], ctx: TaskContext) -> Any:
        await release.wait()
        return {"parcel": "P-early"}

    stack.agents.script("warehouse.pack", pack)
    run_id = await stack.start("order-delivery", {"order": "O-3"})
    await eventually(lambda: stack.agents.calls, "the warehouse packing")
    # The courier is faster than the warehouse's answer.
    await stack.send("parcel.delivered", {"order_id": "O-3", "signed_by": "eve"}, id="d-3")

    async def is_parked() -> bool:
        return [e.id for e in await parked(stack, "O-3")] == ["d-3"]

    await eventually(is_parked, "the event parked under its key")
    assert (await stack.client.state(run_id)).state == "pack"
    release.set()
    state = await stack.finished(run_id)
    assert state.outputs == {"order": "O-3", "parcel": "P-early", "signed_by": "eve"}


async def test_an_event_with_an_unknown_key_is_parked_not_lost(stack: Stack) -> None:
    await stack.send("parcel.delivered", {"order_id": "O-9", "signed_by": "kim"}, id="d-9")

    async def is_parked() -> bool:
        return [e.id for e in await parked(stack, "O-9")] == ["d-9"]

    await eventually(is_parked, "the event parked under its key")
    # The run with that key starts later, and gets the event when it can take it.
    run_id = await stack.start("order-delivery", {"order": "O-9"})
    state = await stack.finished(run_id)
    assert state.outputs == {"order": "O-9", "parcel": "P-O-9", "signed_by": "kim"}


async def test_an_event_parked_while_its_run_starts_waiting_is_not_lost(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = stack.orchestrator.flow.correlation
    park = index.park
    parking, proceed = asyncio.Event(), asyncio.Event()

    async def slow_park(*args: Any) -> None:
        parking.set()
        await proceed.wait()  # a publish that takes a moment longer than usual
        await park(*args)

    monkeypatch.setattr(index, "park", slow_park)
    release = asyncio.Event()

    async def pack(inp: dict[str, Any], ctx: TaskContext) -> Any:
        await release.wait()
        return {"parcel": "P-race"}

    stack.agents.script("warehouse.pack", pack)
    run_id = await stack.start("order-delivery", {"order": "O-race"})
    await eventually(lambda: stack.agents.calls, "the warehouse packing")
    await stack.send("parcel.delivered", {"order_id": "O-race", "signed_by": "max"}, id="d-r")
    await asyncio.wait_for(parking.wait(), WAIT)  # the run in `pack` did not take it
    release.set()
    await stack.in_state(run_id, "in_transit")
    await stack.relayed()  # the relay has offered the parked events (none yet)
    proceed.set()
    state = await stack.run_until(run_id, lambda s: s.finished, "the parked event")
    assert state.outputs == {"order": "O-race", "parcel": "P-race", "signed_by": "max"}


# --- cancellation (cancel.yaml) ---------------------------------------------------------------


async def test_cancel_stops_the_run_its_agent_and_its_timers(stack: Stack) -> None:
    stack.agents.script("batch.run", hang)
    run_id = await stack.start("nightly-batch", {"dataset": "sales"})
    state = await stack.run_until(run_id, lambda s: bool(s.pending), "its action")
    [action_id] = state.pending
    await eventually(lambda: action_id in stack.agents.started, "the batch running")

    done = await asyncio.to_thread(stack.cli, "cancel", run_id, "--reason", "maintenance")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cancelled {run_id}"
    state = await stack.client.state(run_id)
    assert state.status == "cancelled"
    records = await stack.records(run_id)
    [cancelled] = of(records, ev.RunCancelled)
    assert (cancelled.reason, cancelled.cancelled_actions) == ("maintenance", [action_id])
    await eventually(lambda: stack.agents.cancelled == [action_id], "the agent told to stop")
    # The action's 2h timeout and the state's 3h timeout come due: nothing happens.
    await stack.outlive(run_id, 4 * 3600)
    assert len(await stack.records(run_id)) == len(records)

    again = await asyncio.to_thread(stack.cli, "cancel", run_id)
    assert again.returncode == 1
    assert "already cancelled" in again.stderr


# --- typed inputs (typed-inputs.yaml) ----------------------------------------------------------


async def test_typed_inputs_get_their_defaults_and_keep_their_types(stack: Stack) -> None:
    run_id = await stack.start("provision-env", {"name": "staging", "replicas": 3})
    state = await stack.finished(run_id)
    assert state.outputs == {
        "plan": {
            "name": "staging",
            "replicas": 3,
            "regions": ["eu-west"],
            "dry_run": False,
            "labels": {},
        }
    }
    assert isinstance(state.outputs["plan"]["replicas"], int)


async def test_bad_inputs_are_refused_before_a_run_exists(stack: Stack) -> None:
    with pytest.raises(InvalidInputs) as refused:
        await stack.client.start("provision-env", {"replicas": True}, run_id="r-refused")
    assert refused.value.problems == [
        "input 'name' is required (string)",
        "input 'replicas' must be integer, got boolean",
    ]
    assert await stack.records("r-refused") == []  # no log: no run

    done = await asyncio.to_thread(
        stack.cli, "start", "provision-env", "--input", '{"name": "x", "replicas": "three"}'
    )
    assert done.returncode == 1
    assert "input 'replicas' must be integer, got string" in done.stderr
    info = await stack.client.js.stream_info(stack.subjects.runs_stream)
    assert info.state.messages == 0


async def test_a_trigger_with_bad_inputs_starts_no_run(stack: Stack) -> None:
    definition, _ = await stack.client.registry.latest("provision-env")
    await stack.send("env.requested", {"name": "prod", "regions": "eu"}, id="bad")
    bad = derive_run_id(definition, "test://examples", "bad")

    async def dead_lettered() -> Any:
        with contextlib.suppress(NotFoundError):
            return await stack.client.js.get_last_msg(
                stack.subjects.dead_letter_stream, stack.subjects.dead_letter("invalid-inputs")
            )
        return None

    await eventually(dead_lettered, "the trigger event dead-lettered")
    letter = await dead_lettered()
    detail = letter.headers["Interlock-Dead-Letter-Detail"]
    assert "input 'regions' must be list[string], got string" in detail
    assert await stack.records(bad) == []

    await stack.send("env.requested", {"name": "prod", "replicas": 2}, id="good")
    good = derive_run_id(definition, "test://examples", "good")
    state = await stack.run_until(good, lambda s: s.finished, "the triggered run finished")
    assert state.outputs is not None
    assert state.outputs["plan"]["replicas"] == 2


# --- sub-workflows (subworkflow.yaml) ----------------------------------------------------------


async def test_a_child_run_binds_its_outputs_in_the_parent(stack: Stack) -> None:
    run_id = await stack.start("greet-parent", {"who": "ada"})
    state = await stack.finished(run_id)
    assert state.outputs == {"greeting": "hello ada"}
    [requested] = of(await stack.records(run_id), ev.ActionRequested)
    child = await stack.client.state(child_run_id(requested.action_id, 1))
    assert (child.workflow, child.status, child.outputs) == (
        "greet-child",
        "completed",
        {"greeting": "hello ada"},
    )


async def test_a_failed_child_run_fails_the_action_in_the_parent(stack: Stack) -> None:
    async def refuse(inp: dict[str, Any], ctx: TaskContext) -> Any:
        raise AgentError("no greetings today")

    stack.agents.script("echo", refuse)
    run_id = await stack.start("greet-parent", {"who": "bob"})
    state = await stack.finished(run_id)
    assert state.outputs == {"greeting": None}  # caught by the parent's catch ["*"]
    records = await stack.records(run_id)
    [failure] = of(records, ev.ActionFailed)
    assert failure.error.error_class == "agent_error"
    assert failure.error.message == "no greetings today"
    child = await stack.client.state(child_run_id(failure.action_id, 1))
    assert child.status == "failed"


LATE_ATTEMPTS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: late-child}
spec:
  initial_state: greet
  states:
    greet:
      actions:
        - capability: echo
          input: {message: late}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
---
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: late-parent}
spec:
  initial_state: delegate
  states:
    delegate:
      actions:
        - workflow: late-child
          retry:
            max_attempts: 12
            errors: ["*"]
            backoff: {initial: 1s, multiplier: 1, max: 1s, jitter: false}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
"""


async def test_cancelling_a_parent_cancels_the_child_of_a_late_attempt(stack: Stack) -> None:
    """Child runs of attempts past the tenth are cancelled with their parent too."""
    applied = await stack.client.apply([("late.yaml", LATE_ATTEMPTS)])
    assert applied.compiled.ok, [str(d) for d in applied.compiled.diagnostics]
    calls = 0

    async def fail_then_hang(inp: dict[str, Any], ctx: TaskContext) -> Any:
        nonlocal calls
        calls += 1
        if calls < 12:
            raise AgentError(f"attempt {calls} fails")
        await asyncio.Event().wait()

    stack.agents.script("echo", fail_then_hang)
    run_id = await stack.start("late-parent", {})
    for attempt in range(2, 13):
        await stack.retry_pending(run_id, attempt)
        await stack.advance(run_id, 1)  # once the relay has scheduled the retry timer
    state = await stack.run_until(
        run_id,
        lambda s: any(p.attempt == 12 for p in s.pending.values()),
        "attempt 12 requested",
    )
    (pending,) = state.pending.values()
    child = child_run_id(pending.action_id, 12)
    await eventually(lambda: calls == 12, "the twelfth child asked for its work")
    assert (await stack.client.state(child)).status == "running"
    assert await stack.client.cancel(run_id, "not wanted")
    child_state = await stack.run_until(child, lambda s: s.finished, "the child cancelled")
    assert child_state.status == "cancelled"
