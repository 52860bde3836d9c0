"""DAG states: steps that start as soon as the steps they depend on have ended as their
edges ask, several at once, with no barrier between "stages". Pure.

Every step's life is in the log: ``dag.started`` names the steps, each step's action is an
``action.requested`` (and then completed or failed) carrying the step's name, a step that
can never run is ``step.skipped``, and ``dag.completed`` gives the state its result, each
step by name with its status and output (or error).
"""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.definition import DagDef, DagStep, StateDef
from interlock.core.fanout import FanOut
from interlock.core.state import DagProgress
from interlock.core.vocabulary import STEP_ENDED, TASK_COMPLETED, StepStatus


class Dag(FanOut):
    """A decision that also runs DAG states."""

    __slots__ = ()

    def start_work(self, state: StateDef) -> None:
        if state.dag is not None:
            self.start_dag(state, state.dag)
        else:
            super().start_work(state)

    def variables(self, item: int | None, iteration: int | None) -> dict[str, Any]:
        if self.state.dag is not None:
            return {"steps": self.state.dag.view()}
        return super().variables(item, iteration)

    def start_dag(self, state: StateDef, spec: DagDef) -> None:
        self.emit(
            ev.DagStarted,
            ev.DagStartedData(
                state=state.name,
                steps=[step.name for step in spec.steps],
                parallelism=spec.parallelism,
                completion=spec.completion,
            ),
        )
        self.advance_dag(state, spec)

    def advance_dag(self, state: StateDef, spec: DagDef) -> None:
        """Skip the steps that can no longer run, hold the ones whose evidence gate is
        not open yet, and request the ones that can run (up to ``parallelism`` in
        flight); finish when every step has ended."""
        while self.running and self.state.dag is not None:
            moved: bool | None = False
            for step in spec.steps:
                moved = self.next_dag_move(state, spec, step)
                if moved is not False:
                    break
            if moved is None:
                return  # not asked for (refused by a spawn budget): decided on already
            if not moved:
                break
        final = self.state.dag
        if (
            self.running
            and final is not None
            and all(final.status.get(name) in STEP_ENDED for name in final.steps)
        ):
            result = final.view()
            self.emit(ev.DagCompleted, ev.DagCompletedData(state=state.name, result=result))
            self.route(TASK_COMPLETED, None, result)

    def next_dag_move(self, state: StateDef, spec: DagDef, step: DagStep) -> bool | None:
        """Move ``step`` on if it can (skip, hold or request it); whether it moved (None:
        a spawn budget refused it, and its failure has been decided on)."""
        progress = self.state.dag
        assert progress is not None
        status = progress.status.get(step.name)
        if status not in (None, StepStatus.HELD):
            return False
        verdict, reason = _readiness(step, progress)
        if verdict == "skip":
            self.emit(
                ev.StepSkipped, ev.StepSkippedData(state=state.name, step=step.name, reason=reason)
            )
            return True
        if verdict == "wait" or progress.running >= spec.parallelism:
            return False
        if step.gate is not None:
            missing = step.gate.missing(self.state.evidence)
            if missing and status == StepStatus.HELD and not self._gate_moved(step, missing):
                return False  # still held; what it misses was recorded when it was held
            self.emit(
                ev.GateChecked,
                ev.GateCheckedData(
                    state=state.name,
                    step=step.name,
                    subject=step.gate.subject,
                    proven=not missing,
                    missing=missing,
                ),
            )
            if missing:
                return True
        return True if self.request(step.action, 0, step=step.name) else None

    def _gate_moved(self, step: DagStep, missing: list[str]) -> bool:
        """Whether the evidence being decided on changed what a held step misses (then
        the check is recorded again, once: what the evidence did is in the log)."""
        before = self.evidence_before
        if before is None or step.name in self.regated or step.gate is None:
            return False
        self.regated.add(step.name)
        return missing != step.gate.missing(before)

    def dag_step_failed(self, state: StateDef, step: str, error: ev.ErrorInfo) -> None:
        """A step failed for good: under ``completion: all`` that fails the state unless
        some step depends on the failure; otherwise the DAG goes on."""
        spec = state.dag
        assert spec is not None
        if spec.completion == "all" and not spec.handles_failure(step):
            self.cancel_pending(f"step {step!r} of dag {state.name!r} failed")
            self.failed(
                ev.ErrorInfo(
                    error_class=error.error_class,
                    message=f"step {step!r} of dag {state.name!r} failed: {error.message}",
                    code=error.code,
                ),
                None,
            )
            return
        self.advance_dag(state, spec)


def _readiness(step: DagStep, progress: DagProgress) -> tuple[str, str]:
    """``ready``, ``wait`` (a dependency has not ended) or ``skip`` (one ended otherwise
    than its edge asks), with the reason for a skip."""
    for edge in step.depends_on:
        ended = progress.status.get(edge.step)
        if ended in STEP_ENDED and ended not in edge.on:
            wanted = " or ".join(sorted(edge.on))
            return "skip", f"{edge.step} ended {ended}; {step.name} runs on {wanted}"
    if any(progress.status.get(edge.step) not in STEP_ENDED for edge in step.depends_on):
        return "wait", ""
    return "ready", ""
