"""The records of a run's states: a state entered, a map's items, a DAG's steps and the
evidence its gates check."""

from __future__ import annotations

from typing import Any

import msgspec

from .base import PREFIX, Record


class StateEnteredData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str


class MapStartedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    items: list[Any] = []
    parallelism: int = 1
    completion: str = "all"
    at_least: int = 0
    """For ``completion: at_least`` (a quorum): how many distinct producers must answer."""


class MapCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    result: Any = None
    """``all``: the outputs in input order; ``any``: the first successful output."""


class DagStartedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DAG state began: its steps (in an order where each follows those it depends on)
    run as soon as what they depend on allows, at most ``parallelism`` at once."""

    state: str
    steps: list[str] = []
    parallelism: int = 1
    completion: str = "all"


class StepSkippedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A DAG step that will never run: a step it depends on ended otherwise than its edge
    asks (a branch not taken)."""

    state: str
    step: str
    reason: str = ""


class EvidenceRecordedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An evidence event arrived (one of the types the workflow's ``evidence.events``
    names): kept whatever state the run is in, so it counts whenever a gate is checked."""

    event: dict[str, Any]
    """A full copy of the CloudEvent; its data (``{subject: {predicate: value}}``) is
    merged into what the run has proven."""


class GateCheckedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An evidence gate was checked. A DAG step's (``step``): ``proven`` (the step starts
    now), or not (the step is held until evidence proves ``missing``). A state's, on the
    answer ``action_id`` that completed its actions: ``proven`` (the state passes), or not
    (the answer is refused and the action asked again, at the same attempt); a state's
    without actions, on the external event just received: not proven, it is not taken."""

    state: str
    step: str = ""
    subject: str
    proven: bool = False
    missing: list[str] = []
    action_id: str = ""


class DagCompletedData(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    state: str
    result: Any = None
    """Each step by name: its ``status`` (completed, failed, skipped) and its ``output`` or
    ``error``."""


class StateEntered(Record, tag=PREFIX + "state.entered", frozen=True):
    data: StateEnteredData


class MapStarted(Record, tag=PREFIX + "map.started", frozen=True):
    data: MapStartedData


class MapCompleted(Record, tag=PREFIX + "map.completed", frozen=True):
    data: MapCompletedData


class DagStarted(Record, tag=PREFIX + "dag.started", frozen=True):
    data: DagStartedData


class StepSkipped(Record, tag=PREFIX + "step.skipped", frozen=True):
    data: StepSkippedData


class DagCompleted(Record, tag=PREFIX + "dag.completed", frozen=True):
    data: DagCompletedData


class EvidenceRecorded(Record, tag=PREFIX + "evidence.recorded", frozen=True):
    data: EvidenceRecordedData


class GateChecked(Record, tag=PREFIX + "gate.checked", frozen=True):
    data: GateCheckedData
