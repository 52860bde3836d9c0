"""Runs continued from a point of their log: a fork (a new run from a recorded step,
under the same or another definition) and a migration (a waiting run moved to another
version of its definition, when a replay says the new version agrees with its past). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgspec.structs import replace

from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.engine import resume_fork
from interlock.core.migrating import migrate, refusal
from interlock.core.redrive import boundaries
from interlock.core.replay import replay
from interlock.core.state import fold
from interlock.core.vocabulary import InterlockError, RunStatus


class NotPossible(ValueError, InterlockError):
    """A fork or a migration that cannot be made, with the reason."""


def _rename(value: str | None, old: str, new: str) -> str | None:
    if value is not None and value.startswith(old + ":"):
        return new + value[len(old) :]
    return value


def _copy_for(record: ev.AnyRecord, old: str, new: str) -> ev.AnyRecord:
    """A record of run ``old`` as the same record of run ``new``: its id, subject and the
    action and timer ids inside it (they derive from the run id) say ``new``."""
    data: Any = record.data
    changes: dict[str, Any] = {}
    for name in ("action_id", "timer_id"):
        value = getattr(data, name, None)
        if isinstance(value, str):
            changes[name] = _rename(value, old, new)
    if isinstance(record, ev.RunStarted):
        changes["parent"] = None  # a fork is a run of its own: it answers no parent
    if changes:
        data = replace(data, **changes)
    return replace(record, id=_rename(record.id, old, new) or record.id, subject=new, data=data)


def fork(
    records: Sequence[ev.AnyRecord],
    at: int,
    *,
    run_id: str,
    definition: Definition,
    version: int,
    now: str,
    paused: bool = False,
) -> list[ev.AnyRecord]:
    """The log of a new run: the first ``at`` records of ``records`` (as records of
    ``run_id``), a ``run.forked`` marker, and the state the run was in at ``at`` entered
    again under ``definition``, so its work is asked for afresh.

    ``at`` must end a decision (a log cut mid-decision is no state a run was ever in), and
    the run must still be running there, in a state ``definition`` has. ``paused``: its
    workflow is paused (the fork waits for its resumption, then for its slots).
    """
    if not records:
        raise NotPossible("the log is empty")
    origin = records[0].subject
    if not 1 <= at <= len(records):
        raise NotPossible(f"--at {at}: the log has records 1 to {len(records)}")
    if run_id == origin:
        raise NotPossible("a fork needs a run id of its own")
    ends = boundaries(records)
    if at not in ends:
        # Suggest only the ends of decisions after which the run was still running.
        ends = [
            b for b in ends if not any(ev.record_type(r) in ev.TERMINAL_TYPES for r in records[:b])
        ]
        before = max((b for b in ends if b < at), default=None)
        after = min((b for b in ends if b > at), default=None)
        near = " or ".join(str(b) for b in (before, after) if b is not None)
        raise NotPossible(
            f"record {at} is in the middle of a decision; fork at the end of one ({near})"
        )
    prefix = list(records[:at])
    state = fold(prefix)
    if state.status == RunStatus.NEW:
        raise NotPossible(f"the run had not started at record {at} (no run.started before it)")
    if state.status != RunStatus.RUNNING:
        raise NotPossible(f"the run had already ended ({state.status}) at record {at}")
    if definition.name != state.workflow or definition.namespace != state.namespace:
        raise NotPossible(
            f"the run is of workflow {state.namespace}/{state.workflow}, "
            f"not {definition.namespace}/{definition.name}"
        )
    if not state.state:
        raise NotPossible(f"at record {at} the run has not entered its first state yet")
    if state.state not in definition.states:
        raise NotPossible(
            f"at record {at} the run is in state {state.state!r}, which the definition "
            "forked onto does not have"
        )
    copied = [_copy_for(r, origin, run_id) for r in prefix]
    resumed = resume_fork(
        definition,
        fold(copied),
        origin_run_id=origin,
        origin_seq=at,
        version=version,
        now=now,
        paused=paused,
    )
    return copied + resumed


def acted_on(records: Sequence[ev.AnyRecord]) -> list[ev.AnyRecord]:
    """The records of an appended batch whose effects the shell should carry out.

    All of them, except in a fork's first batch: its copied history was acted on in the
    original run, so only the run's start (to index it) and the timers still set after the
    batch (the run's deadline) are kept from before the ``run.forked`` marker.
    """
    marker = None
    for i, r in enumerate(records):
        if type(r) is ev.RunForked:
            marker = i
            break
    if marker is None:
        return list(records)
    live = fold(records).timers
    kept = [
        r
        for r in records[:marker]
        if isinstance(r, ev.RunStarted)
        or (isinstance(r, ev.TimerScheduled) and r.data.timer_id in live)
    ]
    return kept + list(records[marker:])


def migration(
    records: Sequence[ev.AnyRecord], definition: Definition, *, version: int, now: str
) -> tuple[list[ev.AnyRecord], dict[str, Any]]:
    """The ``run.migrated`` record that moves a running run onto ``definition`` (empty when
    it cannot move) and the replay report that decided it."""
    report = replay(records, definition, version=version)
    state = fold(records)
    if state.status == RunStatus.NEW:
        report["migrate"] = "the run never started (its log holds no run.started)"
        return [], report
    if state.status != RunStatus.RUNNING:
        report["migrate"] = f"the run has ended ({state.status})"
        return [], report
    if state.version == version and state.spec_hash == definition.spec_hash:
        report["migrate"] = f"the run is on version {version} already"
        return [], report
    if not report["agree"]:
        d = report["divergence"]
        report["migrate"] = f"its log diverges from version {version} at record {d['seq']}"
        return [], report
    refused = refusal(definition, state)
    if refused is not None:
        report["migrate"] = refused
        return [], report
    report["migrate"] = None
    return migrate(definition, state, version=version, now=now), report
