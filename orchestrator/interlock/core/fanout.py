"""Fan-out: a map over a list and a parallel state, items requested up to a parallelism
and joined by their completion rule (``all``, ``any``, ``all_settled``). Pure.
"""

from __future__ import annotations

from typing import Any

from interlock.core import events as ev
from interlock.core.definition import StateDef
from interlock.core.expr import ExpressionError
from interlock.core.state import MapProgress
from interlock.core.step import error_json
from interlock.core.transitions import Transitions
from interlock.core.vocabulary import TASK_COMPLETED, ErrorClass, ItemStatus, TimerPurpose


class FanOut(Transitions):
    """A decision that also runs map and parallel states."""

    __slots__ = ()

    def start_work(self, state: StateDef) -> None:
        if state.map is not None:
            self.start_map(state)
        else:
            super().start_work(state)

    def start_map(self, state: StateDef) -> None:
        spec = state.map
        assert spec is not None
        try:
            if spec.over is None:  # a parallel state: one item per branch
                items: Any = list(range(len(spec.branches)))
            else:
                items = spec.over.evaluate(self.activation())
        except ExpressionError as exc:
            self.fail_run(ErrorClass.EXPRESSION_ERROR, f"map over of state {state.name!r}: {exc}")
            return
        if not isinstance(items, list):
            self.fail_run(
                ErrorClass.EXPRESSION_ERROR,
                f"map over of state {state.name!r} gave {type(items).__name__}, not a list",
            )
            return
        fan_out = self.definition.budget.max_fan_out
        if len(items) > fan_out:
            self.failed(
                ev.ErrorInfo(
                    error_class=ErrorClass.BUDGET_EXCEEDED,
                    message=f"map over {len(items)} items is above budget.max_fan_out ({fan_out})",
                ),
                None,
            )
            return
        self.emit(
            ev.MapStarted,
            ev.MapStartedData(
                state=state.name,
                items=items,
                parallelism=spec.parallelism,
                completion=spec.completion,
                at_least=spec.at_least,
            ),
        )
        if not items:
            self.finish_map(state, [])
            return
        self.fill_map(state)

    def fill_map(self, state: StateDef) -> None:
        """Request items until ``parallelism`` are in flight or none are left."""
        spec = state.map
        assert spec is not None
        while self.running and self.state.map is not None:
            progress = self.state.map
            # An item waiting for its retry is still in flight.
            waiting = sum(
                1
                for t in self.state.timers.values()
                if t.purpose == TimerPurpose.RETRY and t.item is not None
            )
            busy = len(self.state.pending) + waiting
            if progress.next >= len(progress.items) or busy >= spec.parallelism:
                return
            if not self.request(spec.action_for(progress.next), 0, item=progress.next):
                return  # refused, and its failure decided on: that went on with the map

    def quorum_done(self, state: StateDef, progress: MapProgress, item: str, whole: str) -> bool:
        """``completion: at_least``: done once enough distinct producers have answered
        (each counted once, whatever number of items it answered); failed once that can
        no longer happen. Whether the state's work is over."""
        producers = sorted(set(progress.sources.values()))
        if len(producers) >= progress.at_least:
            self.cancel_pending(f"{whole} reached its quorum")
            result = [
                {"item": i, "source": progress.sources.get(i), "output": progress.results[i]}
                for i in sorted(progress.results)
            ]
            self.finish_map(state, result)
            return True
        ended = len(progress.results) + len(progress.failed)
        if len(producers) + len(progress.items) - ended >= progress.at_least:
            return False
        self.cancel_pending(f"{whole} cannot reach its quorum")
        last = progress.failed[max(progress.failed)] if progress.failed else None
        self.failed(
            ev.ErrorInfo(
                error_class=last.error_class if last else ErrorClass.AGENT_ERROR,
                message=f"{whole} {state.name!r} needs {progress.at_least} distinct "
                f"producers, {len(producers)} answered"
                + (f"; last {item} failure: {last.message}" if last else ""),
                code="quorum_not_met",
            ),
            None,
        )
        return True

    def finish_map(self, state: StateDef, result: Any) -> None:
        self.emit(ev.MapCompleted, ev.MapCompletedData(state=state.name, result=result))
        self.route(TASK_COMPLETED, None, result)

    def map_item_done(self, state: StateDef) -> None:
        """After an item succeeded or finally failed: finish, fail or request more."""
        progress = self.state.map
        assert progress is not None
        assert state.map is not None
        total = len(progress.items)
        # How failures name what failed: an item of a map, or an action of a parallel state.
        item, whole = ("action", "parallel") if state.map.branches else ("item", "map")
        if progress.completion == "at_least":
            if self.quorum_done(state, progress, item, whole):
                return
        elif progress.completion == "any":
            winners = sorted(progress.results)
            if winners:
                self.cancel_pending(f"{whole} completed (any)")
                self.finish_map(state, progress.results[winners[0]])
                return
            if len(progress.failed) == total:
                last = progress.failed[max(progress.failed)]
                self.failed(
                    ev.ErrorInfo(
                        error_class=last.error_class,
                        message=(
                            f"every {item} of {whole} {state.name!r} failed; last: {last.message}"
                        ),
                    ),
                    None,
                )
                return
        elif progress.completion == "all_settled":
            if len(progress.results) + len(progress.failed) == total:
                self.finish_map(state, [_settled(progress, i) for i in range(total)])
                return
        else:
            if progress.failed:
                first = min(progress.failed)
                self.cancel_pending(f"{whole} failed fast")
                error = progress.failed[first]
                self.failed(
                    ev.ErrorInfo(
                        error_class=error.error_class,
                        message=f"{item} {first} of {whole} {state.name!r} failed: {error.message}",
                    ),
                    None,
                )
                return
            if len(progress.results) == total:
                self.finish_map(state, [progress.results[i] for i in range(total)])
                return
        self.fill_map(state)


def _settled(progress: MapProgress, index: int) -> dict[str, Any]:
    """How one item of an ``all_settled`` map ended: its result, or its error.

    The status is the enum's plain text, as the record that carries it decodes."""
    if index in progress.results:
        return {"status": ItemStatus.COMPLETED.value, "result": progress.results[index]}
    error = progress.failed[index]
    return {"status": ItemStatus.FAILED.value, "error": error_json(error)}
