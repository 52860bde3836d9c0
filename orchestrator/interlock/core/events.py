"""The run log: every record is a CloudEvent 1.0, one msgspec Struct per type.

A record's ``type`` is its tag, so one decoder reads any record straight into the right
Struct. Evolving the schema: new fields get defaults, a field never changes type, and old
types stay readable (see docs/architecture.md).

The record types are defined by family in :mod:`interlock.core.records` and imported from
here, with the union of them all (:data:`AnyRecord`), the codec and the schema catalogue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from interlock.core.records.actions import (
    ActionCancelled,
    ActionCancelledData,
    ActionCompleted,
    ActionCompletedData,
    ActionFailed,
    ActionFailedData,
    ActionRequested,
    ActionRequestedData,
    RetryInfo,
)
from interlock.core.records.base import (
    PREFIX,
    SOURCE,
    ErrorInfo,
    Record,
    SpawnBudget,
)
from interlock.core.records.capacity import (
    ActionAdmitted,
    ActionAdmittedData,
    ActionQueued,
    ActionQueuedData,
    FreedSlots,
)
from interlock.core.records.chain import ContinuedFrom, HistoryLimits
from interlock.core.records.flow import (
    EventReceived,
    EventReceivedData,
    GuardFailed,
    GuardFailedData,
    TimerFired,
    TimerFiredData,
    TimerScheduled,
    TimerScheduledData,
    TransitionFired,
    TransitionFiredData,
)
from interlock.core.records.run import (
    EventHeld,
    EventHeldData,
    ParentRef,
    RateHold,
    RunAdmitted,
    RunAdmittedData,
    RunCancelled,
    RunCancelledData,
    RunCompleted,
    RunCompletedData,
    RunContinued,
    RunContinuedData,
    RunFailed,
    RunFailedData,
    RunForked,
    RunForkedData,
    RunMigrated,
    RunMigratedData,
    RunPause,
    RunPaused,
    RunPausedData,
    RunQueued,
    RunQueuedData,
    RunResumed,
    RunResumedData,
    RunStarted,
    RunStartedData,
    SlotClaim,
    TriggerWindow,
)
from interlock.core.records.states import (
    DagCompleted,
    DagCompletedData,
    DagStarted,
    DagStartedData,
    EvidenceRecorded,
    EvidenceRecordedData,
    GateChecked,
    GateCheckedData,
    MapCompleted,
    MapCompletedData,
    MapStarted,
    MapStartedData,
    StateEntered,
    StateEnteredData,
    StepSkipped,
    StepSkippedData,
)

__all__ = [
    "BATCH_CONTENT_TYPE",
    "PREFIX",
    "RECORD_TYPES",
    "SOURCE",
    "TERMINAL_TYPES",
    "ActionAdmitted",
    "ActionAdmittedData",
    "ActionCancelled",
    "ActionCancelledData",
    "ActionCompleted",
    "ActionCompletedData",
    "ActionFailed",
    "ActionFailedData",
    "ActionQueued",
    "ActionQueuedData",
    "ActionRequested",
    "ActionRequestedData",
    "AnyRecord",
    "ContinuedFrom",
    "DagCompleted",
    "DagCompletedData",
    "DagStarted",
    "DagStartedData",
    "ErrorInfo",
    "EventHeld",
    "EventHeldData",
    "EventReceived",
    "EventReceivedData",
    "EvidenceRecorded",
    "EvidenceRecordedData",
    "FreedSlots",
    "GateChecked",
    "GateCheckedData",
    "GuardFailed",
    "GuardFailedData",
    "HistoryLimits",
    "MapCompleted",
    "MapCompletedData",
    "MapStarted",
    "MapStartedData",
    "ParentRef",
    "RateHold",
    "Record",
    "RetryInfo",
    "RunAdmitted",
    "RunAdmittedData",
    "RunCancelled",
    "RunCancelledData",
    "RunCompleted",
    "RunCompletedData",
    "RunContinued",
    "RunContinuedData",
    "RunFailed",
    "RunFailedData",
    "RunForked",
    "RunForkedData",
    "RunMigrated",
    "RunMigratedData",
    "RunPause",
    "RunPaused",
    "RunPausedData",
    "RunQueued",
    "RunQueuedData",
    "RunResumed",
    "RunResumedData",
    "RunStarted",
    "RunStartedData",
    "SlotClaim",
    "SpawnBudget",
    "StateEntered",
    "StateEnteredData",
    "StepSkipped",
    "StepSkippedData",
    "TimerFired",
    "TimerFiredData",
    "TimerScheduled",
    "TimerScheduledData",
    "TransitionFired",
    "TransitionFiredData",
    "TriggerWindow",
    "data_schemas",
    "decode",
    "decode_batch",
    "decode_lines",
    "encode",
    "encode_batch",
    "record_type",
]

AnyRecord = (
    RunStarted
    | StateEntered
    | ActionRequested
    | ActionCompleted
    | ActionFailed
    | ActionCancelled
    | MapStarted
    | MapCompleted
    | EventReceived
    | GuardFailed
    | TransitionFired
    | TimerScheduled
    | TimerFired
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunForked
    | RunMigrated
    | DagStarted
    | StepSkipped
    | DagCompleted
    | EvidenceRecorded
    | GateChecked
    | RunQueued
    | RunAdmitted
    | RunPaused
    | EventHeld
    | RunResumed
    | ActionQueued
    | ActionAdmitted
    | RunContinued
)

RECORD_TYPES: tuple[type[Record], ...] = AnyRecord.__args__
TERMINAL_TYPES = frozenset(
    {
        PREFIX + "run.completed",
        PREFIX + "run.failed",
        PREFIX + "run.cancelled",
        PREFIX + "run.continued",
    }
)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyRecord)
_list_decoder = msgspec.json.Decoder(list[AnyRecord])


def record_type(record: Record) -> str:
    """The CloudEvent ``type`` of a record."""
    return type(record).__struct_config__.tag  # type: ignore[return-value]


def encode(record: Record) -> bytes:
    """Structured-mode CloudEvent JSON of one record."""
    return _encoder.encode(record)


def decode(data: bytes | str) -> AnyRecord:
    """Decode one record; raises ``msgspec.ValidationError`` naming what is wrong."""
    return _decoder.decode(data)


BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
"""How a decision's records are stored: one JetStream message holding a JSON array of them
(the CloudEvents JSON batch format), so the append is atomic by construction."""


def encode_batch(records: Sequence[Record]) -> bytes:
    """One JSON array of records (the CloudEvents batch format)."""
    return _encoder.encode(list(records))


def decode_batch(data: bytes | str) -> list[AnyRecord]:
    """Decode a stored batch; a single record (a JSON object) is accepted too."""
    stripped = data.lstrip()
    if stripped[:1] in (b"[", "["):
        return _list_decoder.decode(data)
    return [_decoder.decode(data)]


def decode_lines(data: bytes) -> list[AnyRecord]:
    """Decode a JSONL export (one record per line, blank lines ignored)."""
    return [_decoder.decode(line) for line in data.splitlines() if line.strip()]


def data_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of each record type (the catalogue in contracts/)."""
    out: dict[str, dict[str, Any]] = {}
    for cls in RECORD_TYPES:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        schema: dict[str, Any] = msgspec.json.schema(cls)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["description"] = f"Run-log record {tag}"
        out[tag] = schema
    return out
