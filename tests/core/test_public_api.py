"""The public face of the core: ``interlock.core`` exports what a tool needs, and only that.

Pinned here as temporalio/sdk-python pins its packages' exports: adding a name is a
deliberate change of this list, and removing one breaks the users who imported it.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

import interlock.core
from interlock.core import events as ev
from interlock.core.diagnostics import ManifestError
from interlock.core.expr import CompileError, ExpressionError
from interlock.core.rfc3339 import format_time, parse_time
from interlock.core.vocabulary import (
    ERROR_CLASSES,
    FINISHED,
    RETRYABLE,
    ErrorClass,
    InterlockError,
    RunStatus,
    TimerPurpose,
)

EXPORTS = [
    "ActionCancelled",
    "ActionCompleted",
    "ActionFailed",
    "ActionRequested",
    "AgentDefinition",
    "AnyRecord",
    "CapabilityDef",
    "Compiled",
    "Definition",
    "Diagnostic",
    "ErrorClass",
    "ErrorInfo",
    "EventReceived",
    "ExpressionError",
    "FINISHED",
    "GuardFailed",
    "Incoming",
    "InterlockError",
    "ManifestError",
    "MapCompleted",
    "MapStarted",
    "Record",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunForked",
    "RunMigrated",
    "RunStarted",
    "RunState",
    "RunStatus",
    "StateEntered",
    "TASK_COMPLETED",
    "TASK_FAILED",
    "TERMINAL_TYPES",
    "TIMER_FIRED",
    "TimerFired",
    "TimerPurpose",
    "TimerScheduled",
    "TransitionFired",
    "cancel",
    "compile_agent_data",
    "compile_sources",
    "compile_workflow_data",
    "compile_workflow_text",
    "decide",
    "decode",
    "decode_batch",
    "decode_lines",
    "derive_run_id",
    "encode",
    "encode_batch",
    "encode_state",
    "evolve",
    "fold",
    "format_time",
    "link",
    "matching_trigger",
    "parse_time",
    "record_type",
    "resolve_inputs",
    "start",
    "trigger_inputs",
]


def test_the_core_exports_exactly_the_pinned_names() -> None:
    assert sorted(interlock.core.__all__) == EXPORTS
    assert len(set(interlock.core.__all__)) == len(interlock.core.__all__)


@pytest.mark.parametrize("name", EXPORTS)
def test_each_export_is_the_object_its_submodule_defines(name: str) -> None:
    value = getattr(interlock.core, name)
    home = interlock.core._HOME[name]
    assert value is getattr(sys.modules[f"interlock.core.{home}"], name)
    assert name in dir(interlock.core)


def test_star_import_gives_the_exports() -> None:
    namespace: dict[str, object] = {}
    exec("from interlock.core import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == EXPORTS


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"has no attribute .nope."):
        _ = interlock.core.nope  # type: ignore[attr-defined]


def test_reading_a_log_does_not_load_the_compiler() -> None:
    """Exports load on first use: the log codec alone stays cheap to import."""
    code = (
        "import sys, interlock.core.events, interlock.core.vocabulary\n"
        "from interlock.core import decode_batch, ErrorClass\n"
        "print(sorted(m for m in sys.modules if m.startswith('interlock.core.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(
        [
            "interlock.core.events",
            "interlock.core.records",
            "interlock.core.records.actions",
            "interlock.core.records.base",
            "interlock.core.records.capacity",
            "interlock.core.records.chain",
            "interlock.core.records.flow",
            "interlock.core.records.run",
            "interlock.core.records.states",
            "interlock.core.vocabulary",
        ]
    )


def test_a_tool_drives_a_run_with_the_facade_alone() -> None:
    from interlock.core import (
        Incoming,
        RunStatus,
        compile_sources,
        decide,
        decode_batch,
        encode_batch,
        fold,
        start,
    )

    manifest = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: tiny}
spec:
  initial_state: wait
  states:
    wait:
      on:
        - event: go
          goto: done
          set: {word: "{{ data.word }}"}
    done:
      type: terminal
      outputs: {said: "{{ context.word }}"}
"""
    compiled = compile_sources([("tiny.yaml", manifest)])
    compiled.raise_for_errors()
    definition = compiled.workflows[0]
    log = start(definition, run_id="r-1", inputs={}, now="2026-01-01T00:00:00Z")
    go = Incoming(type="go", source="test", id="e-1", data={"word": "hi"})
    log += decide(definition, fold(log), go, "2026-01-01T00:00:01Z")
    state = fold(decode_batch(encode_batch(log)))
    assert state.status == RunStatus.COMPLETED
    assert state.outputs == {"said": "hi"}


# --- the vocabulary ------------------------------------------------------------------


def test_core_errors_share_the_interlock_root() -> None:
    for error in (ManifestError, ExpressionError, CompileError):
        assert issubclass(error, InterlockError)
    assert interlock.core.InterlockError is InterlockError
    assert not issubclass(InterlockError, (ValueError, RuntimeError))


def test_error_classes_are_defined_once_in_documented_order() -> None:
    assert ERROR_CLASSES == (
        "timeout",
        "cancelled",
        "budget_exceeded",
        "schema_error",
        "agent_error",
        "platform_error",
        "expression_error",
        "workflow_failed",
        "payload_too_large",
        "history_exceeded",
    )
    assert tuple(ErrorClass) == ERROR_CLASSES
    assert {"timeout", "platform_error"} == RETRYABLE


@pytest.mark.parametrize("vocabulary", [ErrorClass, RunStatus, TimerPurpose])
def test_members_are_their_strings(vocabulary: type[enum.StrEnum]) -> None:
    for member in vocabulary:
        assert member == member.value
        assert str(member) == f"{member}" == member.value
        assert ev.msgspec.json.encode(member) == f'"{member.value}"'.encode()


def test_statuses_and_purposes() -> None:
    assert [s.value for s in RunStatus] == [
        "new",
        "running",
        "completed",
        "failed",
        "cancelled",
        "continued",
    ]
    assert {"completed", "failed", "cancelled", "continued"} == FINISHED
    assert [p.value for p in TimerPurpose] == [
        "action-timeout",
        "retry",
        "state-timeout",
        "run-deadline",
        "rate",
    ]


def test_rfc3339_reads_z_and_offsets() -> None:
    assert parse_time("2026-03-01T09:00:01Z") == datetime(2026, 3, 1, 9, 0, 1, tzinfo=UTC)
    assert parse_time("2026-03-01T10:00:01+01:00") == datetime(2026, 3, 1, 9, 0, 1, tzinfo=UTC)
    assert parse_time("2026-03-01T09:00:01.250Z").microsecond == 250000
    with pytest.raises(ValueError, match="Invalid isoformat string"):
        parse_time("yesterday")


def test_rfc3339_writes_utc_with_z() -> None:
    moment = datetime(2026, 3, 1, 9, 0, 1, 123456, tzinfo=UTC)
    assert format_time(moment) == "2026-03-01T09:00:01.123Z"
    assert format_time(moment, "seconds") == "2026-03-01T09:00:01Z"
    assert format_time(moment, "auto") == "2026-03-01T09:00:01.123456Z"
    plus_two = moment.astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2026-03-01T09:00:01.123Z"
    assert format_time(plus_two, utc=False) == "2026-03-01T11:00:01.123+02:00"
    assert format_time(moment.replace(tzinfo=None)) == "2026-03-01T09:00:01.123Z"
    assert format_time(parse_time(format_time(moment))) == format_time(moment)


def test_rfc3339_takes_a_naive_moment_as_utc_whatever_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        naive = datetime(2026, 3, 1, 9, 0, 1, tzinfo=UTC).replace(tzinfo=None)
        assert format_time(naive) == "2026-03-01T09:00:01.000Z"
        east = timezone(timedelta(hours=2))
        assert format_time(datetime(2026, 3, 1, 9, 0, 1, tzinfo=east)) == (
            "2026-03-01T07:00:01.000Z"
        )
    finally:
        monkeypatch.undo()
        time.tzset()
