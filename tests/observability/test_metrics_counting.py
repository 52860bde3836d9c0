"""What the orchestrator's metrics count, against a plain reading of the records.

The metrics look each record's kind up by its type (one dict lookup, not a chain of
``isinstance``), and the run index and the write-behind do the same: these tests read the
same random records the plain way and compare every figure. The cluster gauges read the
run index with msgspec: compared with ``json.loads`` on random entries."""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from test_metrics import record

from interlock.core import events as ev
from interlock.runtime import runindex
from interlock.runtime.cluster_metrics import ClusterMetrics
from interlock.runtime.metrics import RunTracker, orchestrator_telemetry
from interlock.runtime.observe import Observers, OrchestratorObserver
from interlock.runtime.runview import RunView, action_target, epoch_seconds
from interlock.runtime.writebehind import FINISHING, leaves, waits_outside
from interlock.transport.subjects import Subjects

WORKFLOWS = ("wf", "other")
STATES = ("a", "b", "c")
CAPABILITIES = ("review", "merge", "")


def moment(rng: random.Random) -> str:
    return (
        f"2026-01-01T00:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z"
    )


def random_run(rng: random.Random, run_id: str) -> list[Any]:
    """A run's records: its start, then states, actions (answered or not), guards, events,
    timers, transitions, in a random order, and most of the time an end."""
    out: list[Any] = []

    def add(cls: type[Any], data: Any) -> None:
        out.append(record(cls, run_id, len(out) + 1, data, moment(rng)))

    if rng.random() < 0.9:  # sometimes a run seen from its middle (another replica began it)
        add(ev.RunStarted, ev.RunStartedData(workflow=rng.choice(WORKFLOWS), spec_hash="h"))
    actions: list[str] = []
    for _ in range(rng.randrange(12)):
        kind = rng.randrange(9)
        state = rng.choice(STATES)
        if kind == 0:
            add(ev.StateEntered, ev.StateEnteredData(state=state))
        elif kind == 1:
            action_id = f"{run_id}:{len(out) + 1}"
            capability = rng.choice(CAPABILITIES)
            add(
                ev.ActionRequested,
                ev.ActionRequestedData(
                    action_id=action_id,
                    state=state,
                    index=0,
                    capability=capability,
                    workflow="" if capability else "child",
                ),
            )
            actions.append(action_id)
        elif kind == 2:
            action_id = rng.choice([*actions, f"{run_id}:unknown"])
            cls = rng.choice((ev.ActionCompleted, ev.ActionFailed, ev.ActionCancelled))
            if cls is ev.ActionCompleted:
                add(cls, ev.ActionCompletedData(action_id=action_id, state=state, index=0))
            elif cls is ev.ActionFailed:
                error = ev.ErrorInfo(error_class="agent_error", message="no")
                add(
                    cls, ev.ActionFailedData(action_id=action_id, state=state, index=0, error=error)
                )
            else:
                add(cls, ev.ActionCancelledData(action_id=action_id, state=state))
        elif kind == 3:
            add(
                ev.GuardFailed,
                ev.GuardFailedData(
                    state=state, transition=0, event_type="t", guard="x > 1", error="no x"
                ),
            )
        elif kind == 4:
            add(
                ev.TransitionFired,
                ev.TransitionFiredData(from_state=state, to_state="b", event_type="t"),
            )
        elif kind == 5:
            add(ev.EventReceived, ev.EventReceivedData(event={"type": "t", "id": "1"}))
        elif kind == 6:
            add(
                ev.TimerScheduled,
                ev.TimerScheduledData(timer_id="t1", fire_at=moment(rng), purpose="timeout"),
            )
        elif kind == 7:
            add(ev.TimerFired, ev.TimerFiredData(timer_id="t1"))
        else:
            version = rng.randrange(2, 5)
            add(
                ev.RunMigrated,
                ev.RunMigratedData(
                    from_version=1,
                    from_spec_hash="h",
                    version=version,
                    spec_hash="h2",
                    checked_through=len(out),
                ),
            )
    end = rng.randrange(4)
    if end == 0:
        add(ev.RunCompleted, ev.RunCompletedData(state="a"))
    elif end == 1:
        error = ev.ErrorInfo(error_class=rng.choice(("timeout", "agent_error")), message="no")
        add(ev.RunFailed, ev.RunFailedData(state="a", error=error))
    elif end == 2:
        add(ev.RunCancelled, ev.RunCancelledData(state="a"))
    return out


def seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def plainly(runs: list[list[Any]]) -> tuple[Counter[tuple[str, tuple[str, ...]]], Any]:
    """The metrics' figures, read from the records with ``isinstance`` one record at a time:
    (sample name, label values) -> value."""
    figures: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for records in runs:
        workflow = "unknown"
        started_at = ""
        pending: dict[str, tuple[str, str]] = {}
        for r in records:
            wf = r.data.workflow if isinstance(r, ev.RunStarted) else workflow
            if isinstance(r, ev.RunStarted):
                figures["interlock_runs_started_total", (wf,)] += 1
                workflow, started_at = r.data.workflow, r.time
            elif isinstance(r, ev.StateEntered):
                figures["interlock_states_entered_total", (wf, r.data.state)] += 1
            elif isinstance(r, ev.TransitionFired):
                figures["interlock_transitions_total", (wf,)] += 1
            elif isinstance(r, ev.GuardFailed):
                figures["interlock_guard_failures_total", (wf, r.data.state)] += 1
            elif isinstance(r, ev.ActionRequested):
                target = action_target(r.data)
                figures["interlock_actions_requested_total", (target,)] += 1
                pending[r.data.action_id] = (target, r.time)
            elif isinstance(r, ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled):
                if r.data.action_id in pending:
                    target, at = pending.pop(r.data.action_id)
                    outcome = type(r).__name__.removeprefix("Action").lower()
                    labels = (target, outcome)
                    figures["interlock_action_duration_seconds_count", labels] += 1
                    took = max(seconds(r.time) - seconds(at), 0.0)
                    figures["interlock_action_duration_seconds_sum", labels] += took
            elif isinstance(r, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
                status = type(r).__name__.removeprefix("Run").lower()
                if isinstance(r, ev.RunFailed):
                    labels = (wf, r.data.error.error_class)
                    figures["interlock_runs_failed_total", labels] += 1
                else:
                    figures[f"interlock_runs_{status}_total", (wf,)] += 1
                if started_at:
                    took = max(seconds(r.time) - seconds(started_at), 0.0)
                    figures["interlock_run_duration_seconds_count", (wf, status)] += 1
                    figures["interlock_run_duration_seconds_sum", (wf, status)] += took
                break  # a run ends once
    return figures


COUNTED = (
    "interlock_runs_started_total",
    "interlock_runs_completed_total",
    "interlock_runs_failed_total",
    "interlock_runs_cancelled_total",
    "interlock_states_entered_total",
    "interlock_transitions_total",
    "interlock_guard_failures_total",
    "interlock_actions_requested_total",
    "interlock_actions_dispatched_total",
    "interlock_action_duration_seconds_count",
    "interlock_action_duration_seconds_sum",
    "interlock_run_duration_seconds_count",
    "interlock_run_duration_seconds_sum",
    "interlock_dead_letters_total",
    "interlock_redeliveries_total",
)


def scraped(registry: CollectorRegistry) -> Counter[tuple[str, tuple[str, ...]]]:
    figures: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for family in registry.collect():
        for s in family.samples:
            if s.name in COUNTED and s.value:
                figures[s.name, tuple(s.labels.values())] = s.value
    return figures


def test_record_kinds_are_looked_up_by_their_exact_type() -> None:
    """A lookup by ``type(record)`` finds what ``isinstance`` would: no record kind is a
    subclass of another."""
    for kind in ev.RECORD_TYPES:
        assert kind.__bases__ == (ev.Record,)
        assert kind.__subclasses__() == []
    assert set(runindex.INDEXED) == set(runindex._UPDATES)


@pytest.mark.parametrize("seed", range(20))
def test_the_metrics_count_what_a_plain_reading_of_the_records_counts(seed: int) -> None:
    rng = random.Random(seed)
    registry = CollectorRegistry()
    observers = Observers(orchestrator_telemetry(None, registry))
    runs = [random_run(rng, f"r{seed}x{i}") for i in range(40)]
    expected = plainly(runs)
    for records in runs:
        # The relay reports a run in pieces (one per batch of messages)...
        cut = sorted(rng.sample(range(len(records) + 1), min(2, len(records) + 1)))
        pieces = [records[: cut[0]], records[cut[0] : cut[-1]], records[cut[-1] :]]
        for piece in pieces:
            observers.relayed(records[0].subject if records else "none", piece)
        # ... and may read a run that ended again (after a failover).
        if records and isinstance(records[-1], FINISHING) and rng.random() < 0.3:
            observers.relayed(records[0].subject, records[: rng.randrange(len(records) + 1)])
        for r in records:
            if isinstance(r, ev.ActionRequested):
                observers.dispatched(r, {})
                expected["interlock_actions_dispatched_total", (action_target(r.data),)] += 1
    for reason in ("undecodable", "unauthorised", "undecodable"):
        observers.dead_lettered(reason)
        expected["interlock_dead_letters_total", (reason,)] += 1
    observers.redelivered("relay")
    expected["interlock_redeliveries_total", ("relay",)] += 1
    got = scraped(registry)
    assert set(got) == {k for k, v in expected.items() if v}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def test_a_run_view_follows_its_records_as_a_plain_reading_does() -> None:
    rng = random.Random(7)
    for i in range(200):
        records = random_run(rng, f"v{i}")
        view = RunView(f"v{i}")
        pending: set[str] = set()
        status, state, notes = "running", None, 0
        for r in records:
            view.apply(r)
            if isinstance(r, ev.ActionRequested):
                pending.add(r.data.action_id)
            elif isinstance(r, ev.ActionCompleted | ev.ActionFailed | ev.ActionCancelled):
                pending.discard(r.data.action_id)
            elif isinstance(r, ev.StateEntered):
                state, notes = r.data.state, 0
            elif isinstance(
                r, ev.GuardFailed | ev.EventReceived | ev.TimerScheduled | ev.TimerFired
            ):
                notes += state is not None
            elif isinstance(r, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
                status = type(r).__name__.removeprefix("Run").lower()
            assert set(view.pending) == pending
            assert view.status == status
            assert (view.visit.state if view.visit else None) == state
            assert len(view.visit.notes if view.visit else ()) == notes
        assert view.seq == len(records)


def test_a_finished_run_is_reported_once_and_forgotten() -> None:
    registry = CollectorRegistry()
    tracker, _ = orchestrator_telemetry(None, registry)
    records = random_run(random.Random(3), "f1")
    records = [r for r in records if not isinstance(r, FINISHING)]
    done = record(ev.RunCompleted, "f1", len(records) + 1, ev.RunCompletedData(state="a"), "x")
    tracker.relayed("f1", [*records, done])
    tracker.relayed("f1", [*records, done])
    assert isinstance(tracker, RunTracker)
    assert tracker.view("f1") is None
    completed = scraped(registry)
    assert sum(v for (name, _), v in completed.items() if name.startswith("interlock_runs_c")) == 1


# --- the run index ---------------------------------------------------------------------


def _position(record: Any) -> int:
    try:
        return int(record.id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def plain_index(current: dict[str, Any], records: list[Any]) -> tuple[dict[str, Any], bool]:
    """The run index entry's fold, one ``isinstance`` at a time."""
    current = dict(current)
    ordered = sorted((r for r in records if isinstance(r, runindex.INDEXED)), key=_position)
    changed = False
    for r in ordered:
        at = _position(r)
        if at <= int(current.get("seq", 0)):
            if isinstance(r, ev.RunStarted) and "workflow" not in current:
                current.update(
                    workflow=r.data.workflow,
                    namespace=r.data.namespace,
                    version=r.data.version,
                    status=current.get("status") or "running",
                    started_at=r.time,
                )
                changed = True
            continue
        if isinstance(r, ev.RunStarted):
            current.update(
                workflow=r.data.workflow,
                namespace=r.data.namespace,
                version=r.data.version,
                status="running",
                started_at=r.time,
            )
        elif isinstance(r, ev.StateEntered):
            current["state"] = r.data.state
        elif isinstance(r, ev.RunMigrated):
            current["migrated_from"] = r.data.from_version
            current["version"] = r.data.version
        elif isinstance(r, ev.RunCompleted):
            current["status"] = "completed"
        elif isinstance(r, ev.RunFailed):
            current["status"] = "failed"
            current["error"] = {"class": r.data.error.error_class, "message": r.data.error.message}
        elif isinstance(r, ev.RunCancelled):
            current["status"] = "cancelled"
        current["updated_at"] = r.time
        current["seq"] = at
        changed = True
    return current, changed


def test_the_run_index_entry_folds_as_a_plain_reading_does() -> None:
    rng = random.Random(11)
    for i in range(300):
        records = random_run(rng, f"x{i}")
        rng.shuffle(records)  # messages that come again, out of order
        if records and rng.random() < 0.2:
            records.append(records[0])  # the same record twice
        if records and rng.random() < 0.1:
            records[0] = records[0].__class__(
                **{f: getattr(records[0], f) for f in records[0].__struct_fields__ if f != "id"},
                id="no-position",
            )
        start: dict[str, Any] = {"run_id": f"x{i}"}
        if rng.random() < 0.4:  # an entry already written up to some position
            start = {"run_id": f"x{i}", "seq": rng.randrange(6), "status": "running"}
        expected, expected_changed = plain_index(start, records)
        current = dict(start)
        ordered = runindex._ordered(records)
        assert [r for _, r in ordered] == sorted(
            (r for r in records if isinstance(r, runindex.INDEXED)), key=_position
        )
        assert runindex._apply(current, ordered) == expected_changed
        assert current == expected


# --- the write-behind's and the observers' checks --------------------------------------


def test_what_is_written_at_the_next_flush_is_told_as_before() -> None:
    rng = random.Random(5)
    for i in range(500):
        records = random_run(rng, f"w{i}")
        if records:
            records = records[rng.randrange(len(records)) :]
        expected = any(isinstance(r, FINISHING) for r in records) or waits_outside(records)
        assert leaves(records) == expected


class _Counting(OrchestratorObserver):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def relayed(self, run_id: str, records: Any) -> None:
        self.calls.append("relayed")

    def conflict(self) -> None:
        self.calls.append("conflict")


class _Failing(_Counting):
    def relayed(self, run_id: str, records: Any) -> None:
        raise RuntimeError("broken")


def test_observers_are_called_for_the_hooks_they_override(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, failing, last = _Counting(), _Failing(), _Counting()
    late = OrchestratorObserver()
    told: list[str] = []
    late.appended = lambda run_id, records: told.append(run_id)  # type: ignore[method-assign]
    observers = Observers([first, failing])
    observers.add(last)
    observers.add(late)
    with caplog.at_level(logging.ERROR, logger="interlock.observe"):
        observers.relayed("r", [])
    assert "observer _Failing failed in relayed" in caplog.text
    observers.conflict()
    observers.appended("r1", [])
    observers.dispatched(record(ev.ActionRequested, "r", 1, None, "x"), {})
    observers.unrouted("t")
    assert first.calls == last.calls == ["relayed", "conflict"]
    assert failing.calls == ["conflict"]
    assert told == ["r1"]


# --- the run index, followed for the cluster gauges ------------------------------------


def test_the_run_index_is_followed_as_json_loads_reads_it() -> None:
    """The gauges' view of the run index reads each entry with msgspec: the same stays
    as with ``json.loads``, broken entries and deletions included."""
    import json

    rng = random.Random(13)
    entries: list[bytes | None] = [None, b"", b"{not json", b"{}", b'{"status": "running"}']
    for i in range(300):
        entry: dict[str, Any] = {"run_id": f"k{i % 7}", "workflow": rng.choice(WORKFLOWS)}
        if rng.random() < 0.8:
            entry["status"] = rng.choice(("running", "running", "completed", "failed"))
        if rng.random() < 0.8:
            entry["state"] = rng.choice((*STATES, ""))
        for stamp in ("updated_at", "started_at"):
            if rng.random() < 0.6:
                entry[stamp] = rng.choice((moment(rng), "not a time", ""))
        text = json.dumps(entry, ensure_ascii=rng.random() < 0.5)
        entries.append(text.encode() if rng.random() < 0.95 else text[:-3].encode())
    followed = ClusterMetrics(None, Subjects(), registry=None)
    stays: dict[str, tuple[str, str, float]] = {}
    for i, value in enumerate(entries):
        key = f"k{i % 7}"
        followed._index(key, value)
        try:
            current = json.loads(value or b"{}")
        except ValueError:
            current = {}
        if current.get("status") != "running" or not current.get("state"):
            stays.pop(key, None)
        else:
            since = str(current.get("updated_at") or current.get("started_at") or "")
            stays[key] = (str(current.get("workflow", "")), str(current["state"]), since)
        assert {k: (s.workflow, s.state, s.since) for k, s in followed._stays.items()} == {
            k: (w, st, epoch_seconds(t)) for k, (w, st, t) in stays.items()
        }
