"""The pure core of Interlock: the manifest language, its compiler and the run engine.

Nothing in this package reads a clock, draws a random number or does I/O: time and ids come
from the caller. The shell (``interlock.runtime``) reads logs, calls :func:`decide`, appends
what it returns and acts on it.

The names below are the core's public face, what a tool needs to compile manifests, drive a
run in memory and read its log::

    from interlock.core import compile_sources, start, decide, fold, decode_batch

They are loaded on first use (``import interlock.core.events`` does not pay for the
compiler); everything else in the submodules may change without notice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interlock.core.compiler import (
        Compiled,
        compile_agent_data,
        compile_sources,
        compile_workflow_data,
        compile_workflow_text,
    )
    from interlock.core.definition import (
        AgentDefinition,
        CapabilityDef,
        Definition,
        link,
        resolve_inputs,
    )
    from interlock.core.diagnostics import (
        Diagnostic,
        ManifestError,
    )
    from interlock.core.engine import (
        TASK_COMPLETED,
        TASK_FAILED,
        TIMER_FIRED,
        Incoming,
        cancel,
        decide,
        derive_run_id,
        matching_trigger,
        start,
        trigger_inputs,
    )
    from interlock.core.events import (
        TERMINAL_TYPES,
        ActionCancelled,
        ActionCompleted,
        ActionFailed,
        ActionRequested,
        AnyRecord,
        ErrorInfo,
        EventReceived,
        GuardFailed,
        MapCompleted,
        MapStarted,
        Record,
        RunCancelled,
        RunCompleted,
        RunFailed,
        RunForked,
        RunMigrated,
        RunStarted,
        StateEntered,
        TimerFired,
        TimerScheduled,
        TransitionFired,
        decode,
        decode_batch,
        decode_lines,
        encode,
        encode_batch,
        record_type,
    )
    from interlock.core.expr import (
        ExpressionError,
    )
    from interlock.core.rfc3339 import (
        format_time,
        parse_time,
    )
    from interlock.core.state import (
        RunState,
        encode_state,
        evolve,
        fold,
    )
    from interlock.core.vocabulary import (
        FINISHED,
        ErrorClass,
        InterlockError,
        RunStatus,
        TimerPurpose,
    )

_HOME: dict[str, str] = {
    "InterlockError": "vocabulary",
    "ErrorClass": "vocabulary",
    "RunStatus": "vocabulary",
    "TimerPurpose": "vocabulary",
    "FINISHED": "vocabulary",
    "Diagnostic": "diagnostics",
    "ManifestError": "diagnostics",
    "ExpressionError": "expr",
    "format_time": "rfc3339",
    "parse_time": "rfc3339",
    "Compiled": "compiler",
    "compile_sources": "compiler",
    "compile_workflow_text": "compiler",
    "compile_workflow_data": "compiler",
    "compile_agent_data": "compiler",
    "Definition": "definition",
    "AgentDefinition": "definition",
    "CapabilityDef": "definition",
    "link": "definition",
    "resolve_inputs": "definition",
    "Incoming": "engine",
    "start": "engine",
    "decide": "engine",
    "cancel": "engine",
    "derive_run_id": "engine",
    "matching_trigger": "engine",
    "trigger_inputs": "engine",
    "TIMER_FIRED": "engine",
    "TASK_COMPLETED": "engine",
    "TASK_FAILED": "engine",
    "RunState": "state",
    "fold": "state",
    "evolve": "state",
    "encode_state": "state",
    "Record": "events",
    "AnyRecord": "events",
    "RunStarted": "events",
    "StateEntered": "events",
    "ActionRequested": "events",
    "ActionCompleted": "events",
    "ActionFailed": "events",
    "ActionCancelled": "events",
    "MapStarted": "events",
    "MapCompleted": "events",
    "EventReceived": "events",
    "GuardFailed": "events",
    "TransitionFired": "events",
    "TimerScheduled": "events",
    "TimerFired": "events",
    "RunCompleted": "events",
    "RunFailed": "events",
    "RunCancelled": "events",
    "RunForked": "events",
    "RunMigrated": "events",
    "ErrorInfo": "events",
    "TERMINAL_TYPES": "events",
    "record_type": "events",
    "encode": "events",
    "decode": "events",
    "encode_batch": "events",
    "decode_batch": "events",
    "decode_lines": "events",
}
"""Each exported name and the submodule that defines it."""

__all__ = [
    "FINISHED",
    "TASK_COMPLETED",
    "TASK_FAILED",
    "TERMINAL_TYPES",
    "TIMER_FIRED",
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


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups find it without calling here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
