"""What the core tests share: compiling a manifest and driving a run step by step.

A :class:`Run` keeps the log and the state the way the shell does: every record that
``start``/``decide``/``cancel`` returns is appended to the log and folded into the state
with ``evolve``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, resolve_inputs
from interlock.core.engine import TIMER_FIRED, Incoming, cancel, decide, start
from interlock.core.state import RunState, evolve

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = Path(__file__).resolve().parents[1] / "core" / "manifests"
GOLDEN = ROOT / "tests" / "golden"
CODE_REVIEW = (GOLDEN / "code-review.yaml").read_text()
"""The golden runs' workflow, as written."""

LOOPER = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: looper}
spec:
  budget: {max_total_spawns: 3, max_transitions: 10}
  initial_state: work
  states:
    work:
      actions: [{capability: model.call}]
      on:
        - {event: task.completed, goto: work}
      catch:
        - {errors: [budget_exceeded], codes: [max_total_spawns], goto: over,
           set: {why: "{{ result.error.message }}"}}
    over: {type: terminal, outputs: {why: "{{ context.why }}"}}
"""
"""A run that asks for an action again on each answer until its spawns are spent."""

TWO_STEP_CHILD = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: child}
spec:
  {BUDGET}
  initial_state: one
  states:
    one:
      actions: [{capability: step.one}]
      on: [{event: task.completed, goto: two}]
    two:
      actions: [{capability: step.two}]
      on: [{event: task.completed, goto: done}]
    done: {type: terminal}
"""
"""A child run of two actions, one after the other; ``{BUDGET}`` is its budget line."""

SPAWN_CAPPED_MAP = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: fan}
spec:
  budget: {max_total_spawns: 2}
  initial_state: each
  states:
    each:
      map: {over: "[1, 2, 3]", as: n, parallelism: 3, action: {capability: work}}
      on: [{event: task.completed, goto: done}]
      catch: [{errors: [budget_exceeded], goto: over}]
    done: {type: terminal}
    over: {type: terminal}
"""
"""A map of three items under a spawn total of two: the third item is refused."""


def compile_one(text: str, path: str = "test.yaml") -> Definition:
    """The single workflow in ``text``; fails the test with every diagnostic otherwise."""
    compiled = compile_sources([(path, text)])
    assert not compiled.diagnostics, "\n".join(str(d) for d in compiled.diagnostics)
    assert len(compiled.workflows) == 1
    return compiled.workflows[0]


def code_review(*edits: tuple[str, str]) -> Definition:
    """The golden runs' workflow with each ``(old, new)`` edit made in turn (``old`` must
    be there; every place of it is replaced), compiled."""
    text = CODE_REVIEW
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    result = compile_sources([("code-review.yaml", text)])
    result.raise_for_errors()
    return result.workflows[0]


def golden(name: str) -> list[ev.AnyRecord]:
    """The records of the golden run log ``name`` (``tests/golden/<name>.jsonl``)."""
    return ev.decode_lines((GOLDEN / f"{name}.jsonl").read_bytes())


def at(second: int) -> str:
    """A deterministic timestamp ``second`` seconds after 2026-01-01T00:00:00Z."""
    minutes, seconds = divmod(second, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{seconds:02d}Z"


def short(record: ev.Record) -> str:
    """``run.started`` for ``io.interlock.run.started``."""
    return ev.record_type(record).removeprefix(ev.PREFIX)


class Run:
    """One run driven by hand: the log, the folded state and a clock that ticks per step."""

    def __init__(self, definition: Definition, run_id: str = "r-test") -> None:
        self.definition = definition
        self.run_id = run_id
        self.state = RunState()
        self.log: list[ev.AnyRecord] = []
        self.tick = 0
        self.answers = 0

    def _apply(self, records: list[ev.AnyRecord]) -> list[ev.AnyRecord]:
        for record in records:
            self.state = evolve(self.state, record)
        self.log.extend(records)
        return records

    def now(self) -> str:
        self.tick += 1
        return at(self.tick)

    def start(self, inputs: Mapping[str, Any] | None = None, **kw: Any) -> list[ev.AnyRecord]:
        """Resolve the inputs (as the shell does before a run starts), then start."""
        resolved, problems = resolve_inputs(self.definition, inputs or {})
        assert problems == []
        return self._apply(
            start(self.definition, run_id=self.run_id, inputs=resolved, now=self.now(), **kw)
        )

    def pending_id(self) -> str:
        """The id of the one action the run waits for."""
        assert len(self.state.pending) == 1, self.state.pending
        return next(iter(self.state.pending))

    def answer(
        self,
        data: Any = None,
        *,
        type: str = "task.completed",
        action_id: str | None = None,
        event_id: str | None = None,
    ) -> list[ev.AnyRecord]:
        """An agent's answer to ``action_id`` (default: the pending action)."""
        self.answers += 1
        incoming = Incoming(
            type=type,
            source="interlock://agent/test",
            id=event_id or f"answer-{self.answers}",
            data=data,
            extensions={"actionid": action_id or self.pending_id()},
        )
        return self.deliver(incoming)

    def send(
        self,
        type: str,
        data: Any = None,
        *,
        source: str = "https://example.com/test",
        event_id: str = "e-1",
    ) -> list[ev.AnyRecord]:
        """An external CloudEvent."""
        return self.deliver(Incoming(type=type, source=source, id=event_id, data=data))

    def fire(self, purpose: str, timer_id: str | None = None) -> list[ev.AnyRecord]:
        """Deliver a due timer: ``timer_id``, else the run's only timer for ``purpose``."""
        if timer_id is None:
            due = [t for t, v in self.state.timers.items() if v.purpose == purpose]
            assert len(due) == 1, self.state.timers
            timer_id = due[0]
        return self.deliver(
            Incoming(
                type=TIMER_FIRED,
                source="interlock://timers",
                id=f"timer-{timer_id}",
                extensions={"timerid": timer_id},
            )
        )

    def deliver(self, incoming: Incoming) -> list[ev.AnyRecord]:
        return self._apply(decide(self.definition, self.state, incoming, self.now()))

    def cancel(self, reason: str = "stopped by test") -> list[ev.AnyRecord]:
        return self._apply(cancel(self.definition, self.state, reason=reason, now=self.now()))


def types(records: list[ev.AnyRecord]) -> list[str]:
    return [short(r) for r in records]
